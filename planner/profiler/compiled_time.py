"""A block's time under torch.compile, from inductor's own fusion decisions.

Under torch.compile a block's matmuls and attention stay the extern kernels eager runs: inductor
lowers aten.mm/addmm to `extern_kernels.mm` unless max_autotune picks a template
(torch/_inductor/kernel/mm.py tuned_mm; config.py 514-520 max_autotune and max_autotune_gemm off by
default, torch 2.13.0 cf30153c), and scaled_dot_product_attention to the aten flash kernel (a
fallback, torch/_inductor/lowering.py; on CPU _scaled_dot_product_flash_attention_for_cpu). What
changes is everything between them: the pointwise and reduction ops are fused into kernels that
read each input once and write each output once, and the min-cut partition recomputes cheap ops
in the backward instead of saving them (planner/profiler/compiled.py). So a compiled pass is the
eager pass's matmul and attention kernels plus the bytes inductor's fused kernels move.

Those bytes are read off inductor itself: `inductor_kernels` hooks GraphLowering.codegen
(torch/_inductor/graph.py) and records each scheduler node after fusion with
`get_read_write_buffer_accesses` (torch/_inductor/scheduler.py 1680-1760: per buffer, the smaller
of the buffer's size and the elements the kernel's loops touch: inductor's own "best-case" byte
estimate, the one GraphLowering.count_bytes sums into metrics.num_bytes_accessed, graph.py 2643).
A node counts as memory-bound unless it is an extern matmul, attention (or the rng wrapper a
checkpointed sdpa runs in) or a view (view_as_complex, view_as_real, _conj move nothing).
torchtitan's rotary product is complex, which inductor does not generate code for on any device
("does not support code generation for complex operators", lowering.py 2634): the casts around
it are fused kernels and the complex multiply runs as aten's (a fallback node, counted).

`compiled_block_bytes` is that count as a formula, per token, for torchtitan's LLaMA block
(compiled.llama_block), each policy (none, op-sac, full) and pass, in units of the tensors
(T tokens, d bytes per element, widths h, kv and f, a heads; R the rotary table S x head_dim/2
complex64, read once per kernel whatever the batch): `scripts/compiled_time_block.py` compiles the
block on CPU at shapes whose units all differ, names each buffer access by its size, and checks the
formula against inductor's count (five grouped-query shapes agree, every policy, LLaMA 3 8B's widths
at 64 tokens among them: docs/published-runs.md §9.ctime); tests/test_compiled_time.py checks a fused norm and the compiled loss by hand.

CPU against CUDA. The fusion rules are the scheduler's (scheduler.py can_fuse, shared) and each
backend's can_fuse_vertical/horizontal. The C++ backend fuses a norm's row reduction with its
pointwise consumers by outer-loop fusion (codegen/cpp.py 5156-5186); Triton fuses the same pair as
one reduction kernel with its epilogue (codegen/simd.py 1998 can_fuse): one kernel either way, so
the same bytes under the once-per-buffer count. Where they differ: Triton splits a long reduction
(ir.py 1387 num_splits), here the norms' weight gradients summed over every token, into partial
sums written and read again (split x h x 4 bytes per norm, under 0.1% of a block's bytes at
LLaMA 3 8B's shape: not counted). The C++ backend fuses the two norms' weight-gradient reductions
horizontally, so the input they share is read once; whether Triton does was not checked (unfused:
T·h·d more a backward, 2% of it at 8B's shape). Padding (config.py 1465
shape_padding) pads mm operands on CUDA only; at the shapes published models use (multiples of
128) it pads nothing.

What the count leaves out: every weight gradient's accumulation into .grad runs outside the graph
(AccumulateGrad, eager: 3 x its bytes, as analytic_time.py charges it), and kept here.
Recorded for grouped-query attention only (1 < K/V heads < heads, LLaMA 3's): with one K/V head
(multi-query) the repeat of K and V to every head is a view (the repeated dimension merges with the
size-1 head dimension), and inductor then moves 2 T·kv·d more forward and 2 T·h·d + 2 T·kv·d more
backward without recompute (the script's second shape, 7 heads over 1); with K/V heads = heads there
is no repeat at all; neither is the formula's. Not checked, so not recorded either: tensor
parallelism, MoE, latent attention, q/k norms, eager attention, Q wider than hidden
(heads x head_dim != hidden), and a layer without rotary (SmolLM3's NoPE layers: the counts above hold
rotary's casts and complex product, R its table), as compiled_kept.py.

Context parallelism (cp > 1) is recorded: a rank's compiled block is the block at its own s / cp tokens
plus the ring's own kernels. torchtitan 9dec370 compiles each block with fullgraph=True and the ring is
traced into its one graph, no graph break (torch 2.6.0, docs/framework-facts.md §30), so the rest of the
block runs compiled at every CP. What the ring adds to inductor's kernels was read as the difference of
the same checkpointed block compiled with and without `context_parallel` at the same tokens a rank
(scripts/cp_ring_bytes.py, §47) and is charged by the cost model (contextparallel.COMPILED_RING_BYTES,
ring_membound_ms); the remainder, by that construction, is this formula at T = s / cp tokens, the
rotary table as `context_parallel` shards it, s / cp rows (`_units`; §30). The ring's flash calls are
eager's (`passes`: analytic_cp.ring_calls, one a step at s / cp's rate), its exchanges the cost model's.
docs/framework-facts.md §79.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

from planner.models.archs import GPU, Arch
from planner.profiler import analytic_time, formulas
from planner.profiler.formulas import Shape, kv_width, q_width
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import Kernel, Work, roofline_ms, work
from planner.schema import OPTION_FULL, OPTION_NONE, CompiledTime

OPTION_OP_SAC = "op-sac"  # planner/profiler/opsac.py's name
POLICIES = (OPTION_NONE, OPTION_OP_SAC, OPTION_FULL)

# ---------------------------------------------------------------- reading inductor's kernels

# extern nodes that are not memory-bound ops: the matmuls, attention (with the rng wrappers a
# checkpointed sdpa runs under) and views
_NOT_MEMORY_BOUND = ("aten.mm", "aten.addmm", "aten.bmm", "scaled_dot_product", "rng_state", "view_as_complex",
                     "view_as_real", "aten._conj", "_c10d_functional")  # collectives: charged as communication


@dataclass(frozen=True)
class KernelBytes:
    """One scheduler node after fusion: its kind (SchedulerNode, FusedSchedulerNode, ...,
    ExternKernelSchedulerNode), the aten op of an extern one, and the bytes it reads and writes
    per buffer (inductor's estimate)."""

    name: str
    kind: str
    op: str
    reads: dict[str, int]
    writes: dict[str, int]

    @property
    def memory_bound(self) -> bool:
        if self.kind != "ExternKernelSchedulerNode":
            return True
        return bool(self.reads or self.writes) and not any(part in self.op for part in _NOT_MEMORY_BOUND)

    @property
    def num_bytes(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())


def memory_bound_bytes(kernels: list[KernelBytes]) -> int:
    return sum(kernel.num_bytes for kernel in kernels if kernel.memory_bound)


@contextlib.contextmanager
def inductor_kernels():
    """Record, per graph inductor generates code for while inside, its scheduler's nodes after
    fusion (a list per graph, in the order compiled: a forward, then its backward). Inductor's
    caches are turned off inside, so each graph is generated (and read) anew."""
    import torch
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    graphs: list[list[KernelBytes]] = []
    original = GraphLowering.codegen

    def codegen(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        graphs.append([_kernel(node) for node in self.scheduler.nodes])
        return out

    GraphLowering.codegen = codegen
    try:
        with config.patch(force_disable_caches=True):
            torch._dynamo.reset()
            yield graphs
    finally:
        GraphLowering.codegen = original


def _kernel(node) -> KernelBytes:
    """A scheduler node as KernelBytes. torch 2.6.0 (the release nearest the torchtitan 8B runs' torch,
    docs/framework-facts.md §23) has no get_read_write_buffer_accesses: its get_read_write_buffers_sizes is
    the same estimate summed over the node's buffers (scheduler.py 558-660 there), read as one entry `all`;
    and its extern matmuls carry no op_overload, only the wrapper's name (`extern_kernels.mm`), read as aten's."""
    inner = getattr(node, "node", None)
    op = getattr(inner, "op_overload", None)
    op = str(op) if op is not None else str(getattr(inner, "python_kernel_name", None)).replace("extern_kernels.", "aten.")
    if not hasattr(node, "get_read_write_buffer_accesses"):
        return KernelBytes(name=node.get_name(), kind=type(node).__name__, op=op,
                           reads={"all": node.get_read_write_buffers_sizes()}, writes={})
    return KernelBytes(name=node.get_name(), kind=type(node).__name__, op=op,
                       reads=dict(node.get_read_write_buffer_accesses(include_reads=True, include_writes=False)),
                       writes=dict(node.get_read_write_buffer_accesses(include_reads=False, include_writes=True)))


def compile_and_read(fn, inputs) -> list[list[KernelBytes]]:
    """Compile `fn(*inputs)` with inductor (fullgraph), run its forward and backward once on these
    (real, small) tensors, and return each generated graph's kernels: [forward, backward]."""
    import torch

    with inductor_kernels() as graphs:
        torch.compile(fn, backend="inductor", fullgraph=True)(*inputs).sum().backward()
    return list(graphs)


def compiled_llama_block(*, batch: int, seq: int, hidden: int, heads: int, kv_heads: int, ffn: int,
                         policy: str) -> list[list[KernelBytes]]:
    """torchtitan's LLaMA block (compiled.llama_block) compiled with inductor under `policy`
    (POLICIES: no checkpoint, torchtitan's op-level selective checkpoint, the whole block
    checkpointed, each as torchtitan wraps it), on CPU: [forward kernels, backward kernels]."""
    from torch.utils.checkpoint import checkpoint

    from planner.profiler.compiled import llama_block, llama_block_inputs

    block = functools.partial(llama_block, heads=heads, kv_heads=kv_heads)
    inputs = llama_block_inputs(batch=batch, seq=seq, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn)
    if policy == OPTION_NONE:
        fn = block
    elif policy == OPTION_FULL:
        def fn(*args):
            return checkpoint(block, *args, use_reentrant=False)
    elif policy == OPTION_OP_SAC:
        def fn(*args):
            return checkpoint(block, *args, use_reentrant=False, context_fn=_op_sac_context)
    else:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    return compile_and_read(fn, inputs)


def _op_sac_context():
    """torchtitan's op-level policy (b5bcd76c torchtitan/distributed/activation_checkpoint.py
    _get_custom_policy; 9dec370 parallelize_llama.py 214-260): the save list's ops saved, of the
    mms every second one recomputed, counted per checkpointed call; the CPU flash op stands in for
    CUDA's (compiled.py's docstring)."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default}
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        saved = func in save and not (func == aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


# ---------------------------------------------------------------- the formula


def _units(arch: Arch, shape: Shape) -> dict[str, int]:
    """The tensors' bytes the formula counts in (the module's docstring)."""
    tokens, d, h = shape.tokens, shape.d, arch.hidden_size
    kv, f, heads = kv_width(arch, shape), arch.intermediate_size, arch.num_heads
    return {"Thd": tokens * h * d, "Tkvd": tokens * kv * d, "Tfd": tokens * f * d, "Th4": 4 * tokens * h,
            "Tkv4": 4 * tokens * kv, "T4": 4 * tokens, "Ta4": 4 * tokens * heads, "hd": h * d,
            "R": 4 * shape.seq_len // shape.cp * arch.head_size}  # the table context_parallel shards: s / cp rows


# Per policy, (forward, backward): how many accesses of each unit inductor's memory-bound kernels
# make, read off the compiled block by scripts/compiled_time_block.py (torch 2.13.0 cf30153c, CPU),
# the same at both its shapes. Thd counts the Q-wide bf16 tensors too and Th4 the fp32 Q (rotary's
# casts: Q is hidden wide where this is recorded). Forward, every policy: the two norms (x and the
# weight read, the output written; without recompute also 1/rms, fp32), Q and K cast to fp32 for the
# complex rotary product and back (K and V repeated to every head on the way), the residual add
# folded into the MLP norm's kernel and the output's, SiLU and the product in one kernel (the gate and
# up read, the product written). The backward reruns what the partition recomputes (the norms'
# casts, rotary, SiLU; under a checkpoint the whole forward's memory-bound ops).
BYTES: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    OPTION_NONE: ({"Thd": 13, "Th4": 4, "Tkvd": 2, "Tkv4": 4, "Tfd": 3, "T4": 2, "hd": 2, "R": 2},
                  {"Thd": 23, "Th4": 4, "Tkvd": 2, "Tkv4": 4, "Tfd": 5, "T4": 4, "Ta4": 2, "hd": 4, "R": 4}),
    OPTION_OP_SAC: ({"Thd": 13, "Th4": 4, "Tkvd": 2, "Tkv4": 4, "Tfd": 3, "hd": 2, "R": 2},
                    {"Thd": 31, "Th4": 8, "Tkvd": 4, "Tkv4": 8, "Tfd": 6, "T4": 6, "Ta4": 2, "hd": 6, "R": 6}),
    OPTION_FULL: ({"Thd": 13, "Th4": 4, "Tkvd": 2, "Tkv4": 4, "Tfd": 3, "hd": 2, "R": 2},
                  {"Thd": 32, "Th4": 8, "Tkvd": 4, "Tkv4": 8, "Tfd": 6, "T4": 6, "Ta4": 2, "hd": 6, "R": 6}),
}


def offers_compiled_time(arch: Arch, shape: Shape, *, moe: bool) -> bool:
    """Where the formula was checked against inductor (the module's docstring)."""
    return (arch.style == "llama" and not moe and not arch.mla and not arch.qk_norm and not arch.sliding_window
            and arch.rotates and shape.attention == "flash" and shape.tp == 1 and q_width(arch, shape) == arch.hidden_size
            and 1 < arch.num_kv_heads < arch.num_heads)


def compiled_block_bytes(arch: Arch, shape: Shape, *, moe: bool) -> dict[str, tuple[int, int]]:
    """Per policy (POLICIES), the (forward, backward) memory-bound bytes of the compiled block per
    microbatch; {} where not checked."""
    if not offers_compiled_time(arch, shape, moe=moe):
        return {}
    units = _units(arch, shape)
    return {policy: tuple(sum(count * units[unit] for unit, count in table.items()) for table in tables)
            for policy, tables in BYTES.items()}


# torchtitan's loss compiled (cross_entropy over pred.float(); planner/profiler/inductor_buffers.py
# reads its wrappers), as inductor counts its kernels on CPU at 64 tokens x 128 vocab: the forward's
# max/log-sum-exp reads the bf16 logits and writes two fp32 per token, nll_loss's gather reads them
# again (an indirect load: inductor counts the whole buffer, scheduler.py 1700), 28 B per token with
# the int64 labels; the backward reads them once and writes their bf16 gradient, 16 B per token; 40 B
# of scalars. Eager moves 2d + 32 B per logit (analytic.loss_ms).
LOSS_LOGIT_PASSES, LOSS_TOKEN_BYTES, LOSS_SCALAR_BYTES = 4, 28 + 16, 40


def compiled_loss_bytes(tokens: int, logits_bytes: int) -> int:
    """The compiled loss's forward and backward bytes over `tokens` tokens' bf16 logits."""
    return LOSS_LOGIT_PASSES * logits_bytes + LOSS_TOKEN_BYTES * tokens + LOSS_SCALAR_BYTES


def compiled_loss_ms(arch: Arch, shape: Shape, gpu: GPU, logits_bytes: int) -> float | None:
    """The compiled loss at the rate fused kernels reach (membound.py); None under TP (torchtitan's
    loss_parallel is not the loss read here) or for other dtypes."""
    if shape.tp != 1 or shape.dtype != "bfloat16":
        return None
    return membound_ms(compiled_loss_bytes(shape.tokens, logits_bytes), gpu, "fused")


# ---------------------------------------------------------------- the times


def _rerun_kernels(arch: Arch, shape: Shape, policy: str, recompute: Work) -> list[Kernel]:
    """The matmul and attention kernels the compiled backward reruns under `policy`: a whole-block
    checkpoint's are eager checkpoint's (analytic_time._recompute: every forward kernel but the down
    projection, whose output no backward op reads); torchtitan's op-level policy reruns wk, wo and w3
    (opsac.py; the partition reruns them, read off the compiled graphs)."""
    if policy == OPTION_FULL:
        return [kernel for kernel, count in recompute.kernels for _ in range(count)]
    tokens, h = shape.tokens, arch.hidden_size
    q, kv, f = q_width(arch, shape), kv_width(arch, shape), arch.intermediate_size
    return [Kernel("matmul", flops) for flops in (2 * tokens * h * kv, 2 * tokens * q * h, 2 * tokens * h * f)]


def compiled_time(arch: Arch, shape: Shape, gpu: GPU, passes: tuple[Work, Work, Work], *,
                  moe: bool) -> CompiledTime | None:
    """The block's passes under torch.compile: eager's kernels (`passes`: analytic_time.block_work's
    forward, backward and checkpoint rerun) with the compiled memory-bound bytes; the weight
    gradients' accumulation (outside the graph) as eager's. An option's recompute: its rerun kernels
    and the bytes its compiled passes move beyond no recompute's. None where not checked."""
    found = compiled_block_bytes(arch, shape, moe=moe)
    if not found:
        return None
    forward, backward, recompute = passes
    accumulate = analytic_time.ACCUMULATE * formulas.block_params(arch, shape, moe=moe) * shape.d
    fwd_none, bwd_none = found[OPTION_NONE]
    fwd_ms = roofline_ms(Work(forward.flops, fwd_none, forward.kernels, fwd_none), gpu)
    bwd_ms = roofline_ms(Work(backward.flops, bwd_none + accumulate, backward.kernels, bwd_none,
                              (("elementwise", accumulate),)), gpu)  # .grad accumulation: eager adds
    rerun = {}
    for policy in (OPTION_FULL, OPTION_OP_SAC):
        fwd, bwd = found[policy]
        kernels = _rerun_kernels(arch, shape, policy, recompute)
        extra = max(0, fwd + bwd - fwd_none - bwd_none)
        rerun[policy] = roofline_ms(work(sum(kernel.flops for kernel in kernels), extra, kernels, fused_bytes=extra), gpu)
    return CompiledTime(fwd_ms=fwd_ms, bwd_ms=bwd_ms, recompute_ms=rerun)


# ---------------------------------------------------------------- --compile


def timed_layers(profile):
    """(the profile with each layer's passes timed as compiled where it recorded them, the number
    of layers changed). A layer's Float8 record moves by the same differences (its times are the
    eager passes' with the linears in FP8); recompute options the record does not time keep theirs."""
    layers, changed = [], 0
    for layer in profile.layers:
        if layer.compiled_time is None:
            layers.append(layer)
            continue
        changed += 1
        layers.append(_timed(layer, layer.compiled_time))
    return profile.model_copy(update={"layers": layers}), changed


def _timed(layer, timed: CompiledTime):
    eager_rerun = {option.name: option.recompute_ms for option in layer.recompute_options}
    if layer.recompute_ms is not None:
        eager_rerun.setdefault(OPTION_FULL, layer.recompute_ms)
    saved = {name: eager_rerun[name] - ms for name, ms in timed.recompute_ms.items() if name in eager_rerun}
    options = [option.model_copy(update={"recompute_ms": timed.recompute_ms[option.name]})
               if option.name in timed.recompute_ms else option for option in layer.recompute_options]
    update = {"fwd_ms": timed.fwd_ms, "bwd_ms": timed.bwd_ms, "fwd_ms_min": timed.fwd_ms, "fwd_ms_max": timed.fwd_ms,
              "bwd_ms_min": timed.bwd_ms, "bwd_ms_max": timed.bwd_ms, "recompute_options": options}
    if OPTION_FULL in timed.recompute_ms:
        update["recompute_ms"] = timed.recompute_ms[OPTION_FULL]
    if layer.float8 is not None:
        fp8 = layer.float8
        update["float8"] = fp8.model_copy(update={
            "fwd_ms": max(0.0, fp8.fwd_ms - (layer.fwd_ms - timed.fwd_ms)),
            "bwd_ms": max(0.0, fp8.bwd_ms - (layer.bwd_ms - timed.bwd_ms)),
            "recompute_ms": {name: max(0.0, ms - saved.get(name, 0.0)) for name, ms in fp8.recompute_ms.items()}})
    return layer.model_copy(update=update)
