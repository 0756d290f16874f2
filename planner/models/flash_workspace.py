"""What torch's flash-attention backward allocates inside its own call, beyond its outputs dQ, dK, dV.

torch vendors FlashAttention-2's `mha_bwd` (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp; read at
pytorch/pytorch 03b7c19, docs/framework-facts.md §461, §555): after `dq`, `dk`, `dv` (`at::empty_like` of q, k, v:
the op's outputs) it makes `softmax_d` [batch, heads, seqlen_q rounded up to 128] fp32 and, with `loop = true`
always and outside deterministic mode, `dq_accum` [batch, seqlen_q rounded up to 128, heads, head_size rounded up
to 32 (to 64 above 128)] fp32 (`at::empty`). `_flash_attention_backward` (attention_backward.cu) returns dq, dk, dv
and drops `softmax_d`, so both are freed when the op returns. Under deterministic mode `dq_accum` is `nsplits`
zeroed copies, nsplits = ceil(SMs / (batch x heads)) (flash_api.cpp, the same lines): not what the rows run
(torchtitan 9dec370 leaves torch's deterministic algorithms off unless --debug.deterministic)."""

from __future__ import annotations

FP32 = 4
SOURCE = ("FlashAttention-2 mha_bwd as torch vendors it (aten/src/ATen/native/transformers/cuda/flash_attn/"
          "flash_api.cpp, pytorch 03b7c19): softmax_d and dq_accum, fp32, freed when the call returns")


def _round(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def flash2_backward_workspace(batch: int, heads: int, seqlen_q: int, head_dim: int, *,
                              deterministic: bool = False, sms: int = 0) -> tuple[int, int]:
    """(softmax_d, dq_accum) bytes one flash backward call makes for a query of [batch, heads, seqlen_q, head_dim]
    (module docstring); `sms`, the GPU's multiprocessor count, only under `deterministic`."""
    head_dim = _round(head_dim, 8)
    rounded_d = _round(head_dim, 32 if head_dim <= 128 else 64)
    rounded_q = _round(seqlen_q, 128)
    softmax_d = FP32 * batch * heads * rounded_q
    splits = -(-sms // (batch * heads)) if deterministic else 1
    return softmax_d, FP32 * splits * batch * rounded_q * heads * rounded_d
