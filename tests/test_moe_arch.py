"""Mixture-of-experts and multi-head-latent-attention architectures in the analytic profiler:
the published parameter counts, the formulas by hand on tiny configs, Hugging Face configs read
(and refused) in one sentence, and the parameters of the models transformers builds."""

import json
import pathlib

import pytest
from click.testing import CliRunner

from planner import io
from planner.cli import cli
from planner.errors import UserError
from planner.models import archconfig, archs
from planner.profiler import analytic, analytic_time, roofline
from planner.profiler.analytic import Shape
from planner.schema import FileRef

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
ONE = Shape(seq_len=1, micro_batch_size=1)

# h 64, 4 heads of 16, 2 K/V heads; layer 0 dense (f 160), layers 1-2 MoE: 4 experts of width 32,
# top 2, one shared expert of width 48
TINY_MOE = archs.Arch(name="tiny-moe", hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1,
                      shared_intermediate_size=48, dense_layers=(0,))
# latent attention: q latent 24, K/V latent 16, per head 16 nope + 8 rope for q and k, v 16; dense MLP
TINY_MLA = archs.Arch(name="tiny-mla", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                      num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32,
                      kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)


def _kept(arch, shape, **moe):
    return sum(term.num_bytes for term in analytic.block_terms(arch, shape, **moe))


def _run(*args):
    result = CliRunner().invoke(cli, list(args))
    return result, result.output


# ---------------------------------------------------------------- published parameter counts

# (total, active, the active figure's last published digit, how its publisher counts active parameters)
PUBLISHED = {
    # Jiang et al. 2024, "Mixtral of Experts": 46.7B total, 12.9B active (embedding counted)
    "mixtral-8x7b": (46.7e9, 12.9e9, 0.1e9, True),
    # mistral.ai's Mixtral 8x22B announcement (2024): 141B total, 39B active
    "mixtral-8x22b": (141e9, 39e9, 1e9, True),
    # DeepSeek-V2 paper, Appendix B: 15.7B total, 2.4B activated (DeepSeek leaves the token embedding out)
    "deepseek-v2-lite": (15.7e9, 2.4e9, 0.1e9, False),
    # DeepSeek-V3 Technical Report §2: 671B total, 37B activated, the MTP module not included
    "deepseek-v3": (671e9, 37e9, 1e9, False),
    # Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    "qwen3-30b-a3b": (30.5e9, 3.3e9, 0.1e9, True),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_moe_builtins_have_their_published_parameter_counts(name):
    """Totals within 1%. Active counts are published to two significant figures, coarser than 1%
    for three of them (DeepSeek-V2-Lite 2.45B, DeepSeek-V3 36.6B and Qwen3-30B-A3B 3.35B are 2.1%,
    1.0% and 1.6% from 2.4B, 37B and 3.3B): they are held to the published digits, the others to
    1% as well."""
    total, active, digit, with_embedding = PUBLISHED[name]
    arch = archs.ARCHS[name]
    assert analytic.total_params(arch) == pytest.approx(total, rel=0.01)
    counted = analytic.active_params(arch, input_embedding=with_embedding)
    assert abs(counted - active) < digit
    if name.startswith("mixtral"):
        assert counted == pytest.approx(active, rel=0.01)


def test_exact_counts_of_the_checkpoints():
    # Mixtral-8x7B-v0.1 and Qwen3-30B-A3B's safetensors hold 46,702,792,704 and 30,532,122,624
    # parameters: 32 x (attention 41,943,040 + router 32,768 + 8 x 176,160,768 + norms 8,192) +
    # 2 x 32000 x 4096 + 4096; 48 x (18,874,368 + q/k norms 256 + 262,144 + 128 x 4,718,592 + 4,096)
    # + 2 x 151936 x 2048 + 2048
    assert analytic.total_params(archs.arch("mixtral-8x7b")) == \
        32 * (41_943_040 + 32_768 + 8 * 176_160_768 + 8_192) + 2 * 32000 * 4096 + 4096 == 46_702_792_704
    assert analytic.total_params(archs.arch("qwen3-30b-a3b")) == \
        48 * (18_874_368 + 256 + 262_144 + 128 * 4_718_592 + 4_096) + 2 * 151936 * 2048 + 2048 == 30_532_122_624
    # active: top 2 of 8 experts
    assert analytic.active_params(archs.arch("mixtral-8x7b")) == 46_702_792_704 - 32 * 6 * 176_160_768


def test_deepseek_v2_lite_config_json_reads_as_the_builtin():
    """The model's own config.json (deepseek-ai/DeepSeek-V2-Lite, remote-code era: moe_layer_freq,
    scoring_func, rope_scaling, auto_map), through --arch-config's reader."""
    path = FIXTURES / "deepseek-v2-lite" / "config.json"
    arch = archconfig.from_hf_config(json.loads(path.read_text()), where=str(path), name="deepseek-v2-lite")
    builtin = archs.arch("deepseek-v2-lite")
    assert arch.canonical_json() == builtin.canonical_json()
    assert round(analytic.total_params(arch) / 1e8) == 157  # 15.7B
    assert round(analytic.active_params(arch, input_embedding=False) / 1e8) in (24, 25)  # 2.45B; published 2.4B
    assert arch.dense_layers == (0,) and arch.q_lora_rank == 0 and arch.mla


def test_dense_builtins_pin_the_same_dimensions_as_before():
    """Fields added for MoE and MLA are left out of a dense model's canonical JSON (profiles are
    pinned to its hash)."""
    added = {"qk_norm", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts",
             "shared_intermediate_size", "shared_expert_gate", "dense_layers", "num_mtp_layers", "kv_lora_rank",
             "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"}
    assert added <= set(archs._LATER_FIELDS)
    for arch in archs.ARCHS.values():
        pinned = set(json.loads(arch.canonical_json()))
        assert bool(pinned & added) == (arch.num_experts > 0 or arch.qk_norm), arch.name


# ---------------------------------------------------------------- the models transformers builds

BUILDS = [  # published dimensions, a few layers deep (enough for dense and MoE layers both)
    ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2)),
    ("qwen2_moe", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                       num_key_value_heads=16, vocab_size=151936, num_experts=60, num_experts_per_tok=4,
                       moe_intermediate_size=1408, shared_expert_intermediate_size=5632, decoder_sparse_step=2,
                       mlp_only_layers=[3])),  # Qwen1.5-MoE-A2.7B's widths; layers 1 only MoE
    ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=2, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, vocab_size=151936, num_experts=128,
                       num_experts_per_tok=8, moe_intermediate_size=768)),
    ("deepseek_v2", dict(hidden_size=2048, intermediate_size=10944, num_hidden_layers=3, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=102400, n_routed_experts=64, num_experts_per_tok=6,
                         moe_intermediate_size=1408, n_shared_experts=2, first_k_dense_replace=1, kv_lora_rank=512,
                         q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128)),
    ("deepseek_v3", dict(hidden_size=7168, intermediate_size=18432, num_hidden_layers=4, num_attention_heads=128,
                         num_key_value_heads=128, vocab_size=129280, n_routed_experts=256, num_experts_per_tok=8,
                         moe_intermediate_size=2048, n_shared_experts=1, first_k_dense_replace=3, kv_lora_rank=512,
                         q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_group=8,
                         topk_group=4)),
    ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=2, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=151936)),  # Qwen3-8B's widths
]


@pytest.mark.parametrize("model_type, fields", BUILDS, ids=[b[0] for b in BUILDS])
def test_arch_config_counts_the_parameters_transformers_builds_layer_by_layer(model_type, fields):
    """The whole config transformers writes (its defaults and its own names: Qwen3-MoE's
    num_local_experts, DeepSeek's head_dim = qk_rope_head_dim), read by --arch-config; the model
    built on the meta device, no weights; every decoder layer's parameters, dense or MoE."""
    import torch

    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    arch = archconfig.from_hf_config(json.loads(config.to_json_string()), where="config.json", name=model_type)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert analytic.total_params(arch) == sum(p.numel() for p in model.parameters())
    for index, layer in enumerate(model.model.layers):
        built = sum(p.numel() for p in layer.parameters())
        assert analytic.block_params(arch, ONE, moe=arch.is_moe_layer(index)) == built, index
    moe_layers = [i for i in range(arch.num_layers) if arch.is_moe_layer(i)]
    assert moe_layers == {"qwen2_moe": [1], "deepseek_v2": [1, 2], "deepseek_v3": [3],
                          "qwen3": []}.get(model_type, [0, 1])


# ---------------------------------------------------------------- formulas by hand

def test_moe_block_bytes_by_hand():
    # s=32, b=2 (T=64 tokens), bf16; C = 1.0 x 64 x 2 / 4 = 32 tokens per expert, 128 routed slots
    shape = Shape(seq_len=32, micro_batch_size=2)
    assert analytic.expert_tokens(TINY_MOE, shape) == 32
    norms = 2 * (64 * 64 * 2 + 64 * 4)  # two RMSNorms: input (bf16) + 1/rms per token (fp32)
    attention = 64 * 64 * 2 + 64 * 64 * 2 + 2 * 64 * 32 * 2 + 4 * 4 * 32 * 2 + 64 * 64 * 2  # input, Q, K, V, lse, O
    mlp_input = 64 * 64 * 2
    router = 4 * 64 * 4 + 8 * 64 * 2 + 4 * 64 * 2  # fp32 probabilities, int64 top-2 indices, fp32 top-2 weights
    dispatch = 128 * 64 * 2 + 8 * 128  # the gathered tokens, an int64 index per slot
    experts = 4 * 128 * 32 * 2 + 128 * 64 * 2  # SwiGLU's four tensors over 128 slots of width 32, the outputs
    shared = 4 * 64 * 48 * 2
    moe = norms + attention + mlp_input + router + dispatch + experts + shared
    assert _kept(TINY_MOE, shape, moe=True) == _kept(TINY_MOE, shape) == moe
    dense = norms + attention + mlp_input + 4 * 64 * 160 * 2
    assert _kept(TINY_MOE, shape, moe=False) == dense
    # capacity factor 2: 64 tokens per expert, 256 slots: the dispatch and the experts double
    doubled = Shape(seq_len=32, micro_batch_size=2, capacity_factor=2.0)
    assert analytic.expert_tokens(TINY_MOE, doubled) == 64
    assert _kept(TINY_MOE, doubled) == moe + dispatch + experts
    # TP 2: expert and shared widths halve, Q/K/V/O and lse halve; router, norms, dispatch, outputs stay
    tp = Shape(seq_len=32, micro_batch_size=2, tp=2)
    halved = 64 * 64 * 2 // 2 + 2 * 64 * 32 * 2 // 2 + 4 * 4 * 32 * 2 // 2 + 64 * 64 * 2 // 2 + \
        4 * 128 * 32 * 2 // 2 + 4 * 64 * 48 * 2 // 2
    assert _kept(TINY_MOE, tp) == moe - halved


def test_moe_flops_params_and_recompute_by_hand():
    shape = Shape(seq_len=32, micro_batch_size=2)
    attention = 2 * 64 * 64 * (2 * 64 + 2 * 32) + 4 * 64 * 32 * 64  # as a LLaMA block's
    router = 2 * 64 * 64 * 4
    routed = 2 * 128 * 64 * 3 * 32  # top-2 copies of 64 tokens, not 4 experts x 64 tokens
    shared = 2 * 64 * 64 * 3 * 48
    assert analytic.block_flops(TINY_MOE, shape) == attention + router + routed + shared
    assert analytic.block_flops(TINY_MOE, shape, moe=False) == attention + 2 * 64 * 64 * 3 * 160
    # torch's checkpoint reruns the routed experts (their outputs are kept) and stops before the
    # shared experts' down projection, whose output only the residual sum takes
    assert analytic.block_recompute_flops(TINY_MOE, shape) == attention + router + routed + shared - 2 * 64 * 48 * 64
    no_shared = archs.Arch(**{**TINY_MOE.__dict__, "num_shared_experts": 0, "shared_intermediate_size": 0})
    assert analytic.block_recompute_flops(no_shared, shape) == analytic.block_flops(no_shared, shape)
    gated = archs.Arch(**{**TINY_MOE.__dict__, "shared_expert_gate": True})
    assert analytic.block_recompute_flops(gated, shape) == analytic.block_flops(gated, shape)
    assert analytic.block_flops(gated, shape) == attention + router + routed + shared + 2 * 64 * 64
    assert _kept(gated, shape) == _kept(TINY_MOE, shape) + 64 * 2 + 64 * 64 * 2  # sigmoid out, shared out
    # parameters: attention, router 64 x 4, 4 experts of 3 x 64 x 32, shared 3 x 64 x 48, two norms
    attention_params = 2 * 64 * 64 + 2 * 64 * 32
    moe_params = attention_params + 64 * 4 + 4 * 3 * 64 * 32 + 3 * 64 * 48 + 2 * 64
    assert analytic.block_params(TINY_MOE, ONE) == moe_params
    assert analytic.block_params(TINY_MOE, Shape(seq_len=1, micro_batch_size=1, tp=2)) == \
        attention_params // 2 + 64 * 4 + 4 * 3 * 64 * 16 + 3 * 64 * 24 + 2 * 64  # router and norms replicated
    dense_params = attention_params + 3 * 64 * 160 + 2 * 64
    embedding_and_head = 2 * 128 * 64 + 64
    assert analytic.total_params(TINY_MOE) == dense_params + 2 * moe_params + embedding_and_head
    assert analytic.active_params(TINY_MOE) == analytic.total_params(TINY_MOE) - 2 * 2 * 3 * 64 * 32
    assert analytic.active_params(TINY_MOE, input_embedding=False) == analytic.active_params(TINY_MOE) - 128 * 64


def test_mla_bytes_flops_and_params_by_hand():
    shape = Shape(seq_len=32, micro_batch_size=2)  # T = 64, bf16
    norms = 2 * (64 * 64 * 2 + 64 * 4)
    down_input = 64 * 64 * 2
    q_latent = 64 * 24 * 2 + 64 * 4 + 64 * 24 * 2  # norm input, 1/rms, norm output (q up-projection input)
    kv_latent = 64 * 16 * 2 + 64 * 4 + 64 * 16 * 2
    q = k = 64 * 4 * (16 + 8) * 2  # every head's nope and rope parts
    v = out = 64 * 4 * 16 * 2
    lse = 4 * 4 * 32 * 2
    mlp = 64 * 64 * 2 + 4 * 64 * 160 * 2
    assert _kept(TINY_MLA, shape) == norms + down_input + q_latent + kv_latent + q + k + v + lse + out + mlp
    no_q_latent = archs.Arch(**{**TINY_MLA.__dict__, "q_lora_rank": 0})  # DeepSeek-V2-Lite's kind
    assert _kept(no_q_latent, shape) == _kept(TINY_MLA, shape) - q_latent
    eager = Shape(seq_len=32, micro_batch_size=2, attention="eager")
    assert _kept(TINY_MLA, eager) == _kept(TINY_MLA, shape) - lse + 4 * 32 * 32 * 2 * 2
    down = 2 * 64 * 64 * (24 + 16 + 8)  # h -> q latent, h -> K/V latent + the rope part of k
    up = 2 * 64 * 24 * 4 * 24 + 2 * 64 * 16 * 4 * (16 + 16) + 2 * 64 * 4 * 16 * 64  # q up, K/V up, output
    scores = 2 * 64 * 32 * 4 * (16 + 8) + 2 * 64 * 32 * 4 * 16  # QK^T over nope + rope, scores x V
    assert analytic.block_flops(TINY_MLA, shape) == down + up + scores + 2 * 64 * 64 * 3 * 160
    assert analytic.block_flops(no_q_latent, shape) == \
        analytic.block_flops(TINY_MLA, shape) - 2 * 64 * 64 * 24 - 2 * 64 * 24 * 4 * 24 + 2 * 64 * 64 * 4 * 24
    params = (64 * 24 + 24 + 24 * 4 * 24) + (64 * (16 + 8) + 16 + 16 * 4 * 32) + 4 * 16 * 64 + 3 * 64 * 160 + 2 * 64
    assert analytic.block_params(TINY_MLA, ONE) == params
    # TP 2: the down projections and latent norms replicated, up and output projections halved
    assert analytic.block_params(TINY_MLA, Shape(seq_len=1, micro_batch_size=1, tp=2)) == \
        (64 * 24 + 24 + 24 * 2 * 24) + (64 * 24 + 16 + 16 * 2 * 32) + 2 * 16 * 64 + 3 * 64 * 80 + 2 * 64


def test_profile_rows_and_assumptions_of_a_moe_model():
    shape = Shape(seq_len=32, micro_batch_size=2, capacity_factor=1.5)
    profile = analytic.analytic_profile(TINY_MOE, shape, gpu=H100, model=REF)
    assert [layer.kind for layer in profile.layers] == ["embedding", "decoder_block", "moe_block", "moe_block",
                                                       "norm+lm_head"]
    dense, moe = profile.layers[1], profile.layers[2]
    assert dense.param_count == analytic.block_params(TINY_MOE, ONE, moe=False)
    assert moe.param_count == analytic.block_params(TINY_MOE, ONE, moe=True)
    assert moe.act_bytes == _kept(TINY_MOE, shape, moe=True)
    # the roofline of what torch's checkpoint reruns (was: its FLOPs at a fixed MFU of 0.4)
    rerun = analytic_time.block_work(TINY_MOE, shape, moe=True)[2]
    assert rerun.flops == analytic.block_recompute_flops(TINY_MOE, shape)
    assert moe.recompute_ms == pytest.approx(roofline.roofline_ms(rerun, H100))
    facts = profile.assumptions
    assert facts["capacity_factor"] == 1.5 and facts["expert_tokens"] == 48  # 1.5 x 64 x 2 / 4
    assert "worst case" in facts["load_balance"] and "no expert parallelism" in facts["moe_parallelism"]
    assert profile.name.endswith("-cf1.5")


@pytest.mark.parametrize("shape, message", [
    (Shape(seq_len=32, micro_batch_size=1, capacity_factor=2.5), "--capacity-factor 2.5 is outside (0, 2]"),
    (Shape(seq_len=32, micro_batch_size=1, tp=3), "--tp 3 does not divide"),
])
def test_capacity_past_the_worst_case_and_tp_that_splits_no_expert_are_refused(shape, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace("]", r"\]")):
        analytic.analytic_profile(TINY_MOE, shape, gpu=H100, model=REF)


# ---------------------------------------------------------------- config.json read and refused

MIXTRAL = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8,
           "num_experts_per_tok": 2, "router_jitter_noise": 0.0, "output_router_logits": False,
           "router_aux_loss_coef": 0.02, "sliding_window": None}  # mistralai/Mixtral-8x7B-v0.1's fields
DEEPSEEK = json.loads((FIXTURES / "deepseek-v2-lite" / "config.json").read_text())
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
             "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
             "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
             "mlp_only_layers": [], "norm_topk_prob": True}  # Qwen/Qwen3-30B-A3B's fields


def test_published_configs_read_as_the_builtins():
    for config, name in [(MIXTRAL, "mixtral-8x7b"), (QWEN3_MOE, "qwen3-30b-a3b")]:
        arch = archconfig.from_hf_config(config, where="config.json", name=name)
        assert analytic.total_params(arch) == analytic.total_params(archs.arch(name))
        assert analytic.active_params(arch) == analytic.active_params(archs.arch(name))


@pytest.mark.parametrize("base, change, message", [
    # expert and latent fields under a model_type that is not read with them: never read as dense
    ({**MIXTRAL, "model_type": "mistral"}, {}, "num_local_experts = 8 is a mixture-of-experts or latent-attention "
                                               "setting that is not read for model_type 'mistral'"),
    (MIXTRAL, {"moe_intermediate_size": 1408}, "moe_intermediate_size = 1408 is a mixture-of-experts"),
    ({**DEEPSEEK, "model_type": "llama"}, {}, "not read for model_type 'llama'"),
    ({**QWEN3_MOE, "model_type": "qwen3"}, {}, "num_experts = 128 is a mixture-of-experts"),
    # settings that change memory and are not modelled
    (MIXTRAL, {"router_jitter_noise": 0.01}, "router_jitter_noise = 0.01 multiplies the router's input by noise"),
    (DEEPSEEK, {"attention_bias": True}, "latent attention is read without biases"),
    # missing or inconsistent fields
    (DEEPSEEK, {"kv_lora_rank": None}, "has no kv_lora_rank"),
    (DEEPSEEK, {"num_experts_per_tok": 65}, "num_experts_per_tok 65 exceeds the 64 experts"),
    (QWEN3_MOE, {"mlp_only_layers": [48]}, "mlp_only_layers must be a list of layer indices from 0 to 47"),
    (QWEN3_MOE, {"num_local_experts": 64}, "num_experts = 128 and num_local_experts = 64 disagree"),
    (QWEN3_MOE, {"moe_intermediate_size": None}, "has no moe_intermediate_size"),
    (DEEPSEEK, {"first_k_dense_replace": -1}, "first_k_dense_replace must be a whole number of 0 or more"),
])
def test_moe_configs_with_unread_or_unmodelled_fields_are_refused_in_one_sentence(tmp_path, base, change, message):
    config = {key: value for key, value in {**base, **change}.items() if value is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result, out = _run("profile", "--arch-config", str(path), "--seq-len", "128", "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and message in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_deepseek_v3_config_records_its_mtp_module_and_plans_the_main_model(tmp_path):
    config = tmp_path / "deepseek-v3" / "config.json"
    config.parent.mkdir()
    # deepseek-ai/DeepSeek-V3's config.json, the fields that set shapes and routing
    config.write_text(json.dumps({
        "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 1, "max_position_embeddings": 163840, "tie_word_embeddings": False}))
    out_path = tmp_path / "p.json"
    result, out = _run("profile", "--arch-config", str(config), "--seq-len", "4096", "--micro-batch-size", "1",
                       "--tp", "8", "--out", str(out_path))
    assert result.exit_code == 0, out
    assert "multi-token-prediction module(s) are not planned" in out
    assert "671,026,404,352 parameters" in out
    profile = io.load_profile(out_path)
    assert "not planned" in profile.assumptions["mtp"]
    kinds = [layer.kind for layer in profile.layers[1:-1]]
    assert kinds == ["decoder_block"] * 3 + ["moe_block"] * 58
    arch = archs.arch("deepseek-v3")
    assert profile.layers[4].param_count == analytic.block_params(arch, Shape(seq_len=1, micro_batch_size=1, tp=8))


# ---------------------------------------------------------------- the command line

def test_profile_arch_mixtral_writes_moe_rows(tmp_path):
    out_path = tmp_path / "p.json"
    result, out = _run("profile", "--arch", "mixtral-8x7b", "--seq-len", "4096", "--micro-batch-size", "1",
                       "--out", str(out_path))
    assert result.exit_code == 0, out
    assert "46,702,792,704 parameters, 12,879,925,248 active per token" in out and "moe_block" in out
    profile = io.load_profile(out_path)
    blocks = profile.layers[1:-1]
    # attention 41,943,040 + router 4096 x 8 + 8 experts x 3 x 4096 x 14336 + two norms
    assert {layer.param_count for layer in blocks} == {41_943_040 + 32_768 + 8 * 176_160_768 + 8_192}
    assert {layer.kind for layer in blocks} == {"moe_block"} and len(blocks) == 32
    assert profile.assumptions["expert_tokens"] == 4096 * 2 // 8 and profile.assumptions["capacity_factor"] == 1.0
    assert json.loads(archs.arch("mixtral-8x7b").canonical_json())["num_experts"] == 8
    assert profile.model.sha256 == archs.arch("mixtral-8x7b").sha256()

    worst = tmp_path / "worst.json"
    result, out = _run("profile", "--arch", "mixtral-8x7b", "--seq-len", "4096", "--micro-batch-size", "1",
                       "--capacity-factor", "4", "--out", str(worst))
    assert result.exit_code == 0, out
    every = io.load_profile(worst).layers[1]
    assert io.load_profile(worst).assumptions["expert_tokens"] == 4096  # every token on every expert's buffer
    # the routed terms at 4 x the slots: tokens, indices, four SwiGLU tensors and outputs, 8 x 1024 slots more x 3
    slots = 3 * 8 * 1024
    assert every.act_bytes - blocks[0].act_bytes == slots * (4096 * 2 + 8 + 4 * 14336 * 2 + 4096 * 2)


@pytest.mark.parametrize("args, message", [
    (["--arch", "mixtral-8x7b", "--seq-len", "8", "--capacity-factor", "5"],
     "--capacity-factor 5 is outside (0, 4] for mixtral-8x7b"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--capacity-factor", "2"],
     "--capacity-factor applies to mixture-of-experts models"),
    (["--arch", "mixtral-8x7b", "--seq-len", "8", "--capacity-factor", "0"], "Invalid value for '--capacity-factor'"),
    (["model.py", "--capacity-factor", "2"], "--capacity-factor applies to --arch/--arch-config profiles only"),
])
def test_capacity_factor_bad_input_is_one_sentence(tmp_path, args, message):
    result, out = _run("profile", *args, "--out", str(tmp_path / "p.json"))
    assert result.exit_code != 0 and message in out, out
    assert "Traceback" not in out and not (tmp_path / "p.json").exists()


def test_capacity_factor_help_says_the_worst_case():
    result, out = _run("profile", "--help")
    assert "--capacity-factor" in out and "worst case" in out


# ---------------------------------------------------------------- against measurement

def test_moe_block_bytes_match_the_saved_tensors_of_a_plain_torch_moe():
    """A MoE block in plain torch as the grouped implementations run it (Megatron-LM's permute,
    one expert after another over its slice of the permuted tokens, the routing weights applied
    to the experts' outputs, a scatter-add back), its saved tensors measured by the profiler's
    saved-tensor pass against moe_terms: within the 10% the dense blocks are held to (the
    combine is torchtitan's and Megatron-LM's scatter-add, which keeps only its indices; Hugging
    Face's index_add_ keeps the scaled outputs again, see moe_terms). Routing
    is whatever the random router picks: the routed slots add up to tokens x top_k however
    unbalanced, so capacity factor 1 is exact in total."""
    import torch
    from test_analytic import LlamaBlock, RMSNorm
    from torch import nn
    from torch.nn import functional as F

    from planner.models.modelfile import check_chain
    from planner.profiler.saved import saved_bytes

    arch = archs.Arch(**{**TINY_MOE.__dict__, "dense_layers": ()})

    class MoEBlock(LlamaBlock):
        def __init__(self):
            super().__init__(arch)
            h, width, shared = arch.hidden_size, arch.moe_intermediate_size, arch.shared_intermediate_size
            self.router = nn.Linear(h, arch.num_experts, bias=False)
            self.experts = nn.ModuleList(nn.ModuleList(nn.Linear(*io_, bias=False) for io_ in
                                                       ((h, width), (h, width), (width, h)))
                                         for _ in range(arch.num_experts))
            self.shared = nn.ModuleList(nn.Linear(*io_, bias=False) for io_ in ((h, shared), (h, shared), (shared, h)))
            del self.w1, self.w2, self.w3

        def forward(self, x):
            b, s, h = x.shape
            normed = self.attn_norm(x)
            q = self.rotary(self.wq(normed).view(b, s, self.heads, -1)).transpose(1, 2)
            k = self.rotary(self.wk(normed).view(b, s, self.kv, -1)).transpose(1, 2)
            v = self.wv(normed).view(b, s, self.kv, -1).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.wo(out.transpose(1, 2).reshape(b, s, -1))
            tokens = self.mlp_norm(x).view(b * s, h)
            probs = torch.softmax(self.router(tokens), dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(probs, arch.num_experts_per_tok, dim=-1)
            order = chosen.flatten().argsort(stable=True)  # the permutation: slots grouped by expert
            token_of_slot = order // arch.num_experts_per_tok
            dispatched = tokens[token_of_slot]
            counts = torch.bincount(chosen.flatten(), minlength=arch.num_experts).tolist()
            outputs = [down(F.silu(gate(part)) * up(part))
                       for (gate, up, down), part in zip(self.experts, dispatched.split(counts), strict=True)]
            routed = torch.cat(outputs) * weights.flatten()[order, None]
            combined = torch.zeros_like(tokens).scatter_add(0, token_of_slot[:, None].expand(-1, h), routed)
            gate, up, down = self.shared
            return x + (combined + down(F.silu(gate(tokens)) * up(tokens))).view(b, s, h)

    torch.manual_seed(0)
    layers = [("tok_embeddings", nn.Embedding(arch.vocab_size, arch.hidden_size)),
              *((f"layers.{i}", MoEBlock()) for i in range(arch.num_layers)),
              ("output", nn.Sequential(RMSNorm(arch.hidden_size), nn.Linear(arch.hidden_size, arch.vocab_size,
                                                                              bias=False)))]
    tokens = torch.randint(0, arch.vocab_size, (2, 33))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    check_chain(layers, inputs)
    saved = saved_bytes(layers, inputs, targets, lambda out, tgt: F.cross_entropy(out.flatten(0, 1), tgt.flatten()))
    predicted = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2, dtype="float32"), gpu=H100,
                                          model=REF)
    for index, ((name, layer), want) in enumerate(zip(layers, predicted.layers, strict=True)):
        assert sum(p.numel() for p in layer.parameters()) == want.param_count, name
        assert want.act_bytes == pytest.approx(saved.act_bytes[index], rel=0.10), name


@pytest.mark.parametrize("target", ["colossalai", "deepspeed"])
def test_an_moe_plan_is_not_exported_as_a_dense_model(tmp_path, target):
    """Megatron-LM and torchtitan exports write the experts (tests/test_expert_parallel.py); the
    targets whose exports write dense settings only refuse in one sentence."""
    from fixtures.cli import run, run_ok

    run_ok("profile", "--arch", "mixtral-8x7b", "--seq-len", "1024", "--tp", "8", "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--precision", "bf16-mixed",
           "--out", tmp_path / "plan.yaml")
    result = run("export", tmp_path / "plan.yaml", "--to", target)
    assert result.exit_code != 0 and "mixture-of-experts model" in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob(f"plan.{target}*"))
    written = run("export", tmp_path / "plan.yaml", "--to", "megatron")
    assert written.exit_code == 0 and "--num-experts 8" in (tmp_path / "plan.megatron.sh").read_text()


def test_selective_options_of_moe_and_latent_blocks_by_hand():
    """A MoE block's options (Megatron-LM's recompute modules): `mlp` recomputes the whole mixture
    (moe), `mlp-act` the routed experts' SiLU output and product (moe_act); a latent-attention
    block's `mla-up` its up-projected Q, K and V (mla_up_proj); combinations free their sum and
    peak at their largest part; mlp and mlp-act never combine."""
    shape = Shape(seq_len=32, micro_batch_size=2)  # T = 64, bf16, 128 routed slots of width 32
    kept = _kept(TINY_MOE, shape, moe=True)
    options = {o.name: o for o in analytic.selective_options(TINY_MOE, shape, H100, 0.4, moe=True)}
    mixture = 4 * 64 * 4 + 8 * 64 * 2 + 4 * 64 * 2 + 128 * 64 * 2 + 8 * 128 + 4 * 128 * 32 * 2 + 128 * 64 * 2 \
        + 4 * 64 * 48 * 2  # router, dispatch, routed experts, their outputs, shared expert (by hand above)
    act = 2 * 128 * 32 * 2  # SiLU output and product over the routed slots
    core = 4 * 4 * 32 * 2  # flash's logsumexp
    # and torchtitan's op-level SAC (planner/profiler/opsac.py; its MoE counts by hand in tests/test_opsac_moe.py)
    pairs = {"mlp", "mlp-act", "norm-out", "mlp,norm-out", "mlp-act,norm-out"}  # what each attention option joins
    assert set(options) == {"core-attn", "attn", *pairs, *(f"{attention},{part}" for attention in ("core-attn", "attn")
                                                          for part in pairs), "offload", "op-sac"}
    assert options["mlp"].kept_bytes == kept - mixture and options["mlp"].recompute_peak_bytes == mixture
    assert options["mlp-act"].kept_bytes == kept - act
    assert options["core-attn,mlp"].kept_bytes == kept - core - mixture
    assert options["core-attn,mlp"].recompute_peak_bytes == max(core, mixture)
    assert options["mlp"].recompute_ms == pytest.approx(
        analytic.flops_ms(analytic.mlp_flops(TINY_MOE, shape, moe=True), H100, 0.4))
    # the dense block of the same model keeps its dense options
    dense = {o.name for o in analytic.selective_options(TINY_MOE, shape, H100, 0.4)}
    # op-sac: torchtitan's op-level SAC; no norm-out: megatron-core fuses a dense GQA block's norms
    assert dense == {"core-attn", "attn", "mlp", "mlp-act", "core-attn,mlp", "core-attn,mlp-act", "attn,mlp", "attn,mlp-act",
                     "op-sac", "offload"}
    # latent attention: Q (from its latent), K and V up-projected, 64 tokens x 4 heads
    latent = {o.name: o for o in analytic.selective_options(TINY_MLA, shape, H100, 0.4)}
    up = 64 * 4 * (16 + 8) * 2 * 2 + 64 * 4 * 16 * 2
    # and (branch d1) the latent norms' outputs and fp32 1/rms, made inside the checkpoint under TE's spec
    up += sum(64 * rank * 2 + 4 * 64 for rank in (TINY_MLA.q_lora_rank, TINY_MLA.kv_lora_rank))
    assert latent["mla-up"].kept_bytes == _kept(TINY_MLA, shape) - up
    assert latent["mla-up"].recompute_ms == pytest.approx(
        analytic.flops_ms(2 * 64 * (24 * 4 * 24 + 16 * 4 * (16 + 16)), H100, 0.4))
    assert {"core-attn,mla-up", "mla-up,mlp-act", "core-attn,mla-up,mlp-act"} <= set(latent)
    assert not any("attn" in name.split(",") for name in latent)  # no whole-module attn on latent attention
