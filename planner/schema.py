"""The data that flows between rooms: profile, training setup, plan and run report.

Every model forbids unknown fields, so a typo in a hand-edited plan or a file from
another tool is rejected with the field's name instead of being silently ignored.
Bytes are ints, times are float milliseconds; names carry their unit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

SCHEMA_VERSION = 1
# plans: 2 gives the setup in parts (TrainSetup); version 1 plans, with the setup flat, load
# as they are (TrainSetup nests their fields)
PLAN_SCHEMA_VERSION = 2
PLAN_SCHEMA_VERSIONS = (1, 2)

Schedule = Literal["1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV"]
# schedules whose ranks hold several stages (chunks) each: planner/cost/schedules.py simulates them
CHUNKED_SCHEDULES = ("interleaved-1F1B", "ZB", "ZBV", "DualPipeV")
# schedules that split a backward into its input- and weight-gradient passes (two autograd calls)
SPLIT_BACKWARD_SCHEDULES = ("ZB", "ZBV", "DualPipeV")
Optimizer = Literal["adam", "sgd"]
Precision = Literal["fp32", "bf16", "bf16-mixed"]
Dtype = Literal["float32", "bfloat16", "float16"]  # what the profiler casts to and the runtime runs in

# Measured numbers must be finite and not negative; past these bounds a value is a
# corrupt or hand-mangled file, not a measurement (2**60 bytes is an exbibyte, 1e9 ms
# eleven days for one layer on one microbatch).
MAX_BYTES = 2**60
MAX_MS = 1e9
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Count = Annotated[int, Field(ge=0, le=MAX_BYTES)]
# Counts a setup holds. Past these a file is mangled, not a job: no pipeline has 16,384 stages,
# 65,536 microbatches per iteration (a replay or a schedule of them runs for hours), a
# microbatch of a million samples or a million data-parallel replicas.
MAX_STAGES = 1 << 14
MAX_MICROBATCHES = 1 << 16
MAX_SAMPLES = 1 << 20
MAX_RANKS = 1 << 20
MAX_STEPS = 1 << 20
Ms = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileRef(Strict):
    """A file other files depend on, pinned by content."""

    file: str
    sha256: str


# ---------------------------------------------------------------- profile


# The recompute options a layer may have besides keeping everything ("none") and keeping only
# its input ("full"): selective recompute of its parts (planner/runtime/recompute.py says what each
# does). A name is one option or several joined by commas ("attn,mlp-act").
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
    # offload: the bytes per microbatch it keeps in host memory until its backward (its
    # recompute_ms is then the copies' time); 0 for every other option
    host_bytes: Bytes = 0


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
CollectiveKind = Literal["all-gather", "reduce-scatter", "all-reduce"]


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


class LayerProfile(Strict):
    """One pipeline layer, measured per microbatch."""

    name: str  # FQN in the model: the runtime rebuilds stages from names alone
    kind: str  # layers of one kind are structurally identical (class + parameter shapes)
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
    # its largest parameter tensor (measured profiles; None in analytic ones and older
    # profiles): ZeRO 1 on ckplan's runtime gives each rank whole tensors
    largest_param_count: Count | None = None
    transient_bytes: Bytes  # extra peak during this layer's forward or backward beyond what is kept
    # optimizer step over this layer's parameters, once per iteration, per optimizer name
    # (median ms); empty in profiles made before it was measured: the step then costs 0
    step_ms: dict[Optimizer, Ms] = {}
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
    # of act_bytes, what its experts modules keep (measured with routed_tokens): it grows with the
    # token copies a rank computes, which expert parallelism spreads by routing, not evenly. 0 elsewhere
    expert_act_bytes: Bytes = 0
    # the allocations and frees of one forward and backward, per recompute option by name ("none",
    # "full", selective ones; fake profiles): the allocator replay's input. Empty in other profiles
    # and profiles made before: the reserve is then the allocated peak over 1 - fragmentation
    alloc_records: dict[OptionName, AllocRecord] = {}
    # the tensor-parallel collectives per microbatch (analytic profiles at --tp > 1: the
    # all-gathers and reduce-scatters of sequence parallelism, or the all-reduces without it);
    # empty elsewhere and in profiles made before: no tensor-parallel communication charged
    collectives: list[LayerCollective] = []

    @model_validator(mode="after")
    def _options_agree(self) -> LayerProfile:
        names = [option.name for option in self.recompute_options]
        if len(set(names)) != len(names):
            raise ValueError(f"layer {self.name}: recompute options repeat a name")
        if names and names[:2] != [OPTION_NONE, OPTION_FULL]:
            raise ValueError(f"layer {self.name}: recompute options must begin with none and full")
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


class TiedSet(Strict):
    """A parameter several pipeline layers share (tied weights: GPT-2's token embedding
    and LM head). Split across stages, each holding stage keeps a copy (its weights,
    gradient and optimizer state are in every holder's param bytes) and the copies'
    gradients are summed before every optimizer step."""

    layers: list[str] = Field(min_length=2)  # the layers holding it, in model order
    param_count: int = Field(ge=0)
    param_bytes: Bytes
    sum_ms: Ms = 0.0  # summing two stages' gradient copies in place, measured in one process


class Profile(Strict):
    schema_version: int = SCHEMA_VERSION
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
    def _tied_layers_exist(self) -> Profile:
        names = {layer.name for layer in self.layers}
        stray = [name for item in self.tied for name in item.layers if name not in names]
        if stray:
            raise ValueError(f"tied names layers {stray[:3]} that are not layers of the profile")
        return self


# ---------------------------------------------------------------- setup and plan


class PipelineSetup(Strict):
    """The pipeline: how many stages, the microbatches they pass, the schedule, the caps."""

    stages: int = Field(gt=0, le=MAX_STAGES)  # pipeline stages, one device each
    microbatches: int = Field(gt=0, le=MAX_MICROBATCHES)  # per iteration per pipeline
    micro_batch_size: int = Field(gt=0, le=MAX_SAMPLES)
    schedule: Schedule = "1F1B"
    chunks: int = Field(default=1, ge=1, le=64)  # stages per rank (interleaved, zero-bubble schedules)
    mem_caps_bytes: list[int]  # one per stage; devices may differ
    # stages that can compute at the same time: all of them with one device each (None);
    # fewer when ranks share CPU cores, which bounds the iteration by total work / this
    parallel_stages: int | None = Field(default=None, gt=0, le=MAX_STAGES)
    # on cuda: the share of reserved memory the caching allocator loses to fragmentation,
    # 1 - allocated / reserved at the peak (planner/cost/allocator.py); None: its published mean
    fragmentation: float | None = Field(default=None, ge=0, le=0.9, allow_inf_nan=False)

    @model_validator(mode="after")
    def _chunks_with_their_schedule(self) -> PipelineSetup:
        if (self.chunks > 1) != (self.schedule in CHUNKED_SCHEDULES):
            raise ValueError(f"schedule {self.schedule} with {self.chunks} chunks per rank: 1F1B and GPipe run one "
                             f"chunk, {', '.join(CHUNKED_SCHEDULES)} two or more")
        return self

    @model_validator(mode="after")
    def _caps_per_stage(self) -> PipelineSetup:
        if len(self.mem_caps_bytes) != self.stages:
            raise ValueError(
                f"mem_caps_bytes has {len(self.mem_caps_bytes)} entries for {self.stages} stages"
            )
        if any(cap <= 0 for cap in self.mem_caps_bytes):
            raise ValueError("every memory cap must be greater than zero")
        return self


# A link or copy bandwidth past this is no hardware (HBM moves ~5e3 GB/s); a host step past
# MAX_MS ms per parameter is a mangled file, not a measurement.
MAX_GB_PER_S = 1e5
GbPerS = Annotated[float, Field(ge=1e-6, le=MAX_GB_PER_S, allow_inf_nan=False)]  # 1 kB/s .. 100 TB/s


class DataParallelSetup(Strict):
    """Data parallelism: replicas, ZeRO over shard groups (HSDP), optimizer offload, and the
    links and host they use."""

    dp: int = Field(default=1, gt=0, le=MAX_RANKS)  # data-parallel replicas (ZeRO shards over these)
    zero: int = Field(default=0, ge=0, le=3)
    offload: bool = False  # optimizer state in host memory
    # ZeRO shards inside groups of this many data-parallel ranks and replicates across the
    # dp / shard_group groups (HSDP); None: one group of all dp ranks
    shard_group: int | None = Field(default=None, gt=0, le=MAX_RANKS)
    offload_overlap: bool = True  # offload's copy, host step and copy back overlapped in chunks, not serial
    # ZeRO 2/3: gradients reduce-scattered (and ZeRO 3's weights gathered) every microbatch, or
    # kept whole through the iteration's microbatches, gathered and reduced once (what
    # torch.distributed.pipelining does with FSDP2: no gradient sync nor reshard until the last backward)
    zero_gather: Literal["per-microbatch", "per-iteration"] = "per-microbatch"
    # GB/s per rank for the gradient reduction inside a shard group (ZeRO 0: among all dp
    # ranks), across shard groups, and for host<->device copies; None: that traffic is not
    # charged (plans made before it was modelled; a CPU profile's host is its device)
    shard_gb_per_s: GbPerS | None = None
    replica_gb_per_s: GbPerS | None = None
    host_gb_per_s: GbPerS | None = None
    host_step_ns_per_param: float | None = Field(default=None, ge=0, le=MAX_MS, allow_inf_nan=False)  # the host's optimizer
    host_mem_bytes: int | None = Field(default=None, gt=0, le=MAX_BYTES)  # host memory of a node, shared by its ranks
    devices_per_node: int = Field(default=1, gt=0, le=1 << 12)  # ranks sharing one host's memory
    dp_notes: list[str] = []  # where the bandwidths and the host step speed came from
    # expert parallelism: the routed experts split over groups of `ep` of the dp ranks (Megatron-LM's
    # --expert-model-parallel-size, torchtitan's expert_parallel_degree), each expert's state
    # replicated (and ZeRO-sharded) over the dp / ep ranks of its expert-data-parallel group
    ep: int = Field(default=1, gt=0, le=MAX_RANKS)
    # GB/s per rank of the tokens' all-to-all inside an expert-parallel group; None: not charged
    ep_gb_per_s: GbPerS | None = None

    @model_validator(mode="after")
    def _shard_group_divides_dp(self) -> DataParallelSetup:
        if self.shard_group is not None and self.dp % self.shard_group:
            raise ValueError(f"shard_group {self.shard_group} does not divide dp {self.dp}")
        if self.dp % self.ep:
            raise ValueError(f"ep {self.ep} does not divide dp {self.dp}")
        if self.shard_group is not None and self.ep > 1 and self.shard_group % self.ep:
            raise ValueError(f"ep {self.ep} does not divide shard_group {self.shard_group}")
        return self


Runtime = Literal["ckplan", "megatron", "torchtitan", "colossalai", "deepspeed"]


class TrainingSetup(Strict):
    """What each parameter costs: the optimizer and the precision; and the runtime whose way of
    running the plan the cost model charges (ckplan's own, or the framework it is exported to)."""

    optimizer: Optimizer = "adam"
    precision: Precision = "fp32"
    runtime: Runtime = "ckplan"
    # the recompute options a plan may choose: every option the profile lists, or whole
    # layers only (none or full, the plan space before options)
    recompute: Literal["options", "whole-layer"] = "options"
    # The settings real jobs use (issue 33), named as Megatron-LM's and torchtitan's configs name
    # them; each is modelled or refused (planner/cost/runtimes.py refused_settings), never ignored.
    # the runtime's version whose facts apply (planner/cost/runtimes.py VERSIONS; None: the newest
    # read), e.g. torchtitan 9dec370 (loss not compiled) or bbb1b616 (compiled with the model)
    runtime_version: str | None = None
    # torch.compile of the model (torchtitan --training.compile / compile.enable): the loss is
    # compiled with it where the runtime's version does so
    compile: bool = False
    # torchtitan's --activation_checkpoint.mode selective --selective_ac_option op: save every
    # other mm and the attention outputs (not modelled: refused)
    op_level_sac: bool = False
    # Float8 linears (torchtitan --float8 / torchao; Megatron --fp8-format) (not modelled: refused)
    float8: bool = False
    # FSDP2's all-gather of float8 weights (torchtitan --float8.enable_fsdp_float8_all_gather)
    fp8_all_gather: bool = False
    # context-parallel degree (Megatron --context-parallel-size, torchtitan context_parallel_degree)
    context_parallel: int = Field(default=1, ge=1, le=MAX_RANKS)
    # dtype of Adam's two moments (Megatron --exp-avg-dtype / --exp-avg-sq-dtype)
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    # the cross-entropy computed over chunks of the tokens (not modelled: refused)
    chunked_cross_entropy: bool = False
    # multi-token-prediction modules (Megatron --mtp-num-layers) (not modelled: refused)
    mtp_layers: int = Field(default=0, ge=0, le=64)
    # expert tensor-parallel degree (Megatron --expert-tensor-parallel-size; None: the TP degree)
    expert_tp: int | None = Field(default=None, ge=1, le=MAX_RANKS)


# A scale past this (a stage 1000x slower than profiled, or 1000x faster) or a latency past a
# second is a fit gone wrong, not a machine.
MAX_SCALE = 1e3
MIN_SCALE = 1 / MAX_SCALE
MAX_LATENCY_MS = 1e3


class TimeConstants(Strict):
    """Per microbatch every stage boundary sends the output forward and its gradient back, each
    send latency + bytes / bandwidth, and every forward or backward is one schedule action with
    a fixed cost; compute takes compute_scale x the profile's times (other threads than
    profiled, ranks sharing cores) and work spread over shared cores cpu_sharing x its share.
    Measured by `ckplan calibrate` (planner/measure/calibrate.py); the defaults charge nothing."""

    send_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    send_gb_per_s: GbPerS | None = None  # None: bytes not charged
    action_overhead_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    compute_scale: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)
    cpu_sharing: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)
    calibration: str | None = None  # where those constants came from (file, when, placement)


TpOverlap = Literal["none", "async-tp", "tp-comm-overlap"]


class CommSetup(Strict):
    """The links the layers' tensor-parallel collectives and the pipeline's sends cross
    (planner/cost/comm.py): bandwidth per rank (GB/s, the collective's bus bandwidth) and NCCL's
    latency per collective and per ring step. Filled from the GPU's links and --gpus-per-node by
    the commands (comm.default_comm); the defaults charge nothing (plans made before)."""

    tp: int = Field(default=1, gt=0, le=MAX_RANKS)  # the tensor-parallel group the profile's collectives run in
    tp_gb_per_s: GbPerS | None = None  # None: tensor-parallel collectives not charged
    tp_step_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    # the pipeline's sends between neighbouring stages when `ckplan calibrate` measured none
    # (TimeConstants.send_gb_per_s wins where given); None: not charged
    pp_gb_per_s: GbPerS | None = None
    pp_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    collective_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)  # NCCL's base
    gpus_per_node: int = Field(default=8, gt=0, le=1 << 12)
    # a runtime setting that overlaps the tensor-parallel collectives with the matmuls (the runtime
    # record's tp_overlap, planner/cost/runtimes.py, says which runtime has which); "none": every collective on the critical path
    tp_overlap: TpOverlap = "none"
    comm_notes: list[str] = []  # where the links came from


SETUP_PARTS: dict[str, type[Strict]] = {
    "pipeline": PipelineSetup, "data_parallel": DataParallelSetup, "training": TrainingSetup, "time": TimeConstants,
    "comm": CommSetup,
}
PART_OF_FIELD = {name: part for part, model in SETUP_PARTS.items() for name in model.model_fields}


def nest_setup_fields(flat: dict) -> dict:
    """A setup written flat (schema version 1 plans, and keyword arguments) in its parts; keys
    already in parts, and keys of no part (refused by validation), stay as they are."""
    nested: dict = {}
    for key, value in flat.items():
        part = PART_OF_FIELD.get(key)
        if part is None:
            nested[key] = value
        else:
            nested.setdefault(part, {})
            if not isinstance(nested[part], dict):
                nested[part] = dict(nested[part])
            nested[part][key] = value
    return nested


class TrainSetup(Strict):
    """How the model is trained: what the cost model needs besides the profile, in one typed
    part per concern (torchtitan's way): a function takes the part it needs."""

    pipeline: PipelineSetup
    data_parallel: DataParallelSetup = DataParallelSetup()
    training: TrainingSetup = TrainingSetup()
    time: TimeConstants = TimeConstants()
    comm: CommSetup = CommSetup()

    @model_validator(mode="before")
    @classmethod
    def _parts(cls, data):
        if isinstance(data, dict) and any(key in PART_OF_FIELD for key in data):
            parts = {key: value for key, value in data.items() if key in SETUP_PARTS}
            flat = {key: value for key, value in data.items() if key not in SETUP_PARTS}
            nested = nest_setup_fields(flat)
            for part, fields in nested.items():
                if part in SETUP_PARTS and isinstance(parts.get(part), dict):
                    nested[part] = {**parts.pop(part), **fields}
            return {**parts, **nested}
        return data

    def model_copy(self, *, update: dict | None = None, deep: bool = False) -> TrainSetup:
        """A copy with `update` (fields by their own names or by part) validated, never set blindly."""
        if not update:
            return super().model_copy(deep=deep)
        data = self.model_dump()
        for part, fields in nest_setup_fields(update).items():
            if part in SETUP_PARTS and isinstance(fields, dict):
                data[part] = {**data[part], **fields}
            else:
                data[part] = fields.model_dump() if isinstance(fields, BaseModel) else fields
        return TrainSetup.model_validate(data)


class StagePredicted(Strict):
    peak_bytes: Bytes
    static_bytes: Bytes  # weights + grads + optimizer state
    activation_bytes: Bytes  # in-flight microbatches x kept bytes per microbatch
    buffer_bytes: Bytes = 0  # pipeline send/recv buffers
    transient_bytes: Bytes = 0  # recompute + largest layer transient
    time_ms: float  # fwd + bwd + recompute for all microbatches' worth of one microbatch
    step_ms: float = 0.0  # optimizer step, once per iteration
    comm_ms: float = 0.0  # per microbatch: the stage's sends and schedule actions (not in time_ms)
    # cuda: what the caching allocator reserves at the peak, and the communication library's
    # buffers beside it (planner/cost/allocator.py); the cap holds both. None / 0 on cpu
    reserved_bytes: int | None = None
    # how reserved_bytes was found: "replay" (the caching allocator's rules over the stage's
    # recorded allocations, planner/cost/reserve.py) or "divisor" (the allocated peak over
    # 1 - fragmentation: profiles without allocation records, chunked schedules, --fragmentation)
    reserved_by: Literal["replay", "divisor"] | None = None
    workspace_bytes: int = 0
    # host memory the rank takes (offloaded optimizer, offloaded activations) and its share of
    # the node's (--host-mem; None: not capped)
    host_bytes: int = 0
    host_cap_bytes: int | None = None


class StagePlan(Strict):
    index: int = Field(ge=0, le=MAX_STAGES)
    layers: list[str] = Field(min_length=1)
    checkpointed: list[str] = []  # the layers whose option is "full" (recompute their whole forward)
    # layer -> its recompute option, for every layer whose option is not "none"; written from
    # `checkpointed` when only that is given (plans made before options)
    recompute: dict[str, OptionName] = {}
    # chunked schedules: the rank's layer ranges, chunk 0 first (their concatenation is `layers`)
    chunks: list[list[str]] = []
    predicted: StagePredicted | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_from_the_other(cls, data):
        if isinstance(data, dict):
            recompute, checkpointed = data.get("recompute"), data.get("checkpointed")
            if not recompute and checkpointed:
                data = {**data, "recompute": dict.fromkeys(checkpointed, OPTION_FULL)}
            elif recompute and checkpointed is None and isinstance(recompute, dict):
                data = {**data, "checkpointed": [name for name in data.get("layers", [])
                                                 if recompute.get(name) == OPTION_FULL]}
        return data

    @model_validator(mode="after")
    def _checkpointed_subset(self) -> StagePlan:
        owned = set(self.layers)
        stray = [name for name in [*self.checkpointed, *self.recompute] if name not in owned]
        if stray:
            raise ValueError(f"stage {self.index} recomputes layers it does not own: {stray}")
        full = [name for name in self.layers if self.recompute.get(name) == OPTION_FULL]
        if sorted(full) != sorted(self.checkpointed):
            raise ValueError(f"stage {self.index}: checkpointed {self.checkpointed} are not the layers whose "
                             f"recompute option is full ({full})")
        if any(option == OPTION_NONE for option in self.recompute.values()):
            raise ValueError(f"stage {self.index}: recompute lists only layers whose option is not none")
        if self.chunks and ([name for chunk in self.chunks for name in chunk] != self.layers
                            or not all(self.chunks)):
            raise ValueError(f"stage {self.index}: its chunks are not its layers in order, each non-empty")
        return self

    def option(self, layer: str) -> str:
        """The layer's recompute option: `checkpointed` says which are full (a copy that
        updated it alone stays right), `recompute` the selective ones."""
        if layer in self.checkpointed:
            return OPTION_FULL
        option = self.recompute.get(layer, OPTION_NONE)
        return OPTION_NONE if option == OPTION_FULL else option

    def with_recompute(self, recompute: dict[str, str]) -> StagePlan:
        """A validated copy whose layers recompute as `recompute` says (layer -> option; the
        others "none"), its prediction dropped."""
        chosen = {name: option for name, option in recompute.items() if option != OPTION_NONE}
        return StagePlan(index=self.index, layers=list(self.layers), recompute=chosen,
                         checkpointed=[name for name in self.layers if chosen.get(name) == OPTION_FULL],
                         chunks=[list(chunk) for chunk in self.chunks])

    def with_checkpointed(self, names) -> StagePlan:
        """A validated copy that checkpoints whole layers `names` and recomputes nothing else."""
        return self.with_recompute(dict.fromkeys(names, OPTION_FULL))


class PlanPredicted(Strict):
    iteration_ms: float
    peak_bytes_max: int = 0


class SolverInfo(Strict):
    # the solver that ran: "dp" (planner/dpsolve.py) or "milp" (HiGHS); "highs" in plans written
    # before the search picked between them (the DP ran then, HiGHS only in tests)
    name: str = "dp"
    status: Literal["optimal", "feasible", "infeasible"]
    objective: float | None = None  # predicted iteration ms
    bound: float | None = None  # proven lower bound on the iteration ms
    gap: float | None = None  # relative gap between objective and bound at the end
    wall_s: float = 0.0


class BaselineResult(Strict):
    """A reference strategy scored by the same cost model; its stages make it runnable."""

    name: str
    feasible: bool
    iteration_ms: float
    peak_bytes_per_stage: list[int]
    stages: list[StagePlan] = []


class Plan(Strict):
    schema_version: int = PLAN_SCHEMA_VERSION
    created_at: str
    model: FileRef  # launch refuses a plan whose model file changed
    profile: FileRef
    device: DeviceInfo  # where the profile was measured; the runtime reproduces its threads
    dtype: Dtype  # the profile's dtype
    profile_source: Literal["measured", "analytic", "fake"] = "measured"  # an analytic plan is exported, not launched
    setup: TrainSetup
    stages: list[StagePlan] = Field(min_length=1)
    predicted: PlanPredicted
    solver: SolverInfo
    baselines: list[BaselineResult] = []

    @model_validator(mode="after")
    def _stages_match_setup(self) -> Plan:
        if len(self.stages) != self.setup.pipeline.stages:
            raise ValueError(f"plan has {len(self.stages)} stages but setup.pipeline.stages is {self.setup.pipeline.stages}")
        if [stage.index for stage in self.stages] != list(range(len(self.stages))):
            raise ValueError("stage indices must be 0, 1, 2, ... in order")
        return self


# ---------------------------------------------------------------- run report


class StageMeasured(Strict):
    peak_bytes: int
    fwd_ms: float  # per microbatch, median
    bwd_ms: float  # per microbatch, median (includes recompute)
    time_ms: float  # fwd + bwd for one microbatch
    step_ms: float | None = None  # optimizer step, median over the timed steps
    static_bytes: int | None = None  # weights + grads + optimizer state on the device, the most at once in a step, largest dp rank
    host_bytes: int | None = None  # the offloaded optimizer's host memory, largest dp rank
    reserved_bytes: int | None = None  # cuda: torch.cuda.max_memory_reserved, largest dp rank


class StageReport(Strict):
    index: int = Field(ge=0, le=MAX_STAGES)
    cap_bytes: Bytes
    predicted: StagePredicted | None = None  # None when the plan's stage carried no prediction
    measured: StageMeasured


class RunReport(Strict):
    schema_version: int = SCHEMA_VERSION
    created_at: str
    plan: FileRef
    strategy: str = "ckplan"
    device: DeviceInfo  # device.threads: torch threads per rank
    # the profile's threads, cores / ranks, or --threads
    threads_source: Literal["plan", "cpu_count", "option"] | None = None
    backend: str
    steps: int = Field(ge=0, le=MAX_STEPS)
    warmup_steps: int = Field(ge=0, le=MAX_STEPS)
    microbatches: int = Field(gt=0, le=MAX_MICROBATCHES)
    iteration_ms: float  # median over measured steps
    iteration_ms_all: list[float]
    predicted_iteration_ms: float
    losses: list[float]
    stages: list[StageReport]


# ---------------------------------------------------------------- calibration


class PlacementFit(Strict):
    """What one pipeline run with `ranks` processes of `threads` torch threads each, on a
    machine of `cores` cores, measured against the profile's prediction."""

    ranks: int = Field(gt=0, le=MAX_RANKS)
    threads: int = Field(gt=0, le=1 << 16)
    cores: int = Field(gt=0, le=1 << 16)
    compute_scale: float = Field(ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)  # measured / profiled compute per stage
    cpu_sharing: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)  # fitted only when ranks share cores
    plan: str  # the plan that ran
    measured_iteration_ms: Ms
    predicted_before_ms: Ms  # the plan's iteration by the uncalibrated cost model
    predicted_after_ms: Ms  # and with these constants


class Calibration(Strict):
    """Time constants fitted to measurements by `ckplan calibrate`; `solve` reads them
    from the file beside the profile (<profile>.calibration.json)."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    profile: FileRef
    backend: str  # gloo, nccl
    device_type: Literal["cpu", "cuda"]
    send_latency_ms: float = Field(ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    send_gb_per_s: GbPerS | None = None
    action_overhead_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    placements: list[PlacementFit] = []
    notes: list[str] = []  # what was measured, how each constant was fitted
