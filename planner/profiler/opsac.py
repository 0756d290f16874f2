"""torchtitan's op-level selective activation checkpointing as a recompute option of an analytic
LLaMA block (`op-sac`).

The policy (torchtitan 9dec370 torchtitan/parallelisms/parallelize_llama.py 214-260; the same at
b5bcd76c torchtitan/distributed/activation_checkpoint.py): the whole block is wrapped in torch's
selective checkpoint; the outputs of the ops in `_save_list` are saved, every other op is rerun in
the backward, and of `aten.mm` only every second one is saved: a per-block counter (a fresh
defaultdict per checkpointed call) counts the mms, and an mm whose count is even is recomputed.
`_save_list`: aten.mm, aten._scaled_dot_product_efficient_attention,
aten._scaled_dot_product_flash_attention, _c10d_functional.reduce_scatter_tensor.

A torchtitan LLaMA block runs its mms in this order (torchtitan/models/llama/model.py: Attention
wq, wk, wv, then wo; FeedForward w2(silu(w1(x)) * w3(x))): wq 1 saved, wk 2, wv 3 saved, wo 4,
w1 5 saved, w3 6, w2 7 saved. So the block keeps: its input (the checkpoint's), Q (wq's output),
V (wv's), the flash attention's output and logsumexp, the gate (w1's output) and the MLP's output
(w2's, before the residual add; under TP the partial sum is whole); with TP + SP also the two
reduce-scatters' outputs (1/t of the residual stream each). Its backward reruns wk, wo and w3
and the elementwise ops (torchtitan sets no early stop: the whole forward reruns), so the rerun
holds what the block would keep without checkpointing, less what it keeps here.
"""

from __future__ import annotations

from planner.models.archs import GPU, Arch
from planner.profiler import analytic_time
from planner.profiler.formulas import Shape, kv_width, q_width
from planner.profiler.roofline import Kernel, work
from planner.schema import RecomputeOption

OPTION_OP_SAC = "op-sac"
FP32 = 4


def offers_op_sac(arch: Arch, shape: Shape, *, moe: bool) -> bool:
    """A dense LLaMA block with flash attention and grouped-query attention (the blocks torchtitan's
    LLaMA runs; its MoE and latent-attention models count their mms otherwise)."""
    return arch.style == "llama" and not moe and not arch.mla and shape.attention == "flash"


def op_sac_kept_bytes(arch: Arch, shape: Shape, boundary: int) -> int:
    """What the block keeps per microbatch under the policy (the module docstring), its input
    (`boundary`) included."""
    tokens, d, t = shape.tokens, shape.d, shape.tp
    q, kv, f, h = q_width(arch, shape), kv_width(arch, shape), arch.intermediate_size // t, arch.hidden_size
    kept = boundary + tokens * q * d + tokens * kv * d  # input, Q (wq), V (wv)
    kept += tokens * q * d + FP32 * (arch.num_heads // t) * tokens  # flash's output and logsumexp
    kept += tokens * f * d + tokens * h * d  # the gate (w1) and the MLP's output (w2, whole before any reduce)
    if shape.sp:
        kept += 2 * boundary  # the two reduce-scatters' outputs
    return kept


def op_sac_option(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None, *, boundary: int,
                  kept_without: int) -> RecomputeOption:
    """The `op-sac` option: kept as above; the rerun timed by the roofline: wk, wo and w3, each its
    own kernel, and every memory-bound op of the forward (the norms, rotary, SiLU and product, the
    residual adds: none is in `_save_list`, and the whole forward reruns); the rerun forward holding
    what the block keeps without checkpointing beyond what it kept."""
    tokens, t = shape.tokens, shape.tp
    q, kv, f, h = q_width(arch, shape), kv_width(arch, shape), arch.intermediate_size // t, arch.hidden_size
    mms = (2 * tokens * h * kv, 2 * tokens * q * h, 2 * tokens * h * f)  # wk, wo, w3
    forward, _, _ = analytic_time.block_work(arch, shape)
    rerun = work(sum(mms), forward.bytes, [Kernel("matmul", flops) for flops in mms], classed=forward.classed)
    kept = op_sac_kept_bytes(arch, shape, boundary)
    return RecomputeOption(name=OPTION_OP_SAC, kept_bytes=kept,
                           recompute_ms=analytic_time.times_ms((rerun,), gpu, mfu)[0],
                           recompute_peak_bytes=max(0, kept_without - kept))
