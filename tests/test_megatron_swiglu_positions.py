"""`evaluate --from-megatron` on a SwiGLU model whose positions are Megatron-LM's learned table (its
--position-embedding-type default learned_absolute): ckplan reads a SwiGLU model as rotary, so the table is listed as
not modelled, given or not, where it was said to have no effect, or said nothing (§67.usertrial67;
planner/models/configs/megatron_args.py unread_positions)."""

import json

import pytest
from fixtures.cli import run_ok

SCRIPT = ("torchrun --nproc_per_node 2 pretrain_gpt.py --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 "
          "--num-attention-heads 4 --seq-length 128 --max-position-embeddings 256 --micro-batch-size 1 "
          "--global-batch-size 4 --vocab-size 256 --swiglu --normalization RMSNorm --disable-bias-linear --bf16 "
          "--pipeline-model-parallel-size 2")


def _position_setting(tmp_path, extra: str) -> dict:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT + extra + "\n")
    settings = json.loads(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100", "--json").output)["settings"]
    found = [s for s in settings if s["name"] == "--position-embedding-type"]
    assert len(found) <= 1, found
    return found[0] if found else {}


@pytest.mark.parametrize(("extra", "value"), [("", "not given (learned_absolute)"),
                                              (" --position-embedding-type learned_absolute", "learned_absolute")])
def test_a_learned_table_under_swiglu_is_not_modelled_given_or_not(tmp_path, extra, value):
    setting = _position_setting(tmp_path, extra)
    assert (setting["value"], setting["status"]) == (value, "not modelled")
    assert "a table of 256 x 64 (16,384 parameters) on the first stage" in setting["what"]


def test_rope_under_swiglu_has_no_effect(tmp_path):
    setting = _position_setting(tmp_path, " --position-embedding-type rope")
    assert (setting["value"], setting["status"]) == ("rope", "no effect")


def test_a_gpt_style_model_still_charges_its_table(tmp_path):
    """Without --swiglu the learned table is modelled (a GPT-style block), as before."""
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT.replace(" --swiglu --normalization RMSNorm", "") + "\n")
    settings = json.loads(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100", "--json").output)["settings"]
    assert {s["name"]: s["status"] for s in settings}["--max-position-embeddings"] == "modelled"
