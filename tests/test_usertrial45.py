"""Defects found trying ckplan as a user on models and configs no test used (§45.usertrial8): each one's
command before and after, on a tiny case."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.cli import run, run_ok

from planner.emit.megatron_positions import arguments
from planner.errors import UserError

# a Megatron-LM job as a user writes it (a YAML mapping of flags), small enough to score in seconds
_TINY = """MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 256
  --num-attention-heads: 4
  --ffn-hidden-size: 1024
  --position-embedding-type: {kind}
  --seq-length: 512
  --max-position-embeddings: {rows}
  --vocab-size: 1024
  --make-vocab-size-divisible-by: 128
  --micro-batch-size: 1
  --global-batch-size: 8
  --bf16: true
"""


def test_evaluate_from_megatron_refuses_a_sequence_longer_than_megatrons_positions(tmp_path):
    """Megatron-LM asserts --max-position-embeddings >= --seq-length for every position kind (arguments.py 1354 at
    d98e8a64, §681): GPT-2 medium searched at 4,096 tokens, exported (--max-position-embeddings 1024) and read back
    was scored (236 ms, MFU 38.2%) though Megatron-LM stops at its argument checks; now refused, and at the bound
    itself (512 rows, 512 tokens) scored as before."""
    for kind in ("learned_absolute", "rope"):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(_TINY.format(kind=kind, rows=511))
        result = run("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100")
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "--max-position-embeddings 511 is under --seq-length 512" in said, said
        assert "give --max-position-embeddings 512 or more, or a --seq-length of 511 or less" in said
        path.write_text(_TINY.format(kind=kind, rows=512))
        run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100")


# GPT-2 as its config.json gives it (learned position table of n_positions rows), tiny
_TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128, "vocab_size": 256,
              "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
# DeepSeek-V3's fields (latent attention, a dense layer then routed experts) at toy sizes, with its published
# config's one multi-token-prediction module (num_nextn_predict_layers)
_TINY_DSV3 = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "n_shared_experts": 1,
              "n_routed_experts": 4, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1,
              "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
              "vocab_size": 256, "max_position_embeddings": 128, "tie_word_embeddings": False, "hidden_act": "silu",
              "num_nextn_predict_layers": 1}


def _config(tmp_path, name: str, config: dict):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def _search(config, seq_len: int, tmp_path):
    return run("search", "--arch-config", config, "--gpus", "1", "--gpu", "h100", "--global-batch", "1",
               "--seq-len", seq_len, "--time-limit", "5", "--out", tmp_path / "best.yaml")


def test_a_learned_position_table_shorter_than_the_sequence_is_refused_by_profile_and_search(tmp_path):
    """GPT-2 medium (n_positions 1024) searched at --seq-len 4096 was ranked (MFU 38.2% once exported), and `profile`
    only warned: a token past the table's last row has no position embedding, so the model never runs (Megatron-LM
    asserts it too, §681). Now both refuse; at the table's length both go on."""
    config = _config(tmp_path, "gpt2", _TINY_GPT2)
    profile = ("profile", "--arch-config", config, "--gpu", "h100", "--dtype", "bf16", "--out", tmp_path / "p.json")
    for result in (run(*profile, "--seq-len", "129"), _search(config, 129, tmp_path)):
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "--seq-len 129 exceeds gpt2's learned position table of 128 rows" in said
        assert "give --seq-len 128 or less" in said and not (tmp_path / "best.yaml").exists()
    assert "exceeds" not in run_ok(*profile, "--seq-len", "128").output
    assert "exceeds" not in _search(config, 128, tmp_path).output


def test_search_says_what_profile_says_of_a_configs_mtp_modules_and_rotary_length(tmp_path):
    """`profile --arch-config` warns that DeepSeek-V3's multi-token-prediction module is not planned and that a rotary
    model runs past its max_position_embeddings; `search` on the same config said neither (DeepSeek-V3 at 8 layers,
    64 H100s: ranked and exported with no word of its MTP module). Now it says both, as profile does."""
    config = _config(tmp_path, "dsv3", _TINY_DSV3)
    said = " ".join(_search(config, 256, tmp_path).output.split())
    assert "dsv3's 1 multi-token-prediction module(s) are not planned" in said, said
    assert "--seq-len 256 exceeds dsv3's max_position_embeddings 128 (rotary positions" in said
    profiled = " ".join(run_ok("profile", "--arch-config", config, "--gpu", "h100", "--dtype", "bf16", "--seq-len",
                               "256", "--out", tmp_path / "p.json").output.split())
    assert "dsv3's 1 multi-token-prediction module(s) are not planned" in profiled
    assert "--seq-len 256 exceeds dsv3's max_position_embeddings 128 (rotary positions" in profiled


_TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
               "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False}


def test_the_megatron_export_of_a_rotary_plan_past_the_configs_positions_is_one_megatron_runs(tmp_path):
    """A rotary model searched past its max_position_embeddings (allowed, said) was exported with the config's
    --max-position-embeddings under the plan's --seq-length, a script Megatron-LM stops (§681) and evaluate
    --from-megatron now refuses; the export writes the plan's length, says why, and reads back as the plan."""
    config = _config(tmp_path, "tiny_llama", _TINY_LLAMA)
    run_ok("search", "--arch-config", config, "--gpus", "1", "--gpu", "h100", "--global-batch", "1", "--seq-len",
           "256", "--runtime", "megatron", "--precision", "bf16-mixed", "--time-limit", "5", "--out",
           tmp_path / "best.yaml")
    exported = tmp_path / "megatron.sh"
    run_ok("export", tmp_path / "best.yaml", "--to", "megatron", "--out", exported)
    text = exported.read_text()
    assert "--seq-length 256\n" in text and "--max-position-embeddings 256\n" in text
    assert "# the config's max_position_embeddings 128 is under the plan's 256 tokens" in text
    script = tmp_path / "run.sh"
    script.write_text(text + 'torchrun --nproc_per_node 1 pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" --vocab-size 256\n')
    run_ok("evaluate", "--from-megatron", script, "--gpus", "1", "--gpu", "h100")


def test_the_megatron_export_refuses_a_learned_table_shorter_than_the_plans_sequence():
    def arg(flag, value):
        return f"{flag} {value}"

    assert arguments(SimpleNamespace(max_position_embeddings=128, rotates=False), 128, arg) == [
        "--seq-length 128", "--max-position-embeddings 128"]
    with pytest.raises(UserError, match="past the model's learned position table of 128 rows"):
        arguments(SimpleNamespace(max_position_embeddings=128, rotates=False), 129, arg)
    assert arguments(SimpleNamespace(max_position_embeddings=None, rotates=True), 64, arg)[-1] == \
        "--max-position-embeddings 64"


def test_the_megatron_export_of_a_config_without_its_norm_epsilon_says_what_to_write(tmp_path):
    """A config.json without rms_norm_eps, searched and exported to Megatron-LM: the export was refused with
    "re-create the profile with this ckplan's `ckplan profile --arch/--arch-config`", which makes the same profile
    again; now it names the config's missing field, as its rope_theta refusal does."""
    config = _config(tmp_path, "no_eps", {k: v for k, v in _TINY_LLAMA.items() if k != "rms_norm_eps"})
    run_ok("search", "--arch-config", config, "--gpus", "1", "--gpu", "h100", "--global-batch", "1", "--seq-len",
           "128", "--runtime", "megatron", "--precision", "bf16-mixed", "--time-limit", "5", "--out",
           tmp_path / "best.yaml")
    result = run("export", tmp_path / "best.yaml", "--to", "megatron", "--out", tmp_path / "megatron.sh")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "names no rms_norm_eps" in said, said
    assert "write the model's rms_norm_eps into the config and profile it again" in said
    assert "re-create the profile" not in said


FROZEN_FILE = Path(__file__).parent / "fixtures" / "frozen_mlp.py"


def test_profile_says_a_model_files_frozen_parameters_are_charged_as_frozen(tmp_path):
    """A fine-tuning model file (embedding and two blocks frozen, requires_grad False): the profile timed their step
    as none but every plan charged them a gradient and Adam's states (stage 0's static 5,271,552 B = 329,472 x 16 where
    they hold 1,317,888), and `launch` stopped at torch's MemTracker, all unsaid; the profile names the layers and
    the count (72 + 8 here) and, since §45.frozen, that they are charged as frozen (tests/test_frozen.py)."""
    path = tmp_path / "frozen.py"
    path.write_text(FROZEN_FILE.read_text())
    said = " ".join(run_ok("profile", path, "--micro-batch-size", "2", "--out", tmp_path / "p.json").output.split())
    assert "layers 0, 2 hold 80 parameters with requires_grad False: charged as frozen" in said, said


def test_profile_hf_config_says_deepseeks_mtp_modules_are_not_planned(tmp_path):
    """`profile --hf-config` of DeepSeek-V3's config (num_nextn_predict_layers 1) profiled the main model without a
    word, where --arch-config warns; transformers 5.24's DeepseekV3ForCausalLM trains no MTP module (its config's
    num_mtp_layers is for generation's speculative decoding, §683). Now it says so."""
    pytest.importorskip("transformers")
    # one (dense) decoder layer at 16 tokens: the warning is read off the config before the profile runs, and
    # the profile's size is not what this test is about (the MoE layer's fake profile is test_fake_moe's)
    config = _config(tmp_path, "dsv3", {**_TINY_DSV3, "n_group": 1, "topk_group": 1, "rms_norm_eps": 1e-06,
                                        "rope_theta": 10000, "num_hidden_layers": 1})
    said = " ".join(run_ok("profile", "--hf-config", config, "--fake", "--seq-len", "16", "--gpu", "h100", "--dtype",
                           "bf16", "--micro-batch-size", "1", "--out", tmp_path / "p.json").output.split())
    assert "its 1 multi-token-prediction module(s) (num_nextn_predict_layers) are not planned" in said, said
