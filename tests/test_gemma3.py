"""Gemma 3 and SmolLM3 from their configs (planner/models/gemma3.py): each layer's window and rotary, Gemma 3's four
norms a block, q/k norms and fp32 norms, counted by hand on tiny configs; what transformers' own modules keep
(under fake tensors, where transformers is installed) equal to the analytic count plus hf_kept's eager terms."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.errors import UserError
from planner.models import archconfig
from planner.profiler import analytic_kept, analytic_time, formulas, hf_kept
from planner.profiler.formulas import Shape

# hidden 64, 4 heads of 32 (head_dim its own: 64 / 4 would be 16), 2 K/V heads, MLP 128, every 2nd layer global
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256,
          "max_position_embeddings": 512, "sliding_window": 64, "sliding_window_pattern": 2, "pad_token_id": 0,
          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}
# hidden 64, 4 heads of 16, 2 K/V heads, MLP 128, every 2nd layer without rotary
SMOLLM3 = {"model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "pad_token_id": None,
           "max_position_embeddings": 512, "no_rope_layer_interval": 2, "rms_norm_eps": 1e-6}
T = 64


def _arch(config: dict):
    return archconfig.from_hf_config(config, where="config.json", name="tiny")


def test_gemma3_layers_windows_and_norms_as_its_config_says():
    arch = _arch(GEMMA3)
    assert arch.layer_windows == (64, None) and arch.post_norms and arch.qk_norm and arch.scaled_embedding
    assert arch.tie_word_embeddings and arch.head_size == 32
    # layer_types, where given, over the pattern
    given = _arch({**GEMMA3, "layer_types": ["full_attention", "sliding_attention"]})
    assert given.layer_windows == (None, 64)
    # Gemma 3's published pattern: every 6th layer global
    assert _arch({**GEMMA3, "num_hidden_layers": 12, "sliding_window_pattern": 6}).layer_windows == \
        (64,) * 5 + (None,) + (64,) * 5 + (None,)


def test_gemma3_block_parameters_by_hand():
    # q and o 64 x 128, k and v 64 x 64, MLP 3 x 64 x 128, four norms of 64, q and k norms of 32
    arch, shape = _arch(GEMMA3), Shape(seq_len=T, micro_batch_size=1)
    assert formulas.block_params(arch, shape) == 2 * 64 * 128 + 2 * 64 * 64 + 3 * 64 * 128 + 4 * 64 + 2 * 32 == 49_472


def test_gemma3_block_kept_by_hand():
    """At 64 tokens, 2 B an element: each of the four norms keeps its input and 1/rms (fp32 a token), the q and k
    norms theirs (1/rms per head and token), Q, K, V, flash's logsumexp, the output, the MLP's input and GeGLU's
    four; transformers' eager Gemma3RMSNorm keeps 6 B an element more (fp32 copy and fp32 normalised output, not
    the bf16 input) and its 1 + weight in fp32, and rotary its cos and sin."""
    h, q, kv, f, hd = 64, 128, 64, 128, 32
    analytic = (4 * (2 * T * h + 4 * T) + 2 * T * h  # four norms; the QKV input
                + 2 * T * (q + kv) + 4 * T * (4 + 2)  # q and k norms' inputs and statistics
                + 2 * T * q + 2 * 2 * T * kv + 4 * T * 4 + 2 * T * q  # Q, K, V, logsumexp, output
                + 2 * T * h + 4 * 2 * T * f)  # MLP input, GeGLU
    extra = 4 * (6 * T * h + 4 * h) + (6 * T * q + 4 * hd) + (6 * T * kv + 4 * hd) + 2 * 2 * T * hd
    assert analytic == 192_000 and extra == 181_504
    arch, shape = _arch(GEMMA3), Shape(seq_len=T, micro_batch_size=1)
    for layer in (0, 1):  # within the window (64 tokens) the local layer keeps what the global one does
        assert sum(t.num_bytes for t in analytic_kept.block_terms(arch.layer(layer), shape, moe=False)) == analytic
        assert sum(t.num_bytes for t in hf_kept.extra_terms(arch.layer(layer), shape)) == extra


def test_gemma3_sliding_layer_attention_flops_by_hand():
    """At 256 tokens the local layer's QK^T and scores·V run over a 64-token window: 4·T·w·(a·hd), not 4·T·s·(a·hd)."""
    arch, shape = _arch(GEMMA3), Shape(seq_len=256, micro_batch_size=1)
    projections = 2 * 256 * 64 * (2 * 128 + 2 * 64)
    assert formulas.attention_flops(arch.layer(0), shape) == projections + 4 * 256 * 64 * 128
    assert formulas.attention_flops(arch.layer(1), shape) == projections + 4 * 256 * 256 * 128


def test_gemma3_checkpoint_reruns_the_down_projection():
    """The post-MLP norm keeps the down projection's output, so torch's checkpoint reruns the whole block's matmuls
    (a LLaMA block stops before the down projection)."""
    arch, shape = _arch(GEMMA3), Shape(seq_len=T, micro_batch_size=1)
    assert formulas.block_recompute_flops(arch, shape) == formulas.block_flops(arch, shape)
    llama = _arch({**SMOLLM3})
    assert formulas.block_recompute_flops(llama, shape) == formulas.block_flops(llama, shape) - 2 * T * 128 * 64


def test_smollm3_nope_layers_by_hand():
    arch, shape = _arch(SMOLLM3), Shape(seq_len=T, micro_batch_size=1)
    assert arch.layer_rotary == (True, False) and arch.layer(0).rotates and not arch.layer(1).rotates
    assert arch.tie_word_embeddings  # SmolLM3Config's default, as its published config
    h, q, kv, f = 64, 64, 32, 128
    analytic = (2 * (2 * T * h + 4 * T) + 2 * T * h + 2 * T * q + 2 * 2 * T * kv + 4 * T * 4 + 2 * T * q
                + 2 * T * h + 4 * 2 * T * f)
    assert analytic == 124_416
    for layer, tables in ((0, 2 * 2 * T * 16), (1, 0)):  # the NoPE layer keeps no rotary tables
        assert sum(t.num_bytes for t in analytic_kept.block_terms(arch.layer(layer), shape, moe=False)) == analytic
        assert sum(t.num_bytes for t in hf_kept.extra_terms(arch.layer(layer), shape)) == 2 * 4 * T * h + tables
    # nor moves rotary's bytes: the tables' and the rotated Q and K's
    rope, nope = (dict(analytic_time.block_work(arch.layer(i), shape)[0].classed).get("attention", 0) for i in (0, 1))
    assert rope - nope == analytic_time.ROTARY_FWD * T * (q + kv) + T * 16 * analytic_time.ROTARY_TABLE
    assert formulas.block_params(arch, shape) == 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64


@pytest.mark.parametrize("config, message", [
    ({**GEMMA3, "sliding_window_pattern": None}, "has neither layer_types nor a positive sliding_window_pattern"),
    ({**GEMMA3, "layer_types": ["sliding_attention"]}, "layer_types must list 2 entries"),
    ({**GEMMA3, "sliding_window": None}, "has no sliding_window"),
    ({**GEMMA3, "head_dim": None}, "has no head_dim; a gemma3_text config needs it"),
    ({**GEMMA3, "use_bidirectional_attention": True}, "use_bidirectional_attention is true"),
    ({**GEMMA3, "final_logit_softcapping": 30.0}, "logit soft-capping is not modelled"),
    ({**SMOLLM3, "no_rope_layer_interval": None}, "has neither no_rope_layers nor a positive no_rope_layer_interval"),
    ({**SMOLLM3, "no_rope_layers": [1, 2]}, "no_rope_layers must list 2 entries, each 1 (rotary) or 0"),
    ({"model_type": "gemma3", "vision_config": {}}, "holds its text model in text_config, and this one has none"),
])
def test_configs_it_cannot_read_are_refused_in_one_sentence(config, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _arch(config)


def test_multimodal_gemma3_plans_its_text_model_and_says_the_vision_tower_is_left_out(tmp_path):
    text = {key: value for key, value in GEMMA3.items() if key != "model_type"}
    config = {"model_type": "gemma3", "text_config": {**text, "model_type": "gemma3_text"},
              "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}, "mm_tokens_per_image": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_ok("profile", "--arch-config", path, "--seq-len", T, "--out", tmp_path / "p.json")
    assert "vision tower (vision_config) and its projector are left out" in " ".join(result.output.split())
    profile = io.load_profile(tmp_path / "p.json")
    assert "vision tower" in profile.assumptions["left_out"]
    text_only = tmp_path / "text.json"
    text_only.write_text(json.dumps(GEMMA3))
    run_ok("profile", "--arch-config", text_only, "--seq-len", T, "--out", tmp_path / "t.json")
    assert [layer.act_bytes for layer in io.load_profile(tmp_path / "t.json").layers] == \
        [layer.act_bytes for layer in profile.layers]
    # the text model of a config without a vision tower is planned without a word
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**config, "vision_config": None}))
    assert "left out" not in run_ok("profile", "--arch-config", bare, "--seq-len", T, "--out", tmp_path / "b.json").output


def test_published_configs_parameters_by_hand():
    """configs/hf's Gemma-3-12B and SmolLM3-3B: each layer's weights by hand, the tied table once."""
    from pathlib import Path

    from planner.profiler.analytic import total_params

    root = Path(__file__).resolve().parents[1] / "configs/hf"
    gemma = _arch(json.loads((root / "gemma-3-12b.json").read_text()))
    layer = 3 * 3840 * 4096 + 3840 * 2048 * 2 - 3840 * 4096 + 3 * 3840 * 15360 + 4 * 3840 + 2 * 256
    assert total_params(gemma) == 48 * layer + 262_208 * 3840 + 3840 == 11_766_034_176
    assert gemma.layer_windows.count(None) == 8 and gemma.layer_windows[5] is None and gemma.layer_windows[0] == 1024
    smol = _arch(json.loads((root / "smollm3-3b.json").read_text()))
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 11008 + 2 * 2048
    assert total_params(smol) == 36 * layer + 128_256 * 2048 + 2048 == 3_075_098_624
    assert smol.layer_rotary.count(False) == 9 and not smol.layer_rotary[3]


@pytest.mark.parametrize("config, layer", [(GEMMA3, 0), (GEMMA3, 1), (SMOLLM3, 0), (SMOLLM3, 1)])
def test_transformers_modules_keep_the_analytic_count_plus_the_eager_terms(config, layer):
    """transformers' own Gemma3DecoderLayer and SmolLM3DecoderLayer (random weights, fake tensors): every saved
    tensor's bytes, summed, equal the analytic count and hf_kept's terms, to the byte."""
    pytest.importorskip("transformers")
    from fixtures.scripts import load_script

    arch, shape = _arch(config), Shape(seq_len=T, micro_batch_size=1)
    rows, _ = load_script("fake_saved_tensors").saved_tensors(config, seq_len=T, layer=layer, gpu="h100")
    expected = (sum(t.num_bytes for t in analytic_kept.block_terms(arch.layer(layer), shape, moe=False))
                + sum(t.num_bytes for t in hf_kept.extra_terms(arch.layer(layer), shape)))
    assert sum(row["bytes"] for row in rows) == expected


def test_hf_route_refuses_a_sequence_past_the_window_it_does_not_apply(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3))
    result = run("profile", "--hf-config", path, "--fake", "--seq-len", 128, "--out", tmp_path / "p.json")
    told = " ".join(result.output.split())
    assert result.exit_code == 1 and "exceeds the config's sliding_window 64" in told
    # why, by the code: the adapter's layers run causal with no mask, transformers' own a masked kernel over every
    # block (masking_utils.sdpa_mask, framework-facts §504); and the route that plans the window
    assert "neither gives a window's cost" in told and "`ckplan profile --arch-config CONFIG --seq-len 128`" in told
    assert "Traceback" not in told and not (tmp_path / "p.json").exists()
    # Phi-3-mini's window (microsoft/Phi-3-mini-4k-instruct: sliding_window 2047), a family --arch-config does not read
    phi3 = {"model_type": "phi3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 256,
            "sliding_window": 64, "pad_token_id": 0}
    path.write_text(json.dumps(phi3))
    told = " ".join(run("profile", "--hf-config", path, "--fake", "--seq-len", 128, "--out", tmp_path / "p.json",
                        "--dtype", "bf16").output.split())
    assert "ckplan reads no phi3 config otherwise" in told and "give --seq-len 64 or less" in told


def _plan(tmp_path, config: dict, stages: int):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "rope_theta": 10000.0}))
    run_ok("profile", "--arch-config", path, "--seq-len", T, "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", stages, "--mem", "80GB", "--precision", "bf16-mixed",
           "--out", tmp_path / "plan.yaml")
    return tmp_path / "plan.yaml"


def test_megatron_export_skips_rotary_on_smollm3s_nope_layers(tmp_path):
    """Megatron-LM's --no-rope-freq N skips RoPE on every N-th layer (framework-facts §424): SmolLM3's every 4th."""
    plan = _plan(tmp_path, {**SMOLLM3, "num_hidden_layers": 8, "no_rope_layer_interval": 4}, 2)
    run_ok("export", plan, "--to", "megatron", "--out", tmp_path / "plan.sh")
    assert "--no-rope-freq 4\n" in (tmp_path / "plan.sh").read_text()


def test_megatron_export_lists_an_irregular_nope_pattern():
    from planner.emit import facts, layer_kinds

    model = facts.ModelFacts.model_validate({**json.loads(_arch(SMOLLM3).canonical_json()),
                                             "num_layers": 3, "layer_rotary": [False, True, True]})
    assert layer_kinds.megatron_arguments(model) == ["--no-rope-freq '[1,0,0]'"]


@pytest.mark.parametrize("to, config, said", [
    ("megatron", GEMMA3, "Megatron-LM's arguments cannot build this model: its TransformerLayer has no norm on the "
                         "attention's and the MLP's outputs"),
    ("torchtitan", GEMMA3, "torchtitan cannot train this model: none of its models (b5bcd76c's torchtitan/models) has "
                           "a norm on the attention's and the MLP's outputs"),
    ("torchtitan", SMOLLM3, "has layers without rotary (SmolLM3's NoPE layers"),
])
@pytest.mark.parametrize("stages", [1, 2])  # at 2 stages before the tied table's refusal: what it lacks comes first
def test_exports_a_framework_cannot_build_are_refused_in_one_sentence(tmp_path, to, config, said, stages):
    plan = _plan(tmp_path, config, stages)
    result = run("export", plan, "--to", to, "--torchtitan-base", "torchtitan.models.llama3.config_registry:llama3_8b",
                 "--out", tmp_path / "out") if to == "torchtitan" else run("export", plan, "--to", to, "--out",
                                                                             tmp_path / "out")
    assert result.exit_code == 1 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()


def test_hf_route_names_the_route_that_reads_a_multimodal_gemma3_config():
    """`profile --hf-config` builds causal LMs from transformers' own code; Gemma 3's multimodal model is not one, and
    the sentence says --arch-config plans its text model."""
    from planner.models import hfmodels

    with pytest.raises(UserError, match=r"model_type 'gemma3' is not one ckplan builds .*`ckplan profile --arch-config"):
        hfmodels.check_fields({"model_type": "gemma3", "text_config": {}})
