"""Defects found trying ckplan as a user on models and configs no test used (§44.usertrial7): each one's
command before and after, on a tiny case."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok

# a Megatron-LM job as a user writes it (YAML mapping of flags), small enough to score in seconds: GQA 4
# heads over 2 groups of head dim 64, SwiGLU, untied, a 1,024-token vocabulary (a multiple of 128: no padding)
_TINY_GQA = """MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 256
  --num-attention-heads: 4
  --group-query-attention: true
  --num-query-groups: 2
  --ffn-hidden-size: 512
  --swiglu: true
  --normalization: RMSNorm
  --disable-bias-linear: true
  --untie-embeddings-and-output-weights: true
  --position-embedding-type: rope
  --seq-length: 512
  --max-position-embeddings: 512
  --vocab-size: 1024
  --make-vocab-size-divisible-by: 128
  --micro-batch-size: 1
  --global-batch-size: 8
  --bf16: true
"""

# Megatron-LM d98e8a64 megatron/training/training.py num_floating_point_operations (§650), by hand for
# _TINY_GQA, per token: 3 (fwd, wgrad, dgrad) x 2 (FMA) x [2 layers x (h (q + k + v) + q s / 2 x 2 + q h)
# + the MLP's h x 3 x ffn + the logits' h x V]
_MEGATRON_FLOPS_PER_TOKEN = 6 * (2 * (256 * (256 + 128 + 128) + 256 * 512 + 256 * 256 + 256 * 3 * 512) + 256 * 1024)


def test_evaluate_from_megatron_prints_the_throughput_megatron_logs(tmp_path):
    """`evaluate --from-megatron` printed only torchtitan's MFU (non-causal attention, no logits' embedding
    term), which a Megatron-LM user cannot hold against the "throughput per GPU (TFLOP/s/GPU)" of their log
    (Qwen3-32B's exported plan: "MFU 26.4%" where search's own table said Megatron-LM's 0.248); now it
    prints Megatron-LM's figure too, and --json carries it."""
    path = tmp_path / "tiny_gqa.yaml"
    path.write_text(_TINY_GQA)
    assert _MEGATRON_FLOPS_PER_TOKEN == 10_223_616
    summary = json.loads(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100", "--json").stdout)
    tflops = _MEGATRON_FLOPS_PER_TOKEN * summary["tokens_per_s_per_gpu"] / 1e12
    assert summary["tflops_per_gpu_megatron"] == pytest.approx(tflops, rel=1e-12)
    assert summary["mfu_megatron"] == pytest.approx(tflops / 989.4, rel=1e-12)  # H100 SXM's dense BF16 peak
    said = " ".join(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100").output.split())
    assert f"Megatron-LM logs it as throughput per GPU {tflops:.1f} TFLOP/s/GPU" in said
