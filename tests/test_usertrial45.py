"""Defects found trying ckplan as a user on models and configs no test used (§45.usertrial8): each one's
command before and after, on a tiny case."""

from __future__ import annotations

from fixtures.cli import run, run_ok

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
