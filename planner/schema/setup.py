"""The training setup in its parts: pipeline, data parallelism, training, time constants and links."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from planner.schema.fields import (
    CHUNKED_SCHEDULES,
    MAX_BYTES,
    MAX_LATENCY_MS,
    MAX_MICROBATCHES,
    MAX_MS,
    MAX_RANKS,
    MAX_SAMPLES,
    MAX_SCALE,
    MAX_STAGES,
    MIN_SCALE,
    GbPerS,
    Optimizer,
    Precision,
    Schedule,
    Strict,
)


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


class EpDispatchSetup(Strict):
    """A MoE block's dispatch and combine by DeepEP's or HybridEP's kernels (Megatron-core's flex dispatcher,
    fused_a2a.py): each token sent once to every EP rank holding one of its experts, `rank_copies` of its top-k
    copies (ep_dispatch_rates.ranks_per_token / k), the rank's own included, at the backend's published rates."""

    backend: Literal["hybridep", "deepep"]
    dispatch_gb_per_s: GbPerS
    combine_gb_per_s: GbPerS
    rank_copies: float = Field(gt=0, le=1)
    source: str = ""


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
    # the GPU NCCL's tuner sizes an all-reduce across nodes for (planner/cost/sizedreduce.py): its compute
    # capability x 10 and its NICs; 0: not known, the ring's bus rate alone
    nccl_capability: int = Field(default=0, ge=0, le=1000)
    nccl_nics_per_gpu: float = Field(default=0.0, ge=0, le=64, allow_inf_nan=False)
    dp_notes: list[str] = []  # where the bandwidths and the host step speed came from
    # expert parallelism: the routed experts split over groups of `ep` of the dp ranks (Megatron-LM's
    # --expert-model-parallel-size, torchtitan's expert_parallel_degree), each expert's state
    # replicated (and ZeRO-sharded) over the dp / ep ranks of its expert-data-parallel group
    ep: int = Field(default=1, gt=0, le=MAX_RANKS)
    # GB/s per rank of the tokens' all-to-all inside an expert-parallel group; None: not charged
    ep_gb_per_s: GbPerS | None = None
    # the flex dispatcher's backend (DeepEP / HybridEP) where it replaces the all-to-all: its own published rates
    # (planner/models/ep_dispatch_rates.py); None: NCCL's all_to_all_single at ep_gb_per_s
    ep_dispatch: EpDispatchSetup | None = None
    # Megatron-LM's data-parallel overlap (the runtime record's ddp_buckets; planner/cost/megatron_dp.py):
    # the gradient reduction issued bucket by bucket beside the backward (--overlap-grad-reduce; None: as the
    # runtime's record says, overlaps_grad_reduce), the distributed optimizer's parameter all-gather waited for
    # bucket by bucket in the next forward (--overlap-param-gather; else after the step, exposed), the buckets'
    # parameters (--ddp-bucket-size; None: megatron-core's max(40M, 1M x the dp·cp ranks)), the pipeline ranks'
    # reductions and (interleaved) gathers issued at once (--no-align-grad-reduce, --no-align-param-gather
    # turn them off), the first chunk's gather beside the optimizer step (--overlap-param-gather-with-optimizer-step)
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool = False
    bucket_params: int | None = Field(default=None, gt=0, le=MAX_BYTES)
    align_grad_reduce: bool = True
    align_param_gather: bool = True
    param_gather_with_step: bool = False
    # DeepSpeed ZeRO 3's ds_config knobs that set what stays gathered (planner/cost/deepspeed_zero3.py,
    # framework-facts §103, §105), elements; None: DeepSpeed's defaults (1e9, 5e7, 1e9)
    stage3_max_reuse_distance: int | None = Field(default=None, ge=0, le=1 << 62)
    stage3_prefetch_bucket_size: int | None = Field(default=None, ge=0, le=1 << 62)
    stage3_max_live_parameters: int | None = Field(default=None, ge=0, le=1 << 62)
    # ZeRO 3's contiguous gradient bucket, elements (framework-facts §124); None: DeepSpeed's default 5e8
    reduce_bucket_size: int | None = Field(default=None, ge=0, le=1 << 62)
    # DeepSpeed's activation checkpointing (deepspeed.checkpointing.configure; planner/cost/deepspeed_ckpt.py,
    # framework-facts §133): a whole-layer checkpoint's input copied to the host (cpu_checkpointing), split over the
    # tensor-parallel group (partition_activations), into preallocated buffers, and a synchronize at each boundary
    checkpoint_in_cpu: bool = False
    partition_activations: bool = False
    contiguous_checkpointing: bool = False
    synchronize_each_layer: bool = False
    # Megatron-FSDP's (ZeRO 3 under --runtime megatron; planner/cost/megatron_fsdp.py, framework-facts §114):
    # --fsdp-double-buffer (two units' weights and gradient buckets in fixed slots for the run) and
    # --suggested-communication-unit-size (elements; None: max(1e9, 2 x the mean unit's parameters))
    fsdp_double_buffer: bool = False
    suggested_communication_unit_size: int | None = Field(default=None, gt=0, le=1 << 62)

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

# DeepSpeed's activation-checkpointing settings (deepspeed.checkpointing.configure, DataParallelSetup's fields): only
# DeepSpeed's runtime runs them (planner/cost/deepspeed_ckpt.py reads them under it alone)
DEEPSPEED_CHECKPOINTING = ("checkpoint_in_cpu", "partition_activations", "contiguous_checkpointing",
                           "synchronize_each_layer")


def deepspeed_checkpointing_refused(given, runtime: str) -> str | None:
    """The sentence refusing DeepSpeed's checkpointing settings `given` (field names, in order) where the plan is
    scored for another runtime, which would ignore them; None where none is given or the runtime is DeepSpeed's."""
    names = [name for name in given if name in DEEPSPEED_CHECKPOINTING]
    if not names or runtime == "deepspeed":
        return None
    return (f"--{names[0].replace('_', '-')} is DeepSpeed's activation-checkpointing setting, and the plan is scored "
            f"for {runtime}'s runtime; drop it or give --runtime deepspeed")


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
    # whether the loss is compiled (torchtitan's compile.components: ["model"] leaves it eager, False;
    # ["loss"] compiles it alone, True with `compile` False); None: with the model, as `compile` says
    # (the runtime's version compiling it or not: its record's loss_compiled)
    compile_loss: bool | None = None
    # torchtitan's --activation_checkpoint.mode selective --selective_ac_option op: save every
    # other mm and the attention outputs (not modelled: refused)
    op_level_sac: bool = False
    # Float8 linears (torchtitan --float8 / torchao; Megatron --fp8-format) (not modelled: refused)
    float8: bool = False
    # FSDP2's all-gather of float8 weights (torchtitan --float8.enable_fsdp_float8_all_gather)
    fp8_all_gather: bool = False
    # context-parallel degree (Megatron --context-parallel-size, torchtitan context_parallel_degree)
    context_parallel: int = Field(default=1, ge=1, le=MAX_RANKS)
    # how the context-parallel ranks exchange K and V (Megatron --cp-comm-type p2p | allgather | a2a,
    # torchtitan's rotate method: allgather, or alltoall, which passes them rank to rank as p2p
    # does); None: the runtime's default (its record's cp_comm, planner/cost/runtimes.py)
    cp_comm: Literal["p2p", "allgather", "a2a"] | None = None
    # dtype of Adam's two moments (Megatron --exp-avg-dtype / --exp-avg-sq-dtype)
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    # torchtitan's chunked cross-entropy (ChunkedLossWrapper's num_chunks; 0: the loss on whole logits):
    # the LM head and the loss run per chunk of each sequence, each chunk's backward at once
    # (planner/cost/chunkedloss.py); plans written before hold false, read as 0
    chunked_cross_entropy: int = Field(default=0, ge=0, le=1 << 20)
    # multi-token-prediction modules (Megatron --mtp-num-layers) (not modelled: refused)
    mtp_layers: int = Field(default=0, ge=0, le=64)
    # expert tensor-parallel degree (Megatron --expert-tensor-parallel-size; None: the TP degree)
    expert_tp: int | None = Field(default=None, ge=1, le=MAX_RANKS)
    # Megatron-LM's --no-gradient-accumulation-fusion: each weight gradient written in bf16, then added
    # into the fp32 main_grad by the DDP hook (the runtime record's main_grad_hook; refused without one)
    unfused_grad_accumulation: bool = False
    # Megatron-LM's --log-params-norm and --log-num-zeros-in-grad: the parameters' norm and the
    # gradients' zeros read once a step (the record's logged_read_shard_bytes; refused where 0)
    log_params_norm: bool = False
    log_num_zeros_in_grad: bool = False
    # Megatron-LM's --timing-log-level: its timers above level 0 synchronize the device at each start and stop
    # (the record's timer_syncs; planner/cost/hosttime.py timer_sync_ms; refused where the record has none)
    timing_log_level: int = Field(default=0, ge=0, le=2)
    # Megatron-LM's --test-mode: each attention forward all-gathers its q/k norms over DP and TP and asserts them
    # equal on the host (the record's host_rest_linears "realtime_tests"; planner/cost/realtime_tests.py)
    test_mode: bool = False
    # Megatron-LM's --deterministic-mode: torch's deterministic algorithms, whose NaN fill of each
    # aten::empty writes Transformer Engine's outputs twice (the record's fills_te_outputs)
    deterministic: bool = False
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True at the launch (the allocator replay runs its rules);
    # None: as the runtime's own launch script sets it (its record's expandable_segments)
    expandable_segments: bool | None = None
    # Megatron-LM's --grad-reduce-in-bf16: the gradient buffer in bf16 (the record's bf16_grad_bytes; refused where 0)
    grad_reduce_bf16: bool = False
    # Megatron-LM's --cross-entropy-loss-fusion --cross-entropy-fusion-impl te: Transformer Engine's fused
    # cross-entropy (the record's te_cross_entropy loss region; refused where None)
    te_cross_entropy: bool = False
    # Megatron-LM's --transformer-impl local: Megatron-core's local spec, no Transformer Engine layer (the
    # record's local_spec_buffer: no TE workspace, DotProductAttention's global buffer kept; refused where False)
    local_layers: bool = False
    # Megatron-LM's --cross-entropy-loss-fusion (the native implementation): its own compiled cross-entropy (the
    # record's fused_cross_entropy loss region and fused_ce_bytes; refused where None)
    fused_cross_entropy: bool = False
    # Megatron-LM's --moe-grouped-gemm on Transformer Engine's layers: TE's grouped GEMM over a rank's experts,
    # which allocates the record's te_grouped_gemm_workspaces beside its plain workspace (refused where 0)
    te_grouped_gemm: bool = False
    # NCCL_ALGO=Ring and NCCL_PROTO=simple at the launch (Megatron-LM's functional tests' _run_training.sh): the
    # step's scalar all-reduces at Ring/Simple's latency, else at NCCL's tuner's pick (planner/cost/stepcomm.py;
    # refused where the runtime's record lists no step collectives)
    nccl_ring_simple: bool = False
    # NCCL_NVLS_ENABLE=0 at the launch (Megatron-Bridge's performance executor, Megatron-LM's functional tests): no
    # NVLink SHARP, neither its buffers (planner/cost/nccl_buffers.py) nor the tuner's NVLS (planner/cost/nccltuner.py)
    nccl_nvls_off: bool = False
    # Transformer Engine's FP8 current scaling (Megatron's --fp8-recipe tensorwise; with float8): under sequence
    # parallelism each column-parallel input's and row-parallel output gradient's amax all-reduced over the TP group
    # before its cast (planner/cost/comm.py amax_reduce_ms); False: delayed scaling, or not said
    fp8_current_scaling: bool = False
    # Transformer Engine's DelayedScaling (Megatron's --fp8-recipe delayed, its default; with float8): casts at the
    # scale the amax history gave, each writing its amax as it casts; the amaxes all-reduced once a forward and once
    # a backward (and once a recompute) over the amax group; the history buffers held (planner/cost/te_delayed.py)
    fp8_delayed_scaling: bool = False
    # --fp8-amax-history-len: each TE module's amax history rows; None: Megatron's default, 1
    fp8_amax_history_len: int | None = Field(default=None, ge=1, le=1 << 20)
    fp8_amax_tp_only: bool = False  # --tp-only-amax-red: the amax group is TP x CP, not TP x DP x CP


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
    # cpu: the torch threads a launch gives each rank, at which the optimizer step is charged (a profile's steps
    # at that count, LayerCost.step_at); None: as profiled
    rank_threads: int | None = Field(default=None, gt=0, le=1 << 16)
    calibration: str | None = None  # where those constants came from (file, when, placement)


TpOverlap = Literal["none", "async-tp", "tp-comm-overlap"]


class UbGemm(Strict):
    """One GEMM's userbuffers overlap as TE's initialize_ub makes it from a --tp-comm-overlap-cfg file
    (planner/models/configs/ub_cfg.py reads it; planner/cost/ub_sms.py charges the SMs it takes)."""

    method: Literal["ring_exchange", "pipeline", "bulk"]
    num_sm: int = Field(ge=1, le=1 << 16)
    set_sm_margin: bool
    use_ce: bool = True  # a ring exchange's peer copies on the copy engines (else on num_sm SMs)
    aggregate: bool = False  # a ring-exchange all-gather's two chunks a GEMM (planner/cost/ub_ring.py)


class CommSetup(Strict):
    """The links the layers' tensor-parallel collectives and the pipeline's sends cross
    (planner/cost/comm.py): bandwidth per rank (GB/s, the collective's bus bandwidth) and NCCL's
    latency per collective and per ring step. Filled from the GPU's links, --gpus-per-node and --nvlink-domain by
    the commands (comm.default_comm); the defaults charge nothing (plans made before)."""

    tp: int = Field(default=1, gt=0, le=MAX_RANKS)  # the tensor-parallel group the profile's collectives run in
    tp_gb_per_s: GbPerS | None = None  # None: tensor-parallel collectives not charged
    tp_step_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    # the pipeline's sends between neighbouring stages when `ckplan calibrate` measured none
    # (TimeConstants.send_gb_per_s wins where given); None: not charged
    pp_gb_per_s: GbPerS | None = None
    pp_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    # where pp_stride is set (the global ranks between a stage's rank and its peer on the next stage: tp x cp
    # x dp), each send crosses the link of its own edge: pp_gb_per_s / pp_latency_ms where both ranks share a
    # node, these where they lie in two (comm.edge_crosses_nodes); 0: every send over the one link above
    pp_stride: int = Field(default=0, ge=0, le=MAX_RANKS)
    pp_network_gb_per_s: GbPerS | None = None
    pp_network_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    collective_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)  # NCCL's base
    # NCCL's ring step inside a node (NVLink's or PCI's), which a ring across nodes runs all but its network steps at
    # (comm.ring_latency_ms); None: every step of a group across nodes at the network's (plans made before)
    node_step_latency_ms: float | None = Field(default=None, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    gpus_per_node: int = Field(default=8, gt=0, le=1 << 12)  # GPUs a host runs (--gpus-per-node)
    # GPUs in one NVLink domain, which the links are placed by (planner/models/topology.py); None: the host's (plans
    # made before, whose gpus_per_node was the domain)
    nvlink_domain: int | None = Field(default=None, gt=0, le=1 << 12)
    # a runtime setting that overlaps the tensor-parallel collectives with the matmuls (the runtime
    # record's tp_overlap, planner/cost/runtimes.py, says which runtime has which); "none": every collective on the critical path
    tp_overlap: TpOverlap = "none"
    # under tp-comm-overlap: the userbuffers config TE runs (planner/cost/ub_sms.py CONFIGS by name, or a file's path
    # with its GEMMs in ub_gemms; None: TE's defaults) and the GPU's SMs its communication takes from the GEMMs (0: not
    # charged)
    ub_cfg: str | None = None
    ub_gemms: dict[str, UbGemm] | None = None  # a --tp-comm-overlap-cfg file's, per GEMM (None: ub_cfg's by name)
    gpu_sms: int = Field(default=0, ge=0, le=1 << 16)
    # the rate TE's reduce kernel sums a ring-exchange reduce-scatter's tp partial chunks at (planner/cost/ub_sms.py
    # ring_reduce_bytes), and its buffer copies run at (buffer_copy_bytes); None: not charged (plans made before)
    ub_reduce_gb_per_s: GbPerS | None = None
    # AsyncTP's and TE's ring exchange's peer copies (copy-engine copies between two peers, planner/models/
    # copy_engines.py): GB/s a direction; None: charged at tp_gb_per_s, NCCL's ring (no copy rate published for
    # the GPU, or a group across nodes)
    tp_copy_gb_per_s: GbPerS | None = None
    # the context-parallel group the profile's attention exchange runs in (its ranks lie tp apart:
    # Megatron-LM's order tp-cp-ep-dp-pp, torchtitan's mesh ... cp, tp), its bandwidth per rank and
    # NCCL's latency per step; None: not charged (planner/cost/contextparallel.py)
    cp: int = Field(default=1, gt=0, le=MAX_RANKS)
    cp_gb_per_s: GbPerS | None = None
    cp_step_latency_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    comm_notes: list[str] = []  # where the links came from

    @property
    def domain(self) -> int:
        """GPUs one NVLink domain holds: a collective inside it runs over NVLink, one past it over the NICs."""
        return self.nvlink_domain or self.gpus_per_node


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

    @model_validator(mode="after")
    def _deepspeed_checkpointing_under_deepspeed(self) -> TrainSetup:
        given = [name for name in DEEPSPEED_CHECKPOINTING if getattr(self.data_parallel, name)]
        refused = deepspeed_checkpointing_refused(given, self.training.runtime)
        if refused:
            raise ValueError(refused)
        return self

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
