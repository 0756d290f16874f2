"""The profile: what `ckplan profile` measured or computed of each layer, the recompute options,
the allocation records, the device and the tied weights."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue, model_validator

from planner.schema.fields import (
    MAX_SAMPLES,
    MAX_STEPS,
    PROFILE_SCHEMA_VERSION,
    Bytes,
    Count,
    Dtype,
    FileRef,
    Ms,
    Optimizer,
    Strict,
)
from planner.schema.tied import TiedSet

# The recompute options a layer may have besides keeping everything ("none") and keeping only
# its input ("full"): selective recompute of its parts (planner/runtime/recompute.py says what each
# does). A name is one option or several joined by commas ("attn,mlp-act"). `attn` checkpoints the
# attention module whole; `core-attn` the attention core alone (Megatron-LM's core_attn, analytic profiles).
OPTION_NONE, OPTION_FULL = "none", "full"
# keep the layer's input, copy every other tensor it saves to host memory in forward and back
# in backward (planner/runtime/recompute.py): device bytes of full, no recompute, PCIe copies and host memory
OPTION_OFFLOAD = "offload"
# recompute options run under torch's selective activation checkpoint (planner/runtime/recompute.py:
# save-matmuls, and mlp-act alone or in a combination), which refuses a second backward through
# its region: a split backward (SPLIT_BACKWARD_SCHEDULES) cannot run them
SELECTIVE_CHECKPOINT_PARTS = ("save-matmuls", "mlp-act")


def runs_split_backward(option: str) -> bool:
    """Whether a zero-bubble schedule's split backward can run recompute option `option`."""
    return not any(part in SELECTIVE_CHECKPOINT_PARTS for part in option.split(","))
OptionName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]*(,[a-z][a-z0-9-]*)*$", max_length=120)]


class RecomputeOption(Strict):
    """One way a layer runs its backward: the bytes it keeps per microbatch until then (its
    input included where it keeps it), what recomputing adds to its backward, and the extra
    peak while it recomputes beyond what it keeps."""

    name: OptionName
    kept_bytes: Bytes
    recompute_ms: Ms = 0.0
    recompute_peak_bytes: Bytes = 0
    # a split backward (zero-bubble schedules; torch's stage_backward_input, then _weight): what
    # the input pass leaves for the weight pass beyond the kept bytes (the gradients of the weight
    # ops' outputs, and what a recomputing option recomputed), the input pass's peak and the weight
    # pass's over what is live before each (every autograd call of the weight pass recomputes a
    # checkpointed region again). Measured profiles; 0 in others, in profiles made before, and for
    # an option under torch's selective checkpoint (it cannot split: runs_split_backward)
    split_held_bytes: Bytes = 0
    split_input_peak_bytes: Bytes = 0
    split_peak_bytes: Bytes = 0
    # of the weight pass, per torch parameter group (planner/cost/wgroups.py): its first group's peak over
    # what is live before the pass, and what its last group leaves alive while the stage's next layer's
    # first group runs (its torch.autograd.grad result, less the saved gradients it frees). None: not
    # recorded (profiles made before; the cost model then takes the layer's whole peak and gradients)
    split_first_peak_bytes: Bytes | None = None
    split_carry_bytes: Bytes | None = None
    # of that carry, what outlives the next group's call and stays to the end of the stage's weight pass (a
    # checkpointed region's reruns its groups did not unpack, framework-facts §889-§890). None: not recorded
    # (profiles made before: charged 0, as then)
    split_left_bytes: Bytes | None = None
    # a split backward's time per microbatch: torch's stage_backward_input (the input gradient, with
    # every backward op but the weight-gradient matmuls) and stage_backward_weight (those matmuls, the
    # gradients' accumulation); measured profiles time torch's two passes (their sum is not the full
    # backward: two engine calls and the graph walks), analytic ones split the backward's own work.
    # None: not recorded (profiles made before; an option that cannot split; a layer with no input
    # gradient or no weight): the cost model then takes half the layer's backward each
    input_grad_ms: Ms | None = None
    weight_grad_ms: Ms | None = None
    # offload: the bytes per microbatch it keeps in host memory until its backward (its
    # recompute_ms is then the copies' time); 0 for every other option
    host_bytes: Bytes = 0

    @model_validator(mode="after")
    def _split_times_together(self) -> RecomputeOption:
        if (self.input_grad_ms is None) != (self.weight_grad_ms is None):
            raise ValueError(f"recompute option {self.name!r}: input_grad_ms and weight_grad_ms are recorded together or not at all")
        return self


class AllocRecord(Strict):
    """One pass pair's storage allocations and frees, per microbatch, in the order the profiler saw
    them (planner/profiler/allocseq.py): what the caching allocator replay (planner/cost/reserve.py)
    runs a stage's steady state from. Events: n > 0 allocates n bytes (the next id, from 1), -k
    frees id k. The backward's ids continue the forward's, so a saved tensor's free names its id."""

    forward: list[int] = []
    backward: list[int] = []
    output: int = Field(default=0, ge=0)  # id of the forward's output storage; 0: none made
    input_grad: int = Field(default=0, ge=0)  # id of the gradient the backward hands back; 0: none
    params: list[Bytes] = []  # bytes of each parameter, in the order the module lists them
    # a record whose forward makes only what it keeps while its backward reruns the rest first (an analytic block
    # under full recompute, allocseq.synthesised): that rerun's tensors as torch's checkpointed forward makes and
    # frees them (codes as `forward`'s, ids from 1 over these; one still alive at the end lives to the forward's
    # end); [] where no lifetimes were read
    rerun_forward: list[int] = []
    # named points of that rerun (analytic_lifetimes.LLAMA_FORWARD_POINTS): the index into rerun_forward before which
    # each falls; {} where none were read
    rerun_points: dict[str, int] = {}
    # the ids of the weights' gradients the backward makes, by the layer's parameters (fsdp2_layers.parameter_parts'
    # order; 0: not made here); [] where the record does not name them (a compiled block's: compiled_record.py)
    param_grads: list[int] = []
CollectiveKind = Literal["all-gather", "reduce-scatter", "all-reduce"]


class FusedMatmuls(Strict):
    """The matmuls torch's micro-pipeline TP pass (torchtitan's AsyncTP) fuses a collective with, in
    every pass the collective runs in (planner/profiler/analytic_asynctp.py says which): their time
    at full size, as the layer's pass time charges them, and one of the tp row chunks the fused op
    splits them into, at that chunk's own size's efficiency (all the matmuls' chunks for one shard,
    summed); the memory-bound copies the fused op adds (the shard into the symmetric-memory buffer,
    or the partials' sum). Under --float8 the fp8 figures (None: the linears are not converted). The
    cost model runs them as the pipeline torch's code orders (planner/cost/asynctp.py)."""

    whole_ms: Ms
    chunk_ms: Ms
    copy_ms: Ms = 0.0
    fp8_whole_ms: Ms | None = None
    fp8_chunk_ms: Ms | None = None


class RingGemm(Strict):
    """The GEMM Transformer Engine's userbuffers ring exchange splits beside a collective (Megatron-LM's
    --tp-comm-overlap; planner/profiler/analytic_ubring.py says which), as TE's linears run it (Q/K/V one GEMM,
    gate and up one): whole, as the layer's pass time charges it, one of its tp row chunks and two of them (an
    aggregated exchange's GEMM), each at its own size's efficiency; under --float8 the FP8 figures. The cost model
    runs them as TE's split_overlap_ag / split_overlap_rs order them (planner/cost/ub_ring.py)."""

    whole_ms: Ms
    chunk_ms: Ms
    pair_ms: Ms
    fp8_whole_ms: Ms | None = None
    fp8_chunk_ms: Ms | None = None
    fp8_pair_ms: Ms | None = None


class LayerCollective(Strict):
    """One collective a layer's code runs per microbatch inside its parallel group (tensor
    parallelism: the group of `tp` ranks the profile was made for), how many times in each pass:
    the bytes of the whole tensor (an all-gather's output, a reduce-scatter's input, an
    all-reduce's tensor). The cost model charges them over the group's link (planner/cost/comm.py),
    so the topology is a setup choice, not part of the profile."""

    kind: CollectiveKind
    tensor_bytes: Bytes
    fwd: int = Field(default=0, ge=0, le=1 << 10)
    bwd: int = Field(default=0, ge=0, le=1 << 10)
    recompute: int = Field(default=0, ge=0, le=1 << 10)  # a full recompute reruns the forward's
    # under AsyncTP, the matmuls torch fuses it with; None: not fused (charged whole), or a profile made before
    fused: FusedMatmuls | None = None
    # under TE's userbuffers, the GEMM a ring exchange splits beside it; None: none (a bulk overlap's site, a block
    # whose GEMMs were not read), or a profile made before
    ring: RingGemm | None = None


class LayerContextParallel(Strict):
    """What a layer's attention exchanges under context parallelism, per microbatch on one rank of
    its `ranks` context-parallel ranks (analytic profiles at --cp > 1): its own tokens' Q (and the
    output, as wide) and K with V in the activation dtype, and the attention core's own time in
    each pass, which the exchange overlaps. The cost model charges the exchange over the group's
    link as the runtime runs it (planner/cost/contextparallel.py)."""

    ranks: int = Field(ge=2, le=1 << 20)
    q_bytes: Bytes  # the rank's Q (= the attention output O) per microbatch
    kv_bytes: Bytes  # the rank's K and V together per microbatch
    attention_fwd_ms: Ms
    attention_bwd_ms: Ms
class Float8Cast(Strict):
    """One converted linear's forward casts as torchao's tensorwise Float8Linear makes them (planner/profiler/float8.py
    `forward_casts`), bytes at 1 B an element, each with its fp32 scale: its input's float8 copy (`input_bytes`:
    tokens x in-features as the device holds them), or, where TP + SP's Float8 plan casts the module's sequence shard
    before gathering it (PrepareFloat8ModuleInput), that shard's copy (`shard_bytes`; 0: no such plan here); its
    weight's float8 copy (`weight_bytes`: in x out features), made unless FSDP2 gathers the weight in float8.
    `source`: the tensor its input is (linears that read one tensor share one cast: compiled, CSE)."""

    linear: str  # the linear's name in its block, e.g. "attention.wq"
    source: str
    input_bytes: Bytes
    shard_bytes: Bytes = 0
    weight_bytes: Bytes


class Float8Delayed(Strict):
    """A TE block's Float8 passes under Transformer Engine's delayed scaling (DelayedScaling; planner/profiler/
    te_delayed.py): the same GEMMs as its Float8Linears, each cast at the scale the amax history gave, its amax written
    by the cast itself (no amax pass), the norm writing FP8 itself; and the block's TE modules, each by its GEMMs
    (its meta buffers: 3 forward and 2 backward quantizers a GEMM). The cost model applies it under the setting
    fp8_delayed_scaling (planner/cost/te_delayed.py)."""

    fwd_ms: Ms
    bwd_ms: Ms
    recompute_ms: dict[OptionName, Ms] = {}
    weight_cast_ms: Ms = 0.0
    rerun_weight_cast_ms: dict[OptionName, Ms] = {}
    module_gemms: list[Count] = []  # each TE module of the block under the autocast, by its num_gemms


class Float8Linears(Strict):
    """What Float8 training (torchao's Float8Linear, dynamic tensorwise scaling, as torchtitan's
    float8 converter swaps it in; planner/profiler/float8.py) changes in one layer: the converted
    linears' GEMMs at the FP8 peak and their casts' bytes. A profile is made at bf16; the cost model
    applies this record under the training setting --float8 (planner/cost/float8.py)."""

    param_count: Count  # the converted linears' weights
    fwd_ms: Ms  # the forward with the converted GEMMs in float8 and the activations' casts
    bwd_ms: Ms  # the backward: input-grad and weight-grad GEMMs in float8, grad_output's and input's casts
    # of bwd_ms, the casts of the saved bf16 inputs again (torchao v0.11.0's rule), which a runtime whose
    # torchao saved the float8 input does not run (RuntimeFacts.float8_saves_input, torchao eab345c)
    bwd_input_recast_ms: Ms = 0.0
    # each recompute option's rerun under Float8 (the weights' casts apart), by option name
    recompute_ms: dict[OptionName, Ms] = {}
    # casting the converted weights to float8 (amax and cast), as every forward does; none under
    # FSDP2's float8 all-gather (the gathered weights are float8)
    weight_cast_ms: Ms = 0.0
    rerun_weight_cast_ms: dict[OptionName, Ms] = {}  # the weights an option's rerun casts again
    # the float8 casts alive at once beyond the bf16 layer's transient (the largest converted
    # linear's backward: grad_output's and the input's casts)
    transient_bytes: Bytes = 0
    # each converted linear's forward casts, in the order the block runs them (torchao's Float8 record only; []
    # where not recorded: the cost model then plays transient_bytes at the down projection, an upper bound)
    forward_casts: list[Float8Cast] = []
    # the same passes under Transformer Engine's delayed scaling (a TE record only; None: not recorded)
    delayed: Float8Delayed | None = None


class CompiledTime(Strict):
    """A layer's passes under torch.compile (inductor), per microbatch: its matmul and attention
    kernels as eager runs them (inductor calls the same extern kernels) and its memory-bound bytes as
    inductor's fused kernels move them (planner/profiler/compiled_time.py). --compile times the layer
    by these; the Float8 record's times move by the same difference."""

    fwd_ms: Ms
    bwd_ms: Ms
    # what each recompute option adds to the compiled backward, by option name (the partition
    # reruns its recomputed ops inside the backward graph)
    recompute_ms: dict[OptionName, Ms] = {}


class FusedKernelTime(CompiledTime):
    """A block's passes on a runtime's fused kernels (Megatron-LM on Transformer Engine:
    planner/profiler/te_fused.py), per microbatch, and its Float8 record on those kernels (TE's fused
    Q/K/V and gate/up linears: one GEMM and one input cast each); None: the layer's own Float8 record
    moved by the passes' differences."""

    float8: Float8Linears | None = None
    # bwd_ms (and the Float8 record's) is the backward under Megatron's gradient-accumulation fusion (the
    # default): the wgrad GEMM accumulates into main_grad. This is what the eager accumulation pass the
    # fusion removes takes; planner/cost/fusedkernels.py adds it back where the setup turns the fusion off
    accumulate_ms: Ms = 0.0
    # a MoE block's record is timed at TE v2.9's router dtypes (the intermediates in the logits'); what TE v2.13 on's
    # fp32 intermediates and aux-loss scores add to its forward (and to each rerun that runs the router) and backward,
    # which planner/cost/fusedkernels.py adds where the runtime record's te_router_scores is "fp32"
    # (planner/profiler/te_moe.py fp32_scores_bytes); 0 in dense blocks and in records made before
    fp32_scores_fwd_ms: Ms = 0.0
    fp32_scores_bwd_ms: Ms = 0.0


class LayerProfile(Strict):
    """One pipeline layer, measured per microbatch."""

    name: str  # FQN in the model: the runtime rebuilds stages from names alone
    kind: str  # layers of one kind are structurally identical (class + parameter shapes)
    # within a kind, what sets this layer's time and bytes apart (Arch.layer_variant: its attention window, its
    # rotary; Gemma 3's global layers, SmolLM3's NoPE layers): the cost model groups by kind and variant.
    # None: as every other layer of its kind (and in profiles made before)
    variant: str | None = None
    fwd_ms: Ms  # median over repeats
    bwd_ms: Ms
    fwd_ms_min: Ms
    fwd_ms_max: Ms
    bwd_ms_min: Ms
    bwd_ms_max: Ms
    # extra backward time when the layer is checkpointed (median); None: not measured,
    # charge a whole forward
    recompute_ms: Ms | None = None
    act_bytes: Bytes  # kept for backward when run normally, not counting what the previous layer keeps
    input_bytes: Bytes  # what a checkpointed layer keeps
    output_bytes: Bytes
    input_in_act_bytes: Bytes = 0  # part of act_bytes that is this layer's own input tensor
    # its input's storage where it saves it but the layer before it saved it first (the profile charges a storage
    # once, to the first layer saving it, so act_bytes leaves it out): the layer's own where that layer is not on its
    # stage (planner/cost/layers.py). Measured and fake profiles; 0 in analytic ones and in profiles made before
    input_shared_bytes: Bytes = 0
    # its registered buffers (module.buffers(): a fixed table, a mask), held on its stage's device all along; measured
    # and fake profiles (an analytic profile's runtime tables are the cost model's: planner/cost/rotarytable.py). 0 in
    # profiles made before
    buffer_bytes: Bytes = 0
    param_count: Count
    param_bytes: Bytes
    # of param_count, the routed experts' parameters (a mixture-of-experts block's; 0 elsewhere and
    # in profiles made before): expert parallelism (DataParallelSetup.ep) splits these over its
    # ranks, the rest (attention, norms, router, shared experts) stays replicated
    expert_param_count: Count = 0
    # a mixture-of-experts block: bytes its token dispatch sends per microbatch, every routed
    # token copy's hidden state (tokens x top-k x hidden x dtype bytes at the profile's capacity
    # factor); the combine sends as much back. 0 elsewhere and in profiles made before
    a2a_bytes: Bytes = 0
    # its largest parameter tensor (measured profiles; None in analytic ones and older profiles): ZeRO 1 on ckplan's
    # runtime gives each rank whole tensors
    largest_param_count: Count | None = None
    # its last trained parameter tensor (measured and fake profiles; None in analytic ones and older profiles): FSDP2's
    # foreach_reduce keeps its unsharded gradient referenced through the reduce-scatter (planner/cost/gloowork.py)
    last_trained_param_count: Count | None = None
    # of param_count, its embedding lookups' tables (nn.Embedding's in measured and fake profiles; an analytic
    # profile's embedding layer): their gradient is the lookup's backward's, never a linear's wgrad GEMM, so a
    # runtime's hook adds it whatever fuses the linears' (planner/cost/jobsettings.py). 0 elsewhere and in profiles
    # made before (read as no table)
    lookup_param_count: Count = 0
    # its trained parameter tensors (measured and fake profiles; 0 in analytic ones and older profiles): torch's Adam
    # keeps a step count per tensor, on the CPU (planner/cost/stepcounts.py)
    param_tensors: Count = 0
    # its trained parameter tensors' elements, one each, in the layer's parameters() order (measured and fake
    # profiles; None in analytic ones and older profiles): ZeroRedundancyOptimizer's partition (cost/zeroone.py)
    trained_param_numels: list[Count] | None = None
    # of param_count, those it trains (requires_grad True; measured and fake profiles of a model file):
    # a frozen weight is held whole, but makes no gradient and torch's optimizers keep no state for it. None in
    # analytic profiles and those made before: every parameter trained
    trained_param_count: Count | None = None
    # whether its input requires a gradient in the model's own forward (measured and fake profiles: the layer before's output
    # does, it or an earlier layer training): where not, and none of its parameters trains, its output needs none
    # either, and torch's pipelining runs no backward through it, allocates no receive buffer for a stage output
    # needing no gradient and sends no gradient of a stage input needing none (framework-facts §730, §731). None in
    # analytic profiles and those made before: every layer's input but the first's (the batch) does
    input_requires_grad: bool | None = None
    transient_bytes: Bytes  # extra peak during this layer's forward or backward beyond what is kept
    # of transient_bytes, the bytes that are the gradient of its output its backward runs on: the transient less
    # the transient without that gradient (measure._transient_parts; an analytic block's boundary_bytes, its
    # transient being its backward's). On a pipeline stage before the last, that gradient is the stage's receive
    # buffer, charged apart (rules.last_layer_buffer_bytes): the cost model takes it off the closing layer's
    # transient there (planner/cost/boundgrad.py). 0 in profiles made before: charged twice there, as before
    incoming_grad_bytes: Bytes = 0
    forward_transient_bytes: Bytes | None = None  # of transient_bytes, the forward's (measured, fake; else None)
    # optimizer step over this layer's parameters, once per iteration, per optimizer name (ms: measured
    # profiles, each optimizer's fastest of its rounds, measure.fastest_turns_ms); empty in profiles made
    # before it was measured: the step then costs 0
    step_ms: dict[Optimizer, Ms] = {}
    # cpu: the same step at each torch thread count below the profile's (1, 2, 4, ...), as a launch's ranks run
    # it with fewer threads (profiler/threads.py at_fewer_threads); empty on cuda, at 1 thread and in older profiles
    step_thread_ms: dict[Annotated[int, Field(gt=0, le=1 << 16)], dict[Optimizer, Ms]] = {}
    # every option the layer supports, "none" and "full" first (as act_bytes, input_bytes and
    # recompute_ms say), then selective ones; empty: none and full only (profiles made before)
    recompute_options: list[RecomputeOption] = []
    # a mixture-of-experts layer (measured profiles): the tokens each routed expert received on the
    # profiled microbatch, dropless top-k (they sum to tokens x k); act_bytes, a2a_bytes and the times
    # are those of this routing. Empty elsewhere, in analytic profiles and in profiles made before
    routed_tokens: list[Count] = []
    # of transient_bytes, what the routed experts' weight gradients add (their temporaries are as
    # large as the experts a rank holds): expert parallelism over E ranks holds 1/E of it. 0 elsewhere
    expert_transient_bytes: Bytes = 0
    # of transient_bytes, what the weight gradients autograd makes fresh add to it: the model's code run into a
    # `.grad` made before keeps each new gradient from its kernel to AccumulateGrad's in-place add (a MoE block's
    # routed experts' stacked gradient the largest); a runtime accumulating inside its wgrad GEMM (Megatron-core's
    # gradient_accumulation_fusion) holds transient_bytes less this (planner/profiler/fake_wgrad.py). Fake profiles;
    # 0 in analytic ones (their transient has the gradients accumulated in place); None where not recorded
    # (measured profiles, profiles made before)
    weight_grad_transient_bytes: Bytes | None = None
    # of act_bytes, what its experts modules keep (measured with routed_tokens): it grows with the
    # token copies a rank computes, which expert parallelism spreads by routing, not evenly. 0 elsewhere
    expert_act_bytes: Bytes = 0
    # the allocations and frees of one forward and backward, per recompute option by name ("none",
    # "full", selective ones; fake profiles): the allocator replay's input. Empty in other profiles
    # and profiles made before: the reserve is then the allocated peak over 1 - fragmentation
    alloc_records: dict[OptionName, AllocRecord] = {}
    # under torch.compile, per recompute option by name, the bytes per microbatch the compiled layer
    # keeps for backward (AOTAutograd's partition: planner/profiler/compiled.py; analytic profiles
    # made with --compiled: planner/profiler/compiled_kept.py). --compile charges them for the options
    # named here; empty (other layers, profiles made before or without it): eager figures, said
    compiled_kept_bytes: dict[OptionName, Bytes] = {}
    # under torch.compile with a whole-block checkpoint, the block's allocation record as inductor's wrappers make it
    # (planner/profiler/compiled_blocks.py), by the settings it was compiled under ("async-tp,float8"); the cost
    # model plays it where a job compiles under those settings (planner/cost/compiled_block.py). Empty: eager's
    compiled_records: dict[str, AllocRecord] = {}
    # under torch.compile, its passes' times (analytic profiles made with --compiled:
    # planner/profiler/compiled_time.py); None: --compile times the layer as eager, and says so
    compiled_time: CompiledTime | None = None
    # its passes as Megatron-core runs them on Transformer Engine's layers, norms, rotary and activation
    # fused (analytic profiles: planner/profiler/te_fused.py); read where the runtime's record says its
    # layers run those kernels (RuntimeFacts.fused_kernels). None: timed as the profile's passes, said
    te_time: FusedKernelTime | None = None
    # of bwd_ms (and the Float8 record's), the eager accumulation of its linears' weight gradients into .grad
    # (analytic profiles: analytic_time.ACCUMULATE x the gradients' bytes at the elementwise class's rate; 0 under
    # --mfu, elsewhere and in profiles made before). Megatron-core's own linears (the output layer, eh_proj) and
    # TE's run none under the gradient-accumulation fusion: planner/cost/fusedkernels.py takes it out where a
    # layer has no te_time (whose record holds its own, FusedKernelTime.accumulate_ms)
    wgrad_accumulate_ms: Ms = 0.0
    # the tensor-parallel collectives per microbatch (analytic profiles at --tp > 1: the
    # all-gathers and reduce-scatters of sequence parallelism, or the all-reduces without it);
    # empty elsewhere and in profiles made before: no tensor-parallel communication charged
    collectives: list[LayerCollective] = []
    # context parallelism's exchange of this layer's attention (analytic profiles at --cp > 1); None elsewhere
    context_parallel: LayerContextParallel | None = None
    # its linears under Float8 (analytic profiles' dense blocks); None: no linear Float8 converts, or
    # a profile that did not record it (--float8 then refuses it)
    float8: Float8Linears | None = None

    @model_validator(mode="after")
    def _options_agree(self) -> LayerProfile:
        names = [option.name for option in self.recompute_options]
        if len(set(names)) != len(names):
            raise ValueError(f"layer {self.name}: recompute options repeat a name")
        if names and names[:2] != [OPTION_NONE, OPTION_FULL]:
            raise ValueError(f"layer {self.name}: recompute options must begin with none and full")
        if self.incoming_grad_bytes > self.transient_bytes:
            raise ValueError(f"layer {self.name}: incoming_grad_bytes {self.incoming_grad_bytes:,} is more than its "
                             f"transient_bytes {self.transient_bytes:,}")
        if names and (self.recompute_options[0].kept_bytes != self.act_bytes
                      or self.recompute_options[1].kept_bytes != self.input_bytes):
            raise ValueError(f"layer {self.name}: options none and full must keep act_bytes and input_bytes")
        return self


class DeviceInfo(Strict):
    type: Literal["cpu", "cuda"]
    name: str
    threads: int | None = Field(default=None, gt=0, le=1 << 16)  # torch.get_num_threads() during profiling (cpu)
    # cpu: the whole model's forward + backward, least ms of 5, at each torch thread count profile
    # timed (1, 2, 4, ... and `threads`); a launch's other thread count scales the times by it
    thread_ms: dict[Annotated[int, Field(gt=0, le=1 << 16)], Annotated[Ms, Field(gt=0)]] | None = None
    # cpu: the same at 1 thread, median, alone (key 1) and while N - 1 other processes run it
    # alongside (key N: the cores, up to 4): ranks that fill the cores share caches and memory
    shared_ms: dict[Annotated[int, Field(gt=0, le=1 << 16)], Annotated[Ms, Field(gt=0)]] | None = None


class Profile(Strict):
    schema_version: int = PROFILE_SCHEMA_VERSION
    name: str
    created_at: str
    torch_version: str
    device: DeviceInfo
    dtype: Dtype
    micro_batch_size: int = Field(gt=0, le=MAX_SAMPLES)
    warmup: int = Field(default=0, ge=0, le=MAX_STEPS)
    repeats: int = Field(default=1, ge=1, le=MAX_STEPS)
    model: FileRef
    batch_input_bytes: Bytes = 0  # the model input of one microbatch (held by stage 0)
    batch_target_bytes: Bytes = 0  # the targets of one microbatch (held by the last stage)
    loss_bytes: Bytes = 0  # what the loss function keeps for backward, and the loss value (last stage)
    loss_ms: Ms = 0.0  # loss forward + backward
    loss_transient_bytes: Bytes = 0  # extra peak during the loss's forward and backward beyond what it keeps
    # the loss's forward + backward compiled (inductor's fused kernels' bytes; analytic profiles made with
    # --compiled: planner/profiler/compiled_time.py); None: a compiled loss is timed as loss_ms, said
    compiled_loss_ms: Ms | None = None
    loss_alloc: AllocRecord | None = None  # the loss's allocations and frees (fake profiles): see AllocRecord
    layers: list[LayerProfile] = Field(min_length=1)
    # measured by `ckplan profile MODEL.py`, or computed from a published architecture's
    # formulas (`--arch`); an analytic profile records every assumption it rests on
    source: Literal["measured", "analytic", "fake"] = "measured"
    assumptions: dict[str, JsonValue] = {}  # seq_len, tp, sp, attention, gpu, mfu, sources...
    tied: list[TiedSet] = []  # parameters shared between layers; empty in profiles made before they were found
    # the optimizer stepping fp32 tensors on this machine's CPU, ns per parameter (what offload's
    # host step costs); empty in profiles made before it was measured
    host_step_ns_per_param: dict[Optimizer, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = {}

    @model_validator(mode="after")
    def _unique_names(self) -> Profile:
        names = [layer.name for layer in self.layers]
        if len(set(names)) != len(names):
            raise ValueError("layer names must be unique")
        return self

    @model_validator(mode="after")
    def _shared_inputs_saved_before(self) -> Profile:
        """A layer's input_shared_bytes is a storage the layer before it saved and was charged (profiler/saved.py), so
        no more than that layer's act_bytes, and none for the first layer (the batch): the cost model nets it out of
        the layer before (planner/cost/layers.py shared_out), which a larger figure would take below zero."""
        for before, layer in zip([None, *self.layers], self.layers):
            if layer.input_shared_bytes and (before is None or layer.input_shared_bytes > before.act_bytes):
                kept = "it is the first layer" if before is None else f"layer {before.name} keeps {before.act_bytes:,}"
                raise ValueError(f"layer {layer.name}'s input_shared_bytes {layer.input_shared_bytes:,} is more than "
                                 f"the layer before it saved ({kept})")
        return self

    @model_validator(mode="after")
    def _tied_layers_exist(self) -> Profile:
        names = {layer.name for layer in self.layers}
        stray = [name for item in self.tied for name in item.layers if name not in names]
        if stray:
            raise ValueError(f"tied names layers {stray[:3]} that are not layers of the profile")
        return self
