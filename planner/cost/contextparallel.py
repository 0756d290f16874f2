"""Context parallelism's exchange of K and V, in time and in memory, as the runtime runs it.

Under context parallelism (cp ranks, each holding s / cp tokens of every sequence: the analytic
profile's per-layer record, LayerContextParallel) a block's attention needs every rank's K and V.
Let KV be the rank's K and V bytes, Q its Q bytes (the output O is as wide), and c the
attention core's time in a pass split evenly over its cp steps (the load balancer gives every
rank and every step the same causal work).

Ring, point to point ("p2p": Transformer Engine's AttnFuncWithCPAndKVP2P under Megatron-LM,
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py at d0067d0d):
- forward: cp steps; before step i computes, the K/V it holds is sent on to the next rank while the
  next step's arrives (1685-1720: p2p_comm_buffers[i + 1], flash_attn_p2p_communicate), so each of
  the cp - 1 sends overlaps one step's compute: exposed (cp - 1) x max(0, send(KV) - c);
- backward: each step passes K/V and the accumulated dK/dV together (2340-2420: p2p_comm_buffers of
  [kv, dkv]), (cp - 1) x max(0, send(2 KV) - c), then the last dK/dV goes home after the last step,
  nothing left to hide it: send(KV);
- buffers while the attention runs: forward the K/V received at every step (held in
  p2p_comm_buffers to the end: (cp - 1) KV), every step's output (out_per_step, cp O on the busiest
  rank, cp - 1, whose every step computes all its queries) and the fp32 output the correction builds
  (2 O); backward dq (Q), the two [K/V, dK/dV] send / receive buffers (4 KV) and a step's dq, dk, dv
  (Q + KV).

All-gather ("allgather": torch's context_parallel, which torchtitan runs; torch/distributed/tensor/
experimental/_context_parallel/_attention.py, torch 2.13.0 cf30153c):
- forward: one all-gather of every rank's K/V (273-300, _AllGatherRotater), issued before step 0
  and waited at step 1: exposed max(0, all-gather(cp KV) - c);
- backward (488-655): the K/V all-gathered again, hidden behind step 0 likewise (not where a compiled,
  fully recomputed block's backward reuses its rerun forward's gather: reuses_recomputed_gather); dK/dV accumulated in
  fp32 (convert_to_f32, line 75) and passed rank to rank by all-to-all (_AllToAllRotater: a send of
  2 KV bytes) after every step, each waited after the next step's compute: (cp - 1) x max(0,
  send(2 KV) - c) + send(2 KV) for the last;
- buffers: the largest bytes of the allocations the ring makes, in order, on its busiest rank
  (planner/cost/cpring.py, torch 2.6.0's code request by request, eager or as the compiled block fuses it):
  forward the K/V copies, their concatenation and the gathered K/V, the steps' outputs and the merger's fp32
  running output with its intermediates; backward the fp32 dQ, dK, dV, the gathered K/V, a step's gradients,
  dK/dV's partial updates and the fp32 buffers sent and received.
  Compiled (torchtitan 9dec370's fullgraph block compile on torch 1963fc8, read at 2.6.0; the record's
  cp_compiled_waits_at_issue), none of this overlaps: tracing waits for each functional collective on the
  next line and inductor does not move the wait, so the all-gather (cp KV) and each of the cp fp32 dK/dV
  passes are exposed whole (waits_at_issue).
All-to-all over the heads ("a2a": Megatron-LM's --cp-comm-type a2a, TE's AttnFuncWithCPAndQKVOA2A,
context_parallel.py 4170-4600 at d0067d0d; DeepSpeed-Ulysses' scheme): Q, K and V are each
all-to-all'd from s/cp tokens of every head to every token of h/cp heads before the attention, the
output back after it (flash_attn_a2a_communicate 387-540, waited before the kernel runs: nothing
to hide behind), and in the backward dO before, dQ, dK, dV after: per pass 2 a2a(Q) + 2 a2a(KV / 2)
exposed, each moving (cp - 1) / cp of its tensor. The attention then runs all s queries of its h/cp
heads: the same FLOPs as the balanced ring. What it saves is Q, K, V and O after the exchange, as
many bytes as before; buffers: each a2a's output and its reordered copy, forward 2 (Q + KV) + 2 O,
backward 2 dO + 3 (dQ + dKV).
K and V are exchanged, and held, as the runtime's model hands them to attention: torchtitan's llama
repeats each K/V head over its query heads first (repeat_kv; the record's cp_repeats_kv), so its
K and V are each as wide as Q (kv_bytes x heads / kv heads); Transformer Engine takes them at their
own heads. A full recompute reruns the forward's exchange. The exchange crosses the context-parallel group's
link (comm.group_link: its ranks lie tp apart) at NCCL's latency model (planner/cost/comm.py).
"""

from __future__ import annotations

import dataclasses

from planner.cost import cpring, runtimes
from planner.cost.comm import Link, collective_ms, send_ms, setup_link
from planner.schema import TrainSetup

PASS_NAMES = ("forward", "backward")


def comm_type(training) -> str | None:
    """The exchange the setup runs: --cp-comm where given, else its runtime's default."""
    return getattr(training, "cp_comm", None) or runtimes.of(training).cp_comm


def as_exchanged(exchange, training):
    """The layer's exchange (ExchangeCost) with K and V as the runtime's model hands them to attention:
    repeated to the query heads where the runtime repeats them (cp_repeats_kv): the repeat factor is
    Q's width over one of K, V (heads / kv heads); 1 where K/V are as wide as Q or wider (MHA, latent
    attention's up-projected K/V)."""
    repeat = (2 * exchange.q_bytes) // exchange.kv_bytes if exchange.kv_bytes else 1
    if not runtimes.of(training).cp_repeats_kv or repeat <= 1:
        return exchange
    return dataclasses.replace(exchange, kv_bytes=exchange.kv_bytes * repeat)


def cp_link(setup: TrainSetup) -> Link | None:
    comm = setup.comm
    if comm.cp_gb_per_s is None or comm.cp <= 1:
        return None
    return setup_link(comm, comm.cp_gb_per_s, comm.cp_step_latency_ms, ranks=comm.cp, stride=comm.tp)


def pass_exposed_ms(exchange, which: str, kind: str, link: Link, regather: bool = True,
                    waited: bool = False) -> float:
    """What one pass's exchange ("forward", "backward") adds beyond the attention it overlaps; an all-gather
    ring's backward without its own all-gather where it reuses the recomputed forward's (regather False), and
    with every exchange whole where the compiled ring waits for each as it issues it (waited: waits_at_issue)."""
    cp, kv = exchange.ranks, exchange.kv_bytes
    step = 0.0 if waited else (exchange.attention_fwd_ms if which == "forward" else exchange.attention_bwd_ms) / cp
    if kind == "a2a":  # Q (or dQ) and O (or dO), K and V (or their gradients) each; none hidden
        return 2 * collective_ms("all-to-all", exchange.q_bytes, cp, link) + \
            2 * collective_ms("all-to-all", kv / 2, cp, link)
    if kind == "p2p":
        if which == "forward":
            return (cp - 1) * max(0.0, send_ms(kv, link) - step)
        return (cp - 1) * max(0.0, send_ms(2 * kv, link) - step) + send_ms(kv, link)
    gather = max(0.0, collective_ms("all-gather", cp * kv, cp, link) - step)
    if which == "forward":
        return gather
    return (gather if regather else 0.0) + (cp - 1) * max(0.0, send_ms(2 * kv, link) - step) + send_ms(2 * kv, link)


def reuses_recomputed_gather(option: int, training) -> bool:
    """Whether a fully recomputed block's backward reuses the K/V its rerun forward all-gathered: where the
    runtime compiles the block, AOTAutograd's common-subexpression pass merges the rerun's all-gather with the
    backward ring's (the same concatenated K/V, the same group): torch 2.6.0, torchtitan 9dec370's step run on
    CPU, one all_gather_into_tensor in the backward graph at CP 2, 4 and 8 (scripts/cp_compile_ring.py,
    docs/framework-facts.md §30). Eager, or without the rerun, the backward gathers again."""
    return option == 1 and bool(training.compile) and runtimes.of(training).compiles_model


def waits_at_issue(training) -> bool:
    """Whether the setup's ring waits for each exchange where it issues it: a compiled block on a runtime
    whose record says so (cp_compiled_waits_at_issue: torch 2.6.0's _maybe_wrap_tensor puts wait_tensor
    after the traced collective and inductor 2.6 does not reorder it, docs/framework-facts.md §37)."""
    return bool(training.compile) and runtimes.of(training).compiles_model and \
        runtimes.of(training).cp_compiled_waits_at_issue


def exchange_ms(layer, option: int, setup: TrainSetup) -> float:
    """A layer's (LayerCost's) exposed exchange per microbatch: forward, backward, and the forward's
    again where its option recomputes the whole layer (1, "full"), whose all-gather the compiled backward
    then reuses (reuses_recomputed_gather). Nothing without context parallelism or a link."""
    exchange, link = layer.context_parallel, cp_link(setup)
    if exchange is None or link is None:
        return 0.0
    exchange = as_exchanged(exchange, setup.training)
    kind = comm_type(setup.training)
    waited = kind == "allgather" and waits_at_issue(setup.training)
    forward = pass_exposed_ms(exchange, "forward", kind, link, waited=waited)
    regather = not reuses_recomputed_gather(option, setup.training)
    return forward * (2 if option == 1 else 1) + pass_exposed_ms(exchange, "backward", kind, link, regather, waited)


# What the compiled ring adds to the block's fused kernels, read off inductor itself (scripts/cp_ring_bytes.py: torch
# 2.6.0's inductor on 9dec370's checkpointed, fullgraph-compiled block with and without context_parallel, LLaMA 3 8B's
# head proportions at head dim 64, CP 2 and 4; inductor's own byte estimate per fused kernel, the busiest rank of each
# graph): bytes per element of O, K and V as exchanged over 3 (O's elements where torchtitan's repeat_kv makes K and V
# each as wide as Q, the one proportion counted), fixed and per later ring step. Forward graph: CP 2 18.625, CP 4
# 41.03125 (rank 0, whose later steps all merge half its queries); backward graph (the rerun forward's ring, then the
# backward's): CP 2 89.8125, CP 4 224.3125 (rank 2), of which the rerun's is charged as a forward (ring_membound_ms):
# the backward is the graph's less the forward's. It moves less than the hand count in the forward (the step-0 casts
# fuse into the merges, the K/V concatenation into repeat_kv's copy) and more in the backward (each in-place add into
# a received fp32 dK/dV buffer is functionalised into a slice_scatter copy of it, and the sums are concatenated anew).
COMPILED_RING_BYTES = {"forward": (475 / 64, 717 / 64), "backward": ((1444 - 475) / 64, (4304 - 717) / 64)}


def ring_bytes(exchange, which: str, compiled: bool) -> float:
    """Bytes torch's all-gather ring moves around its attention calls in one pass on its busiest rank
    (rank cp - 1, whose every step after the first computes all its queries), beyond the kernels
    (experimental/_context_parallel/_attention.py at torch 2.13.0 cf30153c, the lines below; the same
    code in torch 2.6.0 2236df17's experimental/_attention.py, the release nearest the runs' 1963fc8:
    merge 156, 184, 189-193, forward 462-463, 482, backward 633-638, 653, 704-764). Per element of the output O (q_bytes / 2) and of K with V
    (kv_bytes / 2, as exchanged):
    - forward: step 0's output to fp32 and the merged output back to bf16 (6 + 6: step 214, results
      219-223), each of the cp - 1 merges (_merge_one 186: out - sigmoid(..) x (out - block_out))
      eager 38 (the step's output to fp32 6, two subtractions 12 each, the product 8), compiled one
      kernel reading the fp32 and the step's outputs and writing fp32: 10; K/V's concatenation for
      the all-gather (438) 4, eager again at every step but the last (the all-gather takes the
      first; compiled, the rest are dead) and its .contiguous() copy eager (418-419) 4;
    - backward (488-655): dQ accumulated in fp32 over every step (629-640: += 10 a step; eager the
      zeros first, 513, 4), dQ back to bf16 (645) 6; dK/dV: eager the zeros (514-515) 4, .contiguous()
      (517-518) 4 and the K/V concatenation at every step but the last (533) 4, step 0's += 10 and
      the send's fp32 concatenation (625) 8, then per later step the received buffer's first half
      added into (604-618: _partial_update, 5) and concatenated whole (8), then concatenated for the
      send (8); compiled, step 0 writes the fp32 send buffer from the bf16 gradients (6) and each
      later step reads the received buffer (4) and half a step's gradients (1) into the next (4), the
      K/V concatenation once (4); the last received dK/dV back to bf16 (646) 6.
    The lse's own ops (a head's one float a token) are left out: 1 / head_dim of these. The "compiled" counts
    above were a hand count of what inductor would fuse; the compiled ring is charged inductor's own count
    instead (COMPILED_RING_BYTES, on the busiest rank of each graph, lse included), the eager one by hand."""
    cp, o, kv = exchange.ranks, exchange.q_bytes / 2, exchange.kv_bytes / 2
    steps = cp - 1
    if compiled:
        fixed, per_step = COMPILED_RING_BYTES[which]
        return (fixed + per_step * steps) * (o + kv) / 3
    if which == "forward":
        return (12 + 38 * steps) * o + (4 + 4 * steps) * kv
    return (4 + 10 + 10 * steps + 6) * o + (4 + 4 + 4 * steps + 10 + 8 + 21 * steps + 6) * kv


def p2p_ring_bytes(exchange, which: str) -> float:
    """Bytes Transformer Engine's p2p ring (AttnFuncWithCPAndKVP2P, causal, sbhd, bf16 attention: TE v2.9
    70f53666 attention/dot_product_attention/context_parallel.py; docs/framework-facts.md §518-§520) moves
    around its fused attention calls in one pass on its busiest rank, cp - 1 (every later forward step and
    every backward step computes all its queries). O is the output (as wide as Q: q_bytes), KV the K and V
    bytes together:
    - forward: K and V concatenated into the send buffer (1360: read and write, 2 KV); the first step's
      output scaled into the running output (flash_attn_fwd_out_correction_init 101-112, its result in the
      output's own bf16: 2 O), and each later step's added into it (flash_attn_fwd_out_correction 115-127,
      out.add_: the running output read and written, the step's read, 3 O); the final `out.to(bf16)` is no copy;
    - backward (the steps 2103-2436; the last, cp - 1, is the diagonal, the others lower triangles: all
      queries against half the K/V): K/V copied into the first send buffer (2038: 2 KV); dq copied from
      the first step's gradient (2291: 2 O) and each later step's added in (2294, dq.add_: 3 O); dK/dV (the
      buffer sent on) copied into its first half from step 0's half-length gradient (2409: KV), each middle
      step's half added in (2419: 1.5 KV), and the diagonal's whole one added at the last step (2401: 3 KV).
    The half-sections' views (q[1], k[0] of the [2, s / 2cp, ...] layout) are contiguous already; the
    softmax statistics' ops (one fp32 a head and token: 1 / 64 of O at head dim 128) are left out."""
    cp, o, kv = exchange.ranks, exchange.q_bytes, exchange.kv_bytes
    if which == "forward":
        return 2 * kv + 2 * o + 3 * o * (cp - 1)
    return 2 * kv + 2 * o + 3 * o * (cp - 1) + kv + 1.5 * kv * (cp - 2) + 3 * kv


def ring_membound_ms(layer, option: int, profile, setup: TrainSetup) -> float:
    """The time of the ring's own memory-bound kernels, forward (twice under a full recompute, option 1) and
    backward, at the profile's measured memory-bound rate: torch's all-gather ring (ring_bytes) fused where the
    setup compiles the model (torchtitan 9dec370 compiles each block with fullgraph=True, parallelize_llama.py
    297-306: no graph break, so CP's ring is traced into the block's graph), eager else; Transformer Engine's
    p2p ring (p2p_ring_bytes) at the elementwise class's eager rate where the profile has one (its kernels are
    plain copies and adds, run eagerly, and its merges each one compiled elementwise kernel of its own: the
    class's measured op is torch's relu-then-square on the H100, DyT on the B200), else the eager mean. 0
    without context parallelism or a rate, and for the all-to-all (its reorders not read). Each count is its own
    library's ring, the one the runtime's record runs by default (RuntimeFacts.cp_comm: "allgather" torch's
    context_parallel, "p2p" TE's AttnFuncWithCPAndKVP2P): the other exchange a --cp-comm names in that library
    (torch's alltoall rotation, TE's AttnFuncWithCPAndKVAllGather) runs other ops, not read: 0."""
    exchange = layer.context_parallel
    rates = profile.assumptions.get("membound_tbps")
    kind = comm_type(setup.training)
    if exchange is None or setup.training.context_parallel <= 1 or kind not in ("allgather", "p2p") \
            or kind != runtimes.of(setup.training).cp_comm or not isinstance(rates, dict):
        return 0.0
    compiled = kind == "allgather" and bool(setup.training.compile) and runtimes.of(setup.training).compiles_model
    tbps = rates.get("fused" if compiled else "eager")
    if kind == "p2p":
        tbps = (rates.get("by_class") or {}).get("elementwise", tbps)
    if not isinstance(tbps, (int, float)) or tbps <= 0:
        return 0.0
    exchange = as_exchanged(exchange, setup.training)
    if kind == "p2p":
        forward, backward = p2p_ring_bytes(exchange, "forward"), p2p_ring_bytes(exchange, "backward")
    else:
        forward, backward = ring_bytes(exchange, "forward", compiled), ring_bytes(exchange, "backward", compiled)
    return (forward * (2 if option == 1 else 1) + backward) / (tbps * 1e12) * 1e3


def buffer_bytes(exchange, kind: str, *, compiled: bool = False) -> tuple[int, int]:
    """(forward, backward) bytes the exchange's buffers hold while the attention runs, on the busiest rank;
    torch's all-gather ring: the peaks of its programs (cpring), eager or compiled."""
    cp, q, kv = exchange.ranks, exchange.q_bytes, exchange.kv_bytes
    if kind == "a2a":
        return 2 * (q + kv) + 2 * q, 2 * q + 3 * (q + kv)
    if kind == "p2p":
        return (cp - 1) * kv + cp * q + 2 * q, q + 4 * kv + q + kv
    return (cpring.peak(cpring.forward_program(cp, q, kv, compiled=compiled)),
            cpring.peak(cpring.backward_program(cp, q, kv, compiled=compiled, rerun=False, reuse_gather=False)))


def compiled_ring(training) -> bool:
    """Whether the ring runs traced into a compiled block (the setup compiles the model, the runtime compiles
    each block whole: torchtitan 9dec370's fullgraph block compile, parallelize_llama.py 297-306)."""
    return bool(training.compile) and runtimes.of(training).compiles_model


def extra_bytes(layer, setup: TrainSetup, option: int = 0) -> int:
    """What the exchange's buffers add to a layer's peak beyond its own transient (its MLP's
    backward, planner/profiler/analytic.py block_transient_bytes): the attention's forward buffers,
    or its backward ones beside the gradient flowing back (as large as the block's output), where
    either outgrows that transient; or, where the backward reuses the rerun's gathered K/V (`option` 1 in a
    compiled block: held_through_mlp_bytes), that buffer on top of the whole transient."""
    exchange = layer.context_parallel
    if exchange is None or setup.training.context_parallel <= 1:
        return 0
    exchanged = as_exchanged(exchange, setup.training)
    kind = comm_type(setup.training)
    forward, backward = buffer_bytes(exchanged, kind, compiled=compiled_ring(setup.training))
    held = held_through_mlp_bytes(exchanged, kind, option, setup.training)
    return max(0, forward - layer.transient_bytes, backward + layer.output_bytes - layer.transient_bytes, held)


def held_through_mlp_bytes(exchange, kind: str, option: int, training) -> int:
    """The gathered K/V (cp x the rank's K/V as exchanged) a compiled, fully recomputed block holds through its
    MLP's backward: the backward graph reruns the forward (attention, whose ring all-gathers K/V, then the MLP),
    runs the MLP's backward, then the attention's backward ring, and its one all-gather (the rerun's and the
    ring's merged, reuses_recomputed_gather) has its last use in that ring, so the buffer is alive beside the
    MLP's backward transient (torch 2.6.0, torchtitan 9dec370's block compiled whole on CPU: the backward graph's
    peak is reached in the MLP's backward with the gathered K/V held, docs/framework-facts.md §30). Eager, or
    without the rerun, the backward gathers its own inside the attention's backward: 0."""
    if kind != "allgather" or not reuses_recomputed_gather(option, training):
        return 0
    return exchange.ranks * exchange.kv_bytes


def ring_program(layer, option: int, setup: TrainSetup) -> tuple[int, ...]:
    """The all-gather ring's allocations in a layer's backward under `option` (1, "full": the rerun's
    forward ring first), as cpring codes them, on the busiest rank; () for the other exchanges (played as
    the bytes extra_bytes charges) or without context parallelism."""
    exchange = layer.context_parallel
    if exchange is None or setup.training.context_parallel <= 1 or comm_type(setup.training) != "allgather":
        return ()
    exchange = as_exchanged(exchange, setup.training)
    return cpring.backward_program(exchange.ranks, exchange.q_bytes, exchange.kv_bytes,
                                   compiled=compiled_ring(setup.training), rerun=option == 1,
                                   reuse_gather=reuses_recomputed_gather(option, setup.training))
