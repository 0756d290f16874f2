"""Context parallelism in the analytic profile: what one of `cp` ranks holds and exchanges.

Megatron-LM with Transformer Engine (`--context-parallel-size`, TE's attn_forward_func_with_cp,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py at d0067d0d,
2026-08-22) and torchtitan (`parallelism.context_parallel_degree`: torch's context_parallel,
torch/distributed/tensor/experimental/_context_parallel/_attention.py, torch 2.13.0 cf30153c)
split every sequence into 2·cp chunks and give rank r chunks r and 2·cp - 1 - r (the load
balancer: TE's get_batch_on_this_cp_rank; torch's _HeadTailLoadBalancer), so every rank holds
s / cp tokens and, causally masked, the same attention work. Everything but attention is per
token: a rank's activations, FLOPs and memory-bound bytes are the whole sequence's / cp
(Shape.tokens). Attention reads every token's K and V: a rank's queries against all s keys,
4·(s/cp)·s·a·hd FLOPs, half of it run (causal, balanced), which analytic_time already writes
from Shape.tokens and Shape.seq_len: cp flash calls a pass (ring_calls), each over as many pairs as a
causal call over the rank's s/cp tokens, so each at that length's published efficiency. Without the load balancer (torchtitan's
context_parallel_load_balancer off; torch's _templated_ring_attention then skips the steps whose keys
lie after its queries, _attention.py 424-427) rank r computes r + 1/2 of the cp blocks of its row,
the last rank (2·cp - 1) / cp times the mean, and every step waits for it: not modelled (the
readers list an unbalanced setting as such; the profile charges the balanced work). What the block keeps for its backward is flash attention's
own at s / cp tokens: both runtimes save the rank's Q, K, V, output and logsumexp
(TE: ctx.save_for_backward(q, kv, out, softmax_lse), context_parallel.py 2100-2142; torch: the
ring op's inputs and outputs, _attention.py 658-690), not the K and V received from the others.

What moves, and the buffers that hold it while the attention runs, are the runtime's (its
record's cp_comm, planner/cost/contextparallel.py); the profile records per block the rank's Q
and K/V bytes and the attention core's time in each pass (`LayerContextParallel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import UserError
from planner.models.archs import GPU, Arch
from planner.profiler import analytic_time
from planner.profiler.formulas import Shape, kv_width, q_width
from planner.profiler.roofline import work
from planner.schema import LayerContextParallel


def check_cp(arch: Arch, shape: Shape) -> None:
    """Refuse, in one sentence, a context-parallel split the frameworks refuse."""
    cp = shape.cp
    if cp == 1:
        return
    if shape.seq_len % (2 * cp):
        raise UserError(f"--cp {cp} splits each sequence into 2 x {cp} chunks for the load balancer (Megatron-LM "
                        f"and torch's context_parallel both do); --seq-len {shape.seq_len} is not a multiple of "
                        f"{2 * cp}")
    if shape.attention != "flash":
        raise UserError(f"--cp {cp} runs ring attention over fused attention kernels (Transformer Engine's, torch's "
                        "SDPA flash / efficient / cuDNN); eager attention has no context-parallel path: drop "
                        "--attention eager")
    if shape.sp and (shape.seq_len // cp) % shape.tp:
        raise UserError(f"--sp splits each rank's {shape.seq_len // cp} tokens (--seq-len / --cp) across --tp "
                        f"{shape.tp}; choose sizes where --tp divides --seq-len / --cp")


def widths(arch: Arch, shape: Shape) -> tuple[int, int]:
    """(Q's width, K's and V's together) per token on this device: GQA at a·hd and 2·kv·hd;
    latent attention at its up-projected a·(nope + rope) and a·(nope + rope + v)."""
    if arch.mla:
        heads = arch.num_heads // shape.tp
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        return heads * qk, heads * (qk + arch.v_head_dim)
    return q_width(arch, shape), 2 * kv_width(arch, shape)


@dataclass(frozen=True)
class RingCall:
    """One flash call of a ring step on a rank: its queries and keys per sequence, causal or not."""

    step: int
    queries: int
    keys: int
    causal: bool

    @property
    def pairs(self) -> int:
        """The query-key pairs the call computes (a causal call its lower triangle, diagonal included
        as flash's count halves it: queries x keys / 2)."""
        return self.queries * self.keys // (2 if self.causal else 1)


def ring_calls(seq_len: int, cp: int, rank: int) -> list[RingCall]:
    """The flash calls rank `rank` of a causal, load-balanced ring makes, one a step: step 0 causal on
    its own two chunks (s / cp queries and keys); a later step i <= rank all its queries against the
    first half (s / 2cp) of the K/V received from rank - i, not causal; i > rank the second half of its
    queries against all s / cp received keys, not causal. Every call covers 2 (s / 2cp)^2 pairs, a causal
    call's over s / cp tokens, on every rank. torch 2.6.0 (`_is_causal_behavior` and
    `_templated_ring_attention`, torch/distributed/tensor/experimental/_attention.py 65-82, 472-528,
    docs/framework-facts.md §47) and Transformer Engine d0067d0d ("diagonal", "lower-triangle",
    "upper-triangle": cp_p2p_fwd_prepare_qkv, attention/dot_product_attention/context_parallel.py
    707-780, 1796-1870) split them alike; the backward makes the same calls' gradients."""
    own, half = seq_len // cp, seq_len // (2 * cp)
    return [RingCall(0, own, own, True)] + [
        RingCall(i, own, half, False) if i <= rank else RingCall(i, half, own, False) for i in range(1, cp)]


def exchange(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None) -> LayerContextParallel | None:
    """A block's record under context parallelism (None at cp 1): the rank's Q and K/V bytes,
    and the attention core's forward and backward time on the rank (the kernels analytic_time
    writes, every ring step's together)."""
    if shape.cp == 1:
        return None
    q, kv = widths(arch, shape)
    core, fwd_bytes, bwd_bytes = analytic_time._attention(arch, shape)
    fwd = work(sum(kernel.flops for kernel in core), fwd_bytes, core)
    backward = analytic_time._backward_kernels(core, arch)
    bwd = work(sum(kernel.flops for kernel in backward), bwd_bytes, backward)
    fwd_ms, bwd_ms = analytic_time.times_ms((fwd, bwd), gpu, mfu)
    return LayerContextParallel(ranks=shape.cp, q_bytes=shape.tokens * q * shape.d,
                                kv_bytes=shape.tokens * kv * shape.d, attention_fwd_ms=fwd_ms, attention_bwd_ms=bwd_ms)
