"""Float8 linears as torchtitan runs them (torchao's Float8Linear, dynamic tensorwise scaling): which
linears are converted, and a layer's work with their GEMMs in float8 (roofline "matmul-fp8", the
GPU's FP8 peak on the same efficiency curve) plus the bytes of the casts.

Which linears (torchtitan): every nn.Linear but the LM head. 9dec370 (the December 2024 benchmarks)
`torchtitan/float8.py` converts with `module_filter_fn=lambda mod, fqn: fqn != "output"`; e7c0cae
(June 2025) `torchtitan/components/quantization/utils.py` `module_filter_fn` converts an nn.Linear
whose weight's two dims are both multiples of 16 and whose FQN contains none of
`float8.filter_fqns` (`llama3_8b.toml` there: ["output"]). A block's Q/K/V/O and gate/up/down are
converted; the embedding is no linear; the head stays bf16.

What a converted linear runs (torchao v0.11.0 f34b473e `torchao/float8/float8_linear.py`,
`matmul_with_hp_or_float8_args` and `Float8Linear.forward`; tensorwise, torchtitan's default recipe):
- forward: the weight cast to float8 (e4m3) outside the autograd function (`_cast_weight_to_float8_t`;
  under FSDP2's float8 all-gather the gathered weight already is float8 and is not cast), the input
  cast (e4m3), one float8 GEMM; it saves the bf16 input and the float8 weight for backward;
- backward: grad_output cast (e5m2) and the saved float8 weight for the input-grad GEMM; grad_output
  and the saved bf16 input cast again for the weight-grad GEMM: two float8 GEMMs. The two casts of
  grad_output are one tensor cast twice with one scale (tensorwise); counted once (compiled, CSE).
  torchao eab345c (torchtitan 9dec370's benchmarks) saved the float8 input instead
  (`manual_float8_matmul_with_args_in_float8`, float8_linear.py 46-51): no recast; the record's
  `bwd_input_recast_ms` is the recast's part of the backward, left out where the runtime record's
  float8_saves_input says so.
Each cast is `hp_tensor_to_float8_dynamic` (`float8_scaling_utils.py`): amax (max(abs(x))) then
scale and cast. torchtitan runs Float8 compiled ("Float8 experimental is intended to be ran under
torch.compile", 9dec370 `torchtitan/float8.py`), where the amax is one read and the cast one read and
one write: CAST_BYTES = 2 + 2 + 1 bytes per bf16 element. (Eager would move about 33: abs, max, an
fp32 copy, multiply, clamp, cast.)

Compiled, a tensor's casts are one: each Float8Linear casts its own input, but Q, K and V read one
tensor (attention_norm's output), w1 and w3 another (ffn_norm's), and a tensorwise cast of one tensor
is the same amax, scale and cast each time. torchtitan compiles each TransformerBlock whole
(fullgraph), so AOTAutograd traces the block's forward and backward as one joint graph, and its
partitioner first runs common-subexpression elimination over that graph (torch 2.13.0 cf30153
`torch/_functorch/partitioners.py` 3765-3767: `if config.cse: fx_graph_cse(fx_g)`;
`torch/_functorch/config.py` 56 `cse = True`; `torch/_functorch/compile_utils.py` 51 `fx_graph_cse`
merges nodes of the same target and arguments). The record counts each distinct input tensor's cast
once (Linear.source) in the forward, and once again in the backward where the weight-grad GEMM recasts
the saved input (the joint graph's CSE may merge that with the forward's cast too, the partitioner then
saving the float8 copy; not counted off). Each linear's grad_output is its own tensor: cast once each.
The record is the compiled one; eager Float8 (no CSE, about 33 B a cast) is not modelled apart.
Under TP with SP the norm's output is cast before its all-gather, once per module, on the rank's
sequence shard (T/t rows), and saved in float8 (runtime_titan.py's `tp_gathers_float8` source:
torchao float8_tensor_parallel.py PrepareFloat8ModuleInput; eab345c float8_linear.py 51 saves
input_fp8): Linear.shard_rows, no backward recast of that input. The row-parallel wo and w2
(Float8RowwiseParallel) cast their input in the plan's `_prepare_input_fn` (T rows of their local
width, as counted) and the linear saves that float8 tensor (eab345c `manual_float8_matmul_with_args_
in_float8` saves input_fp8; v0.11.0 `matmul_with_hp_or_float8_args` saves its argument, float8 here,
and does not cast it again): no backward recast. Their `_prepare_output_fn` applies
NoopFwToFloat8BwDynamic after the reduce-scatter to Shard(1), so the output gradient is cast on
the sequence shard, T/t rows x h, before the adjoint all-gather (gathered in float8, planner/cost/
comm.py gathers_float8), and the linear's backward takes it as it is (tensor_already_casted_to_fp8):
Linear.saves_float8, grad_rows (eab345c `float8_tensor_parallel.py` 96-133,
`float8_scaling_utils.py` 246-275).

The analytic profile writes the record for dense blocks (block_linears); its MoE and latent-attention
(MLA) blocks get none and run bf16 under --float8 (torchtitan converts experts only under its
separate grouped-mm setting). The fake profile records the nn.Linear calls a layer makes
(module_linears: a Hugging Face routed expert with the tokens it received, a router whose dims are
multiples of 16), which is what torchao's module swap would convert in that code. Activations
are taken as 16-bit (torchtitan trains under FSDP2's bf16 mixed precision). Under TP, torchtitan's
Float8 colwise/rowwise plans gather float8 inputs; the tensor-parallel collectives stay charged at
bf16.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from planner.profiler import opsac
from planner.profiler.formulas import Shape, kv_width, q_width
from planner.profiler.opsac import OPTION_OP_SAC
from planner.profiler.roofline import Kernel, Work, work
from planner.schema import OPTION_FULL, Float8Linears
from planner.schema.profile import Float8Cast

CAST_BYTES = 5  # amax read (2) + cast read (2) + float8 write (1), per bf16 element, fused
FP8_ALIGN = 16  # torchtitan converts a linear whose weight's dims are multiples of 16 (tensor cores)
HEAD_FQNS = ("output", "lm_head")  # the LM head (torchtitan's `output`, Hugging Face's `lm_head`): left in bf16


@dataclass(frozen=True)
class Linear:
    """One linear of a layer on one device: `tokens` rows, `k` in-features, `n` out-features (both
    as the device holds them, /t under TP); `full_k`, `full_n` the whole weight's (the filter's)."""

    fqn: str
    tokens: int
    k: int
    n: int
    full_k: int
    full_n: int
    reads: str = ""  # the tensor its input is, where linears share one (Q, K, V: the norm's output); "": its own
    # under TP with SP, torchtitan's Float8 plan casts the norm's sequence shard before its all-gather
    # (PrepareFloat8ModuleInput) and the float8 input is what is saved: `shard_rows` rows cast, none again
    # in the backward (0: `tokens` rows, cast in the linear, the bf16 input saved and recast)
    shard_rows: int = 0
    # a row-parallel linear under that plan (Float8RowwiseParallel): its input cast in the plan's
    # _prepare_input_fn and saved in float8 (no backward recast), and its output gradient cast on the
    # sequence shard before the reduce-scatter's adjoint all-gather: `grad_rows` rows (0: `tokens`)
    saves_float8: bool = False
    grad_rows: int = 0

    @property
    def source(self) -> str:
        return self.reads or self.fqn

    @property
    def flops(self) -> int:
        return 2 * self.tokens * self.k * self.n

    @property
    def weight_elements(self) -> int:
        return self.k * self.n


def converted(linears: list[Linear], filter_fqns: tuple[str, ...] = HEAD_FQNS) -> list[Linear]:
    """The linears torchtitan's filter converts: weight dims multiples of 16, FQN matching none
    of `filter_fqns`."""
    return [linear for linear in linears if linear.full_k % FP8_ALIGN == 0 and linear.full_n % FP8_ALIGN == 0
            and not any(name in linear.fqn for name in filter_fqns)]


def block_linears(arch, shape: Shape, prefix: str) -> list[Linear]:
    """A dense block's linears, in the order it runs them (torchtitan's LLaMA: wq, wk, wv, wo, w1,
    w3, w2; a GPT block: the fused qkv, its projection, fc, the MLP's projection)."""
    T, h, t = shape.tokens, arch.hidden_size, shape.tp
    q, kv, f = q_width(arch, shape), kv_width(arch, shape), arch.intermediate_size // t
    fq, fkv = arch.num_heads * arch.head_size, arch.num_kv_heads * arch.head_size
    if arch.style == "gpt":
        return [Linear(f"{prefix}.attention.qkv", T, h, q + 2 * kv, h, fq + 2 * fkv),
                Linear(f"{prefix}.attention.wo", T, q, h, fq, h),
                Linear(f"{prefix}.feed_forward.fc", T, h, f, h, arch.intermediate_size),
                Linear(f"{prefix}.feed_forward.proj", T, f, h, arch.intermediate_size, h)]
    norm, ffn_norm = f"{prefix}.attention_norm", f"{prefix}.ffn_norm"  # what Q/K/V and w1/w3 read
    shard = T // shape.sp_div if shape.tp > 1 and shape.sp else 0
    rowwise = {"saves_float8": True, "grad_rows": shard} if shard else {}  # wo, w2 (Float8RowwiseParallel)
    return [Linear(f"{prefix}.attention.wq", T, h, q, h, fq, norm, shard),
            Linear(f"{prefix}.attention.wk", T, h, kv, h, fkv, norm, shard),
            Linear(f"{prefix}.attention.wv", T, h, kv, h, fkv, norm, shard),
            Linear(f"{prefix}.attention.wo", T, q, h, fq, h, **rowwise),
            *(Linear(f"{prefix}.feed_forward.{name}", T, h, f, h, arch.intermediate_size, ffn_norm, shard)
              for name in ("w1", "w3")),
            Linear(f"{prefix}.feed_forward.w2", T, f, h, arch.intermediate_size, h, **rowwise)]


def in_float8(done: Work, linears: list[Linear], *, gemms: int, own, shared) -> tuple[Work, int]:
    """`done` with each of `linears`' `gemms` bf16 GEMMs (1 forward, 2 backward) run in float8,
    plus the casts' bytes: `own(linear)` for each linear, `shared(linear)` (its input's cast) once
    per distinct input tensor (Linear.source: compiled, CSE; the module's
    docstring); a linear whose GEMMs `done` does not run (a checkpoint's rerun stops before the last
    one) is left out. Also returns the weight elements of the linears converted (what the pass would
    cast of weights)."""
    kernels = Counter(dict(done.kernels))
    added, weights, sources = 0, 0, set()
    for linear in linears:
        bf16 = Kernel("matmul", linear.flops)
        if kernels[bf16] < gemms:
            continue
        kernels[bf16] -= gemms
        kernels[Kernel("matmul-fp8", linear.flops)] += gemms
        added += own(linear)
        if linear.source not in sources:
            sources.add(linear.source)
            added += shared(linear)
        weights += linear.weight_elements
    return work(done.flops, done.bytes + added, list((+kernels).elements()),
                fused_bytes=done.fused_bytes + added, classed=done.classed), weights  # the casts: compiled kernels (the module's docstring)


def forward(done: Work, linears: list[Linear]) -> tuple[Work, int]:
    """A forward (or a rerun of one): each distinct input cast once, one float8 GEMM per linear; the
    weight elements to cast beside (weight_cast_ms)."""
    return in_float8(done, linears, gemms=1, own=lambda linear: 0,
                     shared=lambda linear: CAST_BYTES * (linear.shard_rows or linear.tokens) * linear.k)


def backward(done: Work, linears: list[Linear], *, saved_float8: bool = False) -> Work:
    """A backward: each linear's grad_output cast (once: tensorwise, one scale for both GEMMs; a
    row-parallel linear's on its sequence shard, Linear.grad_rows) and each distinct saved bf16
    input cast again (none where the float8 input was saved: Linear.shard_rows, saves_float8, or
    every linear under `saved_float8`, torchao eab345c); two float8 GEMMs each. The float8 weight is
    the forward's, saved."""
    return in_float8(done, linears, gemms=2, own=lambda linear: CAST_BYTES * (linear.grad_rows or linear.tokens) * linear.n,
                     shared=lambda linear: 0 if saved_float8 or linear.shard_rows or linear.saves_float8
                     else CAST_BYTES * linear.tokens * linear.k)[0]


# Transformer Engine's FP8 linears (Megatron-core's TE spec; Megatron-Bridge 25.11's recipe: tensorwise
# current scaling, docs/framework-facts.md §17), read from TransformerEngine v2.9 (70f53666, the version the 25.11
# recipes pin: §46, §99, §113):
# - LayerNormLinear (linear_qkv, linear_fc1): the norm's kernel writes its bf16 output and its amax at
#   once (`rmsnorm_fwd`/`layernorm_fwd`, Impl::FUSED_NORM_AMAX_FP8, transformer_engine/pytorch/csrc/
#   extensions/normalization.cpp), then `quantize_with_amax` reads it and writes float8: TE_NORM_CAST_BYTES
#   = 2 + 1, no amax pass;
# - every linear quantizes its input once in the forward, for both GEMMs that read it
#   (`input_quantizer.set_usage(rowwise=True, columnwise=backward_needs_input)`, module/linear.py 216-227 and
#   module/layernorm_linear.py `forward`; backward_needs_input = is_grad_enabled and weight.requires_grad, 135)
#   and saves the float8 input, its row-wise data dropped (`update_usage(rowwise_usage=False,
#   columnwise_usage=True)`, 376-385): the backward does not cast it again;
# - grad_output: one cast per linear (CAST_BYTES), as torchao's, row-wise for the dgrad GEMM and column-wise for
#   the wgrad GEMM (`grad_output_quantizer.set_usage(rowwise=True, columnwise=True)`, linear.py 566-570);
# - the column-wise copy (transpose_bytes): on Hopper, whose FP8 GEMMs take only the TN layout
#   (`is_non_tn_fp8_gemm_supported()` false below compute capability 10, utils.py 490-495), the quantize writes a
#   transposed FP8 copy beside the row-wise one (cast-transpose), 1 B an element more, for every input quantized
#   with column-wise usage and every grad_output; on Blackwell (sm100) the column-wise usage reads the row-wise
#   data itself (the GEMM takes the other layout): nothing more is written. What the forward keeps is 1 B an
#   element either way (the transpose on Hopper, the data on Blackwell): planner/cost/te_kept.py.
TE_NORM_CAST_BYTES = 3
# under TE's delayed scaling (planner/profiler/te_delayed.py's docstring): a cast's bf16 read and FP8 write, its amax
# written by the same kernel; the norm writing FP8 (1 B) where the bf16 block's norm writes 2; nvte_transpose after it
DELAYED_CAST_BYTES, DELAYED_NORM_BYTES, DELAYED_NORM_TRANSPOSE_BYTES = 3, -1, 2
TE_NORM_LINEARS = ("linear_qkv", "linear_fc1", "attention.qkv", "feed_forward.fc")  # a GPT block's (te_linears)
# the GPUs whose FP8 GEMMs take only the TN layout (Hopper: TE v2.9 utils.py 490-495 `is_non_tn_fp8_gemm_supported`
# true on sm 10.x, 11.x, 13+ only): planner/cost/bridgesettings.py TN_ONLY_GPUS, which the profiler may not import
# (tests/test_te_moe_float8.py holds them equal)
TN_ONLY_GPUS = ("h100-sxm", "h100-pcie", "h100-96g", "h200", "gh200", "gh200-144g")


def transpose_bytes(gpu) -> int:
    """The column-wise copy a TE quantize writes beside the row-wise one, per element: 1 B where the GPU's FP8
    GEMMs take only TN layouts (Hopper), else 0 (Blackwell: the column-wise usage reads the row-wise data). Shared
    by the dense record (te_forward, te_backward) and the MoE record (te_moe_float8.py)."""
    return 1 if gpu.name in TN_ONLY_GPUS else 0


def te_input_bytes(linear: Linear, gpu, *, columnwise: bool = True, delayed: bool = False) -> int:
    """A TE linear's input quantize, bytes: from the norm with its amax (LayerNormLinear: TE_NORM_CAST_BYTES) or
    an amax pass and a cast (CAST_BYTES), each element, plus the Hopper transpose where the column-wise usage is
    asked for (`columnwise`: a forward under grad; not in a checkpoint's first forward, run under no_grad).
    `delayed`: as TE's delayed scaling quantizes (planner/profiler/te_delayed.py): a LayerNormLinear's the norm's
    FP8 output against its bf16 one (DELAYED_NORM_BYTES) and its transpose where column-wise on Hopper
    (DELAYED_NORM_TRANSPOSE_BYTES); any other's the cast alone (DELAYED_CAST_BYTES) with its Hopper transpose."""
    transpose = transpose_bytes(gpu) if columnwise else 0
    if delayed and linear.fqn.endswith(TE_NORM_LINEARS):
        per = DELAYED_NORM_BYTES + (DELAYED_NORM_TRANSPOSE_BYTES if transpose else 0)
    elif delayed:
        per = DELAYED_CAST_BYTES + transpose
    else:
        per = (TE_NORM_CAST_BYTES if linear.fqn.endswith(TE_NORM_LINEARS) else CAST_BYTES) + transpose
    return per * linear.tokens * linear.k


def te_grad_bytes(linear: Linear, gpu, *, delayed: bool = False) -> int:
    """A TE linear's grad_output quantize, bytes: amax and cast (CAST_BYTES; `delayed`: the cast alone,
    DELAYED_CAST_BYTES), row-wise and, on Hopper, the transpose for the wgrad GEMM."""
    return ((DELAYED_CAST_BYTES if delayed else CAST_BYTES) + transpose_bytes(gpu)) * linear.tokens * linear.n


def te_forward(done: Work, linears: list[Linear], gpu, *, delayed: bool = False) -> tuple[Work, int]:
    """A TE forward (or rerun, which runs under grad): linear_qkv's and linear_fc1's inputs cast from the norm's
    output with its amax (TE_NORM_CAST_BYTES), the others' at CAST_BYTES, each with its Hopper transpose; one
    float8 GEMM each (an expert's split its own rows). `delayed`: the casts as delayed scaling runs them."""
    return in_float8(done, linears, gemms=1, own=lambda linear: 0,
                     shared=lambda linear: te_input_bytes(linear, gpu, delayed=delayed))


def te_backward(done: Work, linears: list[Linear], gpu, *, delayed: bool = False) -> Work:
    """A TE backward: each grad_output cast once for both GEMMs (te_grad_bytes); the saved float8 input is not
    cast again."""
    return in_float8(done, linears, gemms=2, own=lambda linear: te_grad_bytes(linear, gpu, delayed=delayed),
                     shared=lambda linear: 0)[0]


def cast_transient_bytes(linears: list[Linear]) -> int:
    """The casts alive at once beyond the bf16 layer's: at the largest linear's weight-grad GEMM,
    grad_output's and the input's float8 copies (1 B per element)."""
    return max((linear.tokens * (linear.n + linear.k) for linear in linears), default=0)


def weight_cast_bytes(elements: int, *, delayed: bool = False) -> int:
    """A weight cast's bytes: amax and cast (CAST_BYTES); under TE's delayed scaling the cast alone."""
    return (DELAYED_CAST_BYTES if delayed else CAST_BYTES) * elements


# torchtitan's op-level SAC reruns every second mm (planner/profiler/opsac.py): wk, wo and w3; the
# casts are traced as other ops and rerun, the amax (`aten.max`) is in its save list at e7c0cae
# (`torchtitan/models/llama3/parallelize_llama.py` 218-227) but counted here with the cast
OP_SAC_RERUN = ("attention.wk", "attention.wo", "feed_forward.w3")


def block_record(arch, shape: Shape, gpu, passes: tuple[Work, Work, Work], *, prefix: str,
                 op_sac: bool) -> Float8Linears | None:
    """A dense block's Float8 record from its bf16 (forward, backward, full-recompute) work; None
    where no linear converts or the GPU has no FP8 tensor cores. The op-SAC rerun is the bf16 one as
    opsac.op_sac_option times it (its mms and every memory-bound op of the forward) with wk's, wo's and
    w3's GEMMs in float8 and their inputs cast: the same work less the GEMMs' difference, so that
    compiled_time's eager-to-compiled saving of the option (its memory-bound bytes) applies to it as to
    the bf16 rerun."""
    linears = converted(block_linears(arch, shape, prefix))
    reruns, rerun_linears = {OPTION_FULL: passes[2]}, {}
    if op_sac:
        kernels = opsac.rerun_kernels(arch, shape, moe=False)
        reruns[OPTION_OP_SAC] = work(sum(kernel.flops for kernel in kernels), passes[0].bytes, kernels,
                                     classed=passes[0].classed)
        rerun_linears[OPTION_OP_SAC] = [linear for linear in linears if linear.fqn.endswith(OP_SAC_RERUN)]
    return record(linears, gpu, passes[0], passes[1], reruns, rerun_linears=rerun_linears)


def record(linears: list[Linear], gpu, fwd: Work, bwd: Work, reruns: dict[str, Work], *,
           te: bool = False, rerun_linears: dict[str, list[Linear]] | None = None,
           delayed: bool = False) -> Float8Linears | None:
    """A layer's Float8 record from its bf16 work: forward and backward, and each recompute
    option's rerun by name, with the converted `linears`' GEMMs in float8 (the module's docstring;
    `te`: their casts as Transformer Engine runs them, te_forward and te_backward); `rerun_linears`
    names, for a rerun that runs only some of them (op-SAC's), those it runs (a GEMM is matched by its
    FLOPs: wq's equal wo's, w1's w3's and w2's). None where none converts or the GPU has no FP8 tensor
    cores. `delayed` (with `te`): the casts as TE's delayed scaling runs them (te_delayed.py)."""
    from planner.profiler.roofline import roofline_ms

    if not linears or not gpu.fp8_tflops:
        return None
    if te:
        def forward_of(done, items):
            return te_forward(done, items, gpu, delayed=delayed)

        def backward_of(done, items):
            return te_backward(done, items, gpu, delayed=delayed)
    else:
        forward_of, backward_of = forward, backward
    fwd8, cast = forward_of(fwd, linears)
    recompute, weight_ms = {}, {}
    for name, rerun in reruns.items():
        rerun8, rerun_cast = forward_of(rerun, (rerun_linears or {}).get(name, linears))
        if rerun_cast:  # an option that reruns no converted linear keeps its time
            recompute[name] = roofline_ms(rerun8, gpu)
            weight_ms[name] = _bytes_ms(weight_cast_bytes(rerun_cast, delayed=delayed), gpu)
    bwd_ms = roofline_ms(backward_of(bwd, linears), gpu)
    # eab345c's backward (the module's docstring): the saved inputs' recast is what it does not run
    recast = 0.0 if te else max(0.0, bwd_ms - roofline_ms(backward(bwd, linears, saved_float8=True), gpu))
    return Float8Linears(param_count=sum(item.weight_elements for item in {item.fqn: item for item in linears}.values()),
                         fwd_ms=roofline_ms(fwd8, gpu), bwd_ms=bwd_ms, bwd_input_recast_ms=recast,
                         recompute_ms=recompute, weight_cast_ms=_bytes_ms(weight_cast_bytes(cast, delayed=delayed), gpu),
                         rerun_weight_cast_ms=weight_ms, transient_bytes=cast_transient_bytes(linears),
                         forward_casts=[] if te else forward_casts(linears))


def _local(fqn: str) -> str:
    """A linear's name in its block: the FQN's last two parts ("attention.wq")."""
    return ".".join(fqn.split(".")[-2:]) if "." in fqn else fqn


def forward_casts(linears: list[Linear]) -> list[Float8Cast]:
    """Each converted linear's forward casts, in the order the block runs them (torchao eab345c
    `float8_linear.py` 355-385 `Float8Linear.forward`: `cast_input_to_float8`, then `cast_weight_to_float8_t`
    unless the weight arrived in float8; `float8_tensor.py` 153-154: the float8 copy, 1 B an element, with its fp32
    scale): the input, tokens x in-features; under TP + SP's Float8 plan a column-parallel linear's input arrives
    cast (`PrepareFloat8ModuleInput` cast the norm's sequence shard before its all-gather: Linear.shard_rows, the
    shard's copy recorded) and a row-parallel one's is cast in `Float8RowwiseParallel._prepare_input_fn`, its own
    tokens x local width; the weight, in x out features as the device holds them (not made where FSDP2 gathers
    it in float8: planner/cost/float8.py decides)."""
    return [Float8Cast(linear=_local(linear.fqn), source=linear.reads.split(".")[-1] if linear.reads else
                       _local(linear.fqn), input_bytes=linear.tokens * linear.k,
                       shard_bytes=linear.shard_rows * linear.k, weight_bytes=linear.weight_elements)
            for linear in linears]


def module_linears(layer, x, prefix: str) -> list[Linear]:
    """The nn.Linear calls of one forward of `layer` on `x` (under FakeTensorMode in the fake
    profiler), each as a Linear with the rows it ran (a routed expert's tokens where it is one)."""
    import torch

    calls: list[Linear] = []
    hooks, inputs = [], {}  # the input tensors seen (kept alive so that an id names one), by id
    for name, module in layer.named_modules():
        if isinstance(module, torch.nn.Linear):
            fqn = f"{prefix}.{name}" if name else prefix
            k, n = module.in_features, module.out_features

            def hook(_module, args, fqn=fqn, k=k, n=n):
                rows = args[0].numel() // k
                first = inputs.setdefault(id(args[0]), (args[0], fqn))[1]  # the first linear to read it
                calls.append(Linear(fqn, rows, k, n, k, n, first))
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            layer(x)
    finally:
        for handle in hooks:
            handle.remove()
    return calls


def _bytes_ms(num_bytes: int, gpu) -> float:
    """Compiled cast kernels' bytes at the rate fused kernels reach (planner/profiler/membound.py)."""
    from planner.profiler.membound import membound_ms

    return membound_ms(num_bytes, gpu, "fused")


def te_linears(arch, shape, prefix: str) -> list[Linear]:
    """The block's linears as Megatron-core's TE layer spec builds them: linear_qkv (Q, K and V in one
    weight), linear_proj, linear_fc1 (gate and up in one weight under SwiGLU), linear_fc2 (the
    module's docstring)."""
    if arch.style == "gpt":
        return block_linears(arch, shape, prefix)  # already one Q/K/V linear and one fc
    T, h, t = shape.tokens, arch.hidden_size, shape.tp
    q, kv, f = q_width(arch, shape), kv_width(arch, shape), arch.intermediate_size // t
    fq, fkv = arch.num_heads * arch.head_size, arch.num_kv_heads * arch.head_size
    return [Linear(f"{prefix}.self_attention.linear_qkv", T, h, q + 2 * kv, h, fq + 2 * fkv),
            Linear(f"{prefix}.self_attention.linear_proj", T, q, h, fq, h),
            Linear(f"{prefix}.mlp.linear_fc1", T, h, 2 * f, h, 2 * arch.intermediate_size),
            Linear(f"{prefix}.mlp.linear_fc2", T, f, h, arch.intermediate_size, h)]
