"""What a runtime's record says (planner/cost/runtimes.py holds one per runtime): each field of RuntimeFacts is one
fact about what a framework holds, in which dtype and when it frees, or how it overlaps and replays; LossRegion is the
loss's memory as multiples of the bf16 logits. A record carries, per field, the file and version the fact was read from
(`sources`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.cost.runtime_loss import LossRegion  # noqa: F401  read as runtime_facts.LossRegion by callers


@dataclass(frozen=True)
class RuntimeFacts:
    """What one framework's code holds. Values are per parameter on one rank before sharding (bf16-mixed precision)
    unless said; the file and version of each are in `sources`. The facts under fp16-mixed are fields of their own
    (runtime_fp16.py reads them)."""

    name: str
    version: str  # the version these facts were read at (a runtime_version the setup may name)

    # -- gradient dtype and buffers, weight / gradient / optimizer shards (bf16-mixed)
    grad_bytes: int
    """Bytes per parameter of the gradient the runtime accumulates into under bf16-mixed:
    Megatron-LM's fp32 main_grad buffers (4), FSDP2's reduce_dtype fp32 (4), torch's bf16 .grad (2)."""
    shard_weight_bytes: int
    """Bytes per parameter of the weights a rank's shard (or replica) holds: 2 for bf16 params beside
    an fp32 master in the optimizer; 4 where the fp32 parameter is itself the master (FSDP2 with a
    MixedPrecisionPolicy: the sharded parameter stays fp32, cast to bf16 when gathered)."""
    master_bytes: int
    """Bytes per parameter of a separate fp32 master copy in the optimizer (0: the parameter is it)."""
    zero1_whole_tensors: bool
    """ZeRO 1 gives each rank whole tensors (torch's ZeroRedundancyOptimizer), so a stage's largest
    tensor may be held whole; False where flat buffers are split evenly, cutting through tensors."""
    grads_allocated_at_first_backward: bool
    """The whole gradients a pipeline stage keeps between microbatches are allocated at its first backward and freed
    at its last, by its reduce-scatter (planner/cost/gradtiming.py); False where they are held all iteration."""
    zero_as_fsdp2: bool
    """Any ZeRO stage runs as FSDP2 (ZeRO 3): beside a pipeline weights and gradients stay whole until
    the last backward, without one they are resharded after every forward."""

    # -- optimizer scratch
    adam_step_scratch: bool
    """Adam's step allocates sqrt(v) as a new tensor per parameter (torch's foreach Adam); False for
    fused multi-tensor kernels that update in place."""

    # -- the loss region
    loss: LossRegion
    """The loss the runtime runs, eager, on logits whole over the vocabulary."""
    loss_vocab_parallel: LossRegion
    """The loss on vocab-parallel logits (TP > 1)."""
    loss_compiled: LossRegion | None
    """The loss under torch.compile where the runtime compiles it with the model (None: it does not)."""
    # -- torch.compile (--compile; read by runtimes.refused_settings)
    compiles_model: bool
    """The runtime has a setting that torch.compiles the model's layers (torchtitan's compile.enable,
    each TransformerBlock); False: it runs them eager whatever its config says, and --compile is refused, saying `runs_instead`."""
    runs_instead: str
    """What the runtime runs in place of a compiled model (the refusal of --compile says it); empty where it compiles."""
    # -- saved tensors under TP/SP
    tp_saves_gathered_input: bool
    """Under TP with sequence parallelism the column-parallel linears save their all-gathered input
    whole (DTensor's ColwiseParallel redistributes to Replicate), not the 1/TP sequence shard."""
    # -- pipeline buffers
    stage_input_in_receive_buffer: bool
    """The stage's first layer saves its receive buffer (or the batch slice) itself: the input is
    charged once, with the buffers (torch.distributed.pipelining)."""
    input_receive_buffers: str
    """Receive buffers for a stage's input: "per-microbatch" (one per microbatch of the step), "one"
    (one at a time, with the gradient being sent), "pipe-buffers" (DeepSpeed's num_pipe_buffers + 1)."""
    output_grad_buffers_per_microbatch: bool
    """One receive buffer per microbatch for the gradient of the stage output (else one at a time)."""
    frees_sent_output: bool
    """A stage output's storage is freed once sent (Megatron-LM's deallocate_output_tensor)."""
    batch_held: str
    """The data the schedule holds: "whole-batch" (inputs on the first stage, targets on the last),
    "in-flight-targets" (a microbatch per forward; the targets of those in flight on the last stage),
    "every-stage" (the whole batch on every stage), "pipe-buffers" (a microbatch per pipe buffer); with
    batch_positions, a positions tensor of the inputs' shape and dtype beside each microbatch's inputs."""
    sends_held_to_step_end: bool
    """Several stages per rank: each send's tensor is held until the step ends; GPipe: each backward's (gpipeheld.py)."""
    # -- recompute behaviour
    recompute_whole_forward: bool
    """Checkpointing reruns the layer's whole forward (no early stop)."""

    # -- overlap (read by communication time; issue 35)
    overlaps_grad_reduce: bool
    """Gradient reduction runs beside the backward (DDP buckets, overlap-grad-reduce, overlap_comm)."""
    prefetches_zero3_gathers: bool
    """ZeRO 3's weight all-gathers are prefetched beside the compute."""
    tp_overlap: str | None
    """The runtime's setting that overlaps TP's all-gathers / reduce-scatters with the matmuls, as `--tp-overlap`
    names it ("async-tp": torchtitan's AsyncTP; "tp-comm-overlap": Transformer Engine's userbuffers under
    Megatron-LM); None: it has none. Read only where the setup asks for it (planner/cost/comm.py)."""
    # -- workspaces
    cublas_workspace_bytes: int | None
    """cuBLAS workspace per handle the runtime's published runs configure (None: not sourced)."""
    tp_gathers_float8: bool = False
    """Under Float8 with TP and SP, a converted linear's input is cast to float8 before its sequence all-gather, so
    the input gathered whole (and saved for the weight gradient) is 1 B an element, not bf16 (torchao's
    Float8ColwiseParallel / PrepareFloat8ModuleInput; Transformer Engine's LayerNormLinear and a row-parallel Linear's
    grad_output under an FP8 quantizer; read by tpgathered.tp_gathered_input_bytes and comm.gathers_float8)."""
    async_tp_workspace: bool = False
    """Under its AsyncTP (tp_overlap "async-tp"), the fused ops stage each shard or partial in a symmetric-memory
    workspace per tensor-parallel group, mapped by the CUDA driver outside the caching allocator: device memory
    beside the reserved peak, not in it (planner/cost/asynctp.py symmetric_workspace_bytes)."""

    # -- context parallelism (planner/cost/contextparallel.py)
    cp_comm: str | None = None
    """How the runtime's ring attention passes K and V among the context-parallel ranks by default:
    "p2p" (each step sends the K/V it holds to the next rank while computing on it: Transformer
    Engine's AttnFuncWithCPAndKVP2P under Megatron-LM), "allgather" (K/V all-gathered once per pass,
    dK/dV passed on rank to rank in fp32: torch's context_parallel, which torchtitan runs); None: the
    runtime runs no context parallelism (refused)."""
    cp_repeats_kv: bool = False
    """The runtime's model repeats each K/V head over its query heads before calling attention
    (torchtitan's repeat_kv), so the ring exchanges, and its buffers hold, K and V as many heads
    wide as Q, and attention saves them so (planner/cost/repeatedkv.py); False: K and V at their own
    (grouped) heads."""
    cp_compiled_waits_at_issue: bool = False
    """Where the setup compiles the block, the compiled all-gather ring waits for each exchange where it
    issues it: tracing puts torch's wait_tensor right after the functional collective and inductor leaves
    it there (no compute-communication reordering by default), so the K/V all-gather and every fp32 dK/dV
    pass are exposed whole; False: each overlaps the attention as the eager ring runs it (the all-gather
    waited at step 1, each dK/dV pass after the next step's compute)."""
    rotary_table: str = ""
    """What the runtime's model holds of its rotary table, beside its weights (planner/cost/rotarytable.py):
    "model-chunk" (every model chunk a [seq_len, head_dim / 2] complex64 buffer, and under context parallelism
    without a pipeline torch's context_parallel's whole clone of it and its shards: torchtitan 9dec370); "": not
    read for this runtime (nothing charged)."""
    # -- the allocator's reserve
    step_replayed: bool = False
    """The allocator replay (planner/cost/reserve.py) orders this runtime's own step: its static
    allocations, the schedule's passes, the streams it allocates on. Where it does not (a framework
    whose step allocates on streams or in an order the replay does not run, e.g. FSDP2's all-gather
    and reduce-scatter streams), the reserve is the published fragmentation margin."""
    expandable_segments: bool = False
    """The runtime's launch sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the replay runs the
    allocator's expandable segments (allocator.CachingAllocator) on CUDA; ROCm builds ignored the
    setting until pytorch#173330 (GPU.rocm: the default segments there)."""
    expandable_segments_across_nodes: bool = False
    """Its launch of a job over several nodes sets them too (where False, a job larger than a node runs
    the default segments unless --expandable-segments says otherwise)."""
    megatron_step_replayed: bool = False
    """The allocator replay of Megatron-LM's step (planner/cost/reserve_megatron.py: the model's tensors freed
    into DDP's buffers, the optimizer's main shards, FusedAdam's state at the first step, the schedule's receive
    buffers, sent outputs and references) orders this runtime's step: one stage a rank, or several under its
    interleaved schedule (reserve_megatron_chunks.py), ZeRO 0 or 1 (reserve_megatron.replays), or
    Megatron-FSDP's step with its double buffer on one stage (reserve_megatron_fsdp.py); other setups keep
    the margin."""
    fsdp2_step_replayed: bool = False
    """The allocator replay of FSDP2's step (planner/cost/reserve_fsdp2.py: its all-gathers on the
    copy-in stream, its sharded gradients on the reduce-scatter stream) orders this runtime's step:
    one stage and one microbatch under ZeRO 3, or beside 1F1B / GPipe / interleaved 1F1B (several
    chunks a rank: fsdp2_chunks.py) with the weights and gradients kept whole (reserve_fsdp2.replays);
    other setups keep the margin."""
    # -- FSDP2 beside a pipeline (read by gathered.kept_reduce_scatter_input_bytes)
    keeps_last_reduce_scatter_input: bool = False
    """Beside torch's pipelining, FSDP2's communication context keeps the reduce-scatter input of
    the last group a stage reduces (its whole gradients in the reduce dtype) from the stage's last
    backward to the next step's: the pipeline's manual post-backward did not call the root's final
    callback that drops it (torch before pytorch#144535, 2025-01-10)."""
    final_norm_eager_fp32: bool = False
    """The model's final norm runs as eager fp32 ops outside any compiled region (torchtitan 9dec370's own RMSNorm:
    x.float(), pow, mean, rsqrt, a product, type_as, * weight), so it keeps x's fp32 copy and the bf16 normalised
    tensor and its backward makes [tokens / sp, hidden] fp32 tensors (planner/cost/eager_norm.py); else the analytic
    head's fused norm."""
    head_reduce_scatter_cat: bool = False
    """Under TP + SP the LM head runs eager and DTensor reduce-scatters its input's gradient on the sequence dimension
    through funcol, which makes `torch.cat(torch.chunk(x, t, 1))` first: a second whole [tokens, h] tensor beside the
    linear's, the logits' gradient released before it (planner/cost/head_scatter.py); else the record's head."""
    loss_requests_eager_ce: bool = False
    """The runtime's loss is torch's eager cross-entropy on the fp32 logits (under TP, loss_parallel's), so
    the FSDP2 replay plays its tensors as torch requests them (fsdp2_layers.loss_program, framework-facts
    §71); else the loss's scratch as its largest tensor repeated (a compiled or chunked loss)."""
    input_grads_held_to_step_end: bool = False
    """Beside torch's pipelining, each microbatch's input gradient stays on its receive buffer's `.grad`
    from that microbatch's backward to the next step's clear_runtime_states (torch before pytorch#164329,
    which drops it once handed to the send): a stage past the first holds one more per backward run
    (rules.held_input_grads). Else one at a time, the one being sent."""
    warmup_send_held: bool = False  # 1F1B: a warm-up send's output kept through the steady phase (warmupsend.py)
    loss_values_held: bool = False  # each microbatch's loss value kept to the step's end (lossvalues.py)
    reduces_after_last_backward: bool = False
    """Beside torch's pipelining, a stage's FSDP2 gradient reductions all run after its M-th backward,
    on the rank's compute stream's order: each group's post-backward waits for the previous group's
    reduce-scatter before its own copy-in, and the stage's input gradient is sent only after them. So
    no reduction hides behind the stage's backward, and each delays what follows it on the rank and
    its send (planner/cost/pipereduce.py); the last group's reduce-scatter alone is not waited for."""
    ddp_buckets: bool = False
    """Megatron-LM's DDP: its data-parallel collectives issued by bucket and model chunk where its code
    issues them, on one stream beside the compute, as the setup's overlap settings say (DataParallelSetup
    overlap_grad_reduce, overlap_param_gather, ...): planner/cost/megatron_dp.py places them in the
    schedule's simulation (ZeRO 0 and 1; its FSDP is not read so)."""
    multi_schedule_lockstep: bool = False
    pipeline_schedules: tuple[str, ...] = ("1F1B",)
    """The pipeline schedules the framework runs (ckplan's names: 1F1B, GPipe, interleaved-1F1B, ZB, ZBV,
    DualPipeV): what `ckplan search` may put in its space (planner/solve/degrees.py; its default space takes
    1F1B and, where listed, interleaved-1F1B)."""
    stage_sends_beside: str = "none"
    """Which pipeline sends of a schedule of several stages a rank its steady state posts and waits for only
    after the next compute ("backward": the input gradients; "both": the outputs too): none of its rank's
    passes, the receiver waits for them (planner/cost/stagesends.py; docs/framework-facts.md §214-§216)."""
    """Torch's schedules of several stages a rank run by time steps, each step's sends and receives
    one batch waited before the next step (torch 2.6.0's PipelineScheduleMulti; the runtime of
    later torch waits for a receive only where an action needs it): schedule_time.simulate_lockstep."""
    # -- after the optimizer step (planner/cost/afterstep.py: static memory as Megatron logs it)
    keeps_last_input_and_grad: bool = False
    """Each model chunk past the pipeline's first keeps its last microbatch's input (the model's
    set_input_tensor) and that input's gradient (retain_grad) from its last backward to its next
    forward: two stage inputs a chunk, allocated after the step."""
    te_cublas_workspace: bool = False
    """The runtime's layers are Transformer Engine's, whose cuBLAS workspace is allocated once
    through torch's caching allocator (afterstep.TE_WORKSPACE_*)."""
    local_spec_buffer: bool = False
    """The runtime has Megatron-core's local spec (Megatron-LM's --transformer-impl local, TrainingSetup.local_layers):
    no Transformer Engine layer, so none of TE's cuBLAS workspace; its DotProductAttention takes baddbmm's input
    from the global memory buffer, made at the first forward at the attention scores' size and kept, which the
    sequence-parallel linears' gathered input shares (afterstep.global_buffer_bytes). False: not read,
    --transformer-impl local refused."""
    output_layer_buffer: bool = False
    """The output layer is the runtime's own column-parallel linear under every layer spec (Megatron-core's
    ColumnParallelLinear, not TE's), which under sequence parallelism at TP > 1 all-gathers its input into the
    global memory buffer (name "mpu") and keeps it: seq / CP x micro-batch x hidden in the activations' dtype on
    the rank holding the last stage, from its first forward (afterstep.global_buffer_bytes)."""
    te_ub_keeps_plain_workspace: bool = False
    """Under TE's userbuffers, whether the plain workspace stays allocated beside the te_ub_workspaces one (TE 2.16:
    get_cublas_workspace lru-caches them apart); False: the te_ub_workspaces one in its place (TE v2.9's
    initialize_ub replaces the plain one by its repeat, module/base.py 278-286)."""
    te_ub_workspaces: int = 0
    """Under Transformer Engine's userbuffers (the setup's tp_overlap "tp-comm-overlap" at TP > 1), the workspaces
    of TE's size its overlapped GEMMs take in one allocation kept beside the plain one (te_userbuffers.py); 0: none
    charged."""
    te_grouped_gemm_workspaces: int = 0
    """Where the setup runs Transformer Engine's grouped GEMM over the experts (TrainingSetup.te_grouped_gemm:
    Megatron-LM's --moe-grouped-gemm on TE's layers), the workspaces of TE's size it allocates once beside the
    plain one, one per compute stream its grouped GEMM spreads the experts' GEMMs over; 0: not read, refused."""

    # -- the step beside the optimizer (read by rules.step_checks_ms; issue 35)
    step_whole_bytes: int = 0
    """Bytes per parameter of the stage the runtime reads once a step beside the optimizer, over
    the whole (unsharded) gradients: Megatron-LM's NaN check of every bucket before the reduction, and the
    gradient buffer zeroed at the step's start."""
    step_shard_bytes: int = 0
    """The same per parameter of the rank's optimizer shard: Megatron-LM's gradient-clipping norm
    (4) and the copy of the fp32 main parameters into the bf16 parameter buffer (read 4, write 2)."""
    reduce_scatter_prepass_bytes: int = 0
    """Bytes per parameter the runtime moves over each whole gradient on the device before its reduce-scatter, every
    reduction (planner/cost/deepspeed_step.py): DeepSpeed v0.6.2's reduce_scatter_coalesced divides it in place by the
    ranks first (read 2, write 2); 0: none."""
    partition_check_bytes: int = 0
    """Bytes per element of each reduced gradient partition the runtime's ZeRO 3 hooks read and write to test it for
    inf and NaN, every microbatch (planner/cost/deepspeed_grads.py): DeepSpeed v0.6.2's isinf and isnan, each
    reading the bf16 partition and writing, then reading, a bool (8); 0: none."""
    regathers_persistent: bool = False
    """Whether ZeRO 3 gathers its persistent parameters (those under stage3_param_persistence_threshold) again after
    the optimizer step, one all-gather each, then synchronizes (planner/cost/deepspeed_step.py); False: not read."""
    waits_offloaded_grad_copy: bool = False
    """Whether, under the optimizer's offload, each reduced gradient partition reaches the host by a blocking copy on
    the reduce stream inside the backward's gradient hook, so the host issues nothing more until that reduce-scatter
    is done (DeepSpeed v0.6.2 __partition_grads; planner/cost/deepspeed_waits.py); False: not read."""
    offload_step_serial_zero: tuple[int, ...] = ()
    """The ZeRO stages at which the runtime's offloaded step runs its host step and the weights' copy back one after
    the other (DeepSpeed v0.6.2's ZeRO 3: a sub-group's CPU Adam, then its fp16 copy), the default of --offload-copies
    there; (): not read, ckplan's overlapped chunks (planner/cost/dataparallel.py offload_ms)."""
    # -- settings Megatron-LM's functional tests run (read by planner/cost/jobsettings.py; issue 35)
    main_grad_hook: bool = False
    """Whether the runtime's hook on each parameter's AccumulateGrad takes the gradient autograd made into its own
    main_grad (Megatron-LM's DDP adds it, Megatron-FSDP copies it into its bucket): where its fused weight-gradient
    accumulation is off (--no-gradient-accumulation-fusion) every weight's gradient takes it, an embedding's always.
    False: not read, the setting refused. The bytes are the setup's (jobsettings.hook_bytes: the gradient's and
    main_grad's dtypes, the add or the copy), less the `.grad` add the profile timed (beyond_profile_bytes)."""
    wgrad_in_gemm: bool = False  # linears' weight gradients accumulated inside the GEMM, none fresh (freshgrads.py)
    fills_te_outputs: bool = False
    """Under deterministic mode (torch.use_deterministic_algorithms) the runtime's layers allocate their
    GEMM, norm and attention outputs through aten::empty, which then writes NaN into each first
    (Transformer Engine); False: not read, --deterministic-mode refused."""
    deterministic_attention: str | None = None
    """Which attention the runtime's layers run under deterministic mode (planner/cost/jobsettings.py
    deterministic_attention_kernel): "transformer-engine" (Transformer Engine's choice: cuDNN's fused attention
    with its deterministic backward on sm90, and on sm100+ without attention dropout; FlashAttention-2 with its
    deterministic backward below sm90 and on sm100+ under attention dropout); None: not read, the attention
    timed as the profile's."""
    host_block_linears: tuple[tuple[str, float, float], ...] = ()
    """The host's time to issue a dense block's forward and its backward, each in torch Linear forwards (the unit
    GPU.host_call_us publishes; planner/cost/hosttime.py), by the profile's attention kind ("flash": the fused
    kernel; "eager": the s x s scores through torch ops), and a MoE block's ("moe", read for flash attention):
    Megatron-core's TE layer spec blocks as measured by scripts/bench_host.py; a kind not listed (or none): not
    read, no host floor."""
    host_rest_linears: tuple[tuple[str, float, float], ...] = ()
    """The host's time for the step outside the blocks, in torch Linear forwards (planner/cost/hosttime.py): per
    microbatch "embedding", "output" (final norm and output layer) and "loss" (the runtime's loss and its checks),
    each (forward, backward); per step "step" (per parameter tensor, fixed): the optimizer step's and the logged
    norms' host work as scripts/bench_host_step.py measures Megatron-LM's; none: not read, nothing charged."""
    timer_syncs: tuple[tuple[str, int, str], ...] = ()
    """Timers that synchronize the device at start and stop: (name, the level from which real, "microbatch" (each stage) or "step"); none: no timing level (refused)."""
    step_collectives: tuple[tuple[str, str, str], ...] = ()
    """The scalar all-reduces the runtime's optimizer step and its logging make once a step, each latency-bound
    (planner/cost/stepcomm.py): (what, its group, the TrainingSetup flag that turns it on, "" for every step); the
    groups "grad_stats" (the whole world under a distributed optimizer, else the model-parallel group),
    "model_parallel" (tp x pp), "dp_cp" (dp x cp), "expert_dp" (the expert-data-parallel group); none: not read."""
    vocab_parallel_ce_bytes: int = 0
    """Bytes a bf16 logit moves through the runtime's own unfused cross-entropy, forward and backward, which the
    cost model charges in place of an analytic profile's eager loss (planner/cost/megatron_loss.py): Megatron-LM's
    vocab-parallel cross-entropy, 52; 0: not read, the profile's loss as timed."""
    ce_fill_bytes: int = 0
    """Bytes a logit of that loss's tensors allocated through aten::empty (its fp32 copy of the logits, the
    gradient's cast back to bf16), which deterministic mode fills with NaN first; 0: none, or not read."""
    fused_ce_bytes: int = 0
    """Bytes a bf16 logit the runtime's own fused (compiled) cross-entropy moves, forward and backward
    (Megatron-LM's --cross-entropy-loss-fusion, native: planner/cost/megatron_loss.py); 0: not read."""
    side_communicators: bool = False
    """Whether a rank also runs collectives in communicators of its own beyond its PP/DP/EP/TP groups: Megatron-LM's
    world group (barriers), its model-parallel group (the gradients' norm) and TE's context-parallel ring peers
    (planner/cost/nccl_buffers.py megatron_communicators); False: none read."""
    te_ce_bytes: int = 0
    """Bytes a bf16 logit Transformer Engine's fused cross-entropy moves, forward and backward (Megatron-LM's
    --cross-entropy-fusion-impl te, the te_cross_entropy region: planner/cost/megatron_loss.py); 0: not read."""
    logged_read_shard_bytes: int = 0
    """Bytes per parameter of the rank's optimizer shard each logging read moves once a step
    (Megatron-LM's --log-params-norm over the fp32 main parameters, --log-num-zeros-in-grad over the
    fp32 main gradients); 0: not read, refused."""
    nccl_version: str = "2.27.7"
    """The NCCL whose tuning tables the job's tuner runs (planner/cost/sizedreduce.py: "2.21.5" or "2.27.7")."""
    zero1_all_reduces: bool = False
    """Under ZeRO 1 the runtime all-reduces the whole gradients over the data-parallel group and each rank
    steps its shard of them (DeepSpeed's PipelineEngine with its BF16_Optimizer: ReduceGrads runs
    buffered_allreduce_fallback), where False reduce-scatters them: twice the bytes over the link."""
    hp_grad_accumulate_bytes: int = 0
    """Bytes per parameter the runtime's optimizer moves after every microbatch's backward to add the bf16
    gradients into whole fp32 gradients of its own (DeepSpeed's BF16_Optimizer.update_hp_grads, called by
    its PipelineEngine after each backward: `hp_grad.add_(lp.grad.to(float32))`, a cast into a new fp32
    tensor, read 2 write 4, then the add, read 4 + 4 write 4: 18); 0: the backward accumulates where the
    profile's gradient lives (planner/cost/hpgrads.py)."""
    hp_grad_bytes: int = 0
    """Bytes per parameter of gradients the runtime's optimizer keeps beside the grad_bytes ones all iteration,
    whole on every rank whatever it shards (DeepSpeed 56c52238's BF16_Optimizer: one flat fp32 gradient per
    parameter group, `fp32_groups_gradients_flat`, which update_hp_grads adds each microbatch's bf16 .grad into
    and the data-parallel all-reduce reduces: 4); 0: the gradient grad_bytes counts is the only one
    (dataparallel.bytes_per_param)."""
    hp_grad_cast_bytes: int = 0
    """Bytes per parameter of the one parameter's temporary the runtime's optimizer allocates after each
    microbatch's backward to add its gradient into hp_grad_bytes' (BF16_Optimizer.update_hp_grads:
    `lp.grad.to(float32)`, a new fp32 tensor a parameter at a time: 4), beside the microbatches still in flight
    (hpgrads.cast_moment_bytes); 0: none."""
    bf16_zero: int | None = None
    """Under bf16-mixed with data parallelism, the one ZeRO stage (as ckplan counts them) the runtime's optimizer
    runs whatever its config names: DeepSpeed 56c52238 beside its pipeline runs BF16_Optimizer at ZeRO 0, which
    shards the fp32 master and Adam's states over the data-parallel ranks (ckplan's ZeRO 1), raises for bf16 at
    ZeRO 1 and asserts against 2 and 3 (1); None: the stage the setup gives (runnable.zero_refused)."""
    accumulates_without_pipeline: bool = True
    """Several microbatches a step on one stage (gradient accumulation) are run: torchtitan 9dec370 and bbb1b616
    take one batch a step without a pipeline (runnable.accumulation_refused)."""
    accumulated_batch: str = "whole"
    """What that loop holds of the step's batch (rules.batch_bytes): "whole" (as batch_held says), "current" (one
    microbatch's inputs and targets at a time), "inputs" (every microbatch's inputs to the step's end, the current
    one's targets)."""
    ties_across_stages: bool = True
    """Tied weights may sit on several stages, their gradients summed (False: refused, runnable.tied_refused)."""
    pipeline_max_zero: int | None = None
    """The highest ZeRO stage the runtime runs beside a pipeline of more than one stage (DeepSpeed edaa7221's
    PipelineEngine asserts stage < 2: 1); None: any (runnable.data_parallel_refused)."""
    shard_group_zero: tuple[int, ...] | None = None
    """The ZeRO stages at which the runtime shards over a group of fewer ranks than the data-parallel ones
    (DeepSpeed: none, (): MiCS, its ZeRO 3 group, was removed in 0.19.8); None: any stage
    (runnable.data_parallel_refused)."""
    reduce_cast_bytes: int = 0
    """Bytes per parameter the runtime's data-parallel reduction allocates at the step beside the held state: a
    copy of each flat gradient group in the communication dtype, all-reduced and copied back (DeepSpeed
    56c52238's allreduce_bucket: `tensor.to(communication_data_type)` of the whole fp32 group, bf16: 2;
    stepscratch.layer_step_scratch_bytes); 0: reduced where held."""
    # -- Float8 (--float8, --fp8-all-gather; planner/cost/float8.py)
    float8: str | None = None
    """The Float8 linears the runtime runs, whose GEMMs and casts the cost model times ("torchao":
    torchtitan's Float8Linear, tensorwise; "transformer-engine": Megatron-LM's TE layers under
    --fp8-format, tensorwise current or delayed scaling); None: not read, --float8 is refused."""
    float8_memory: bool = False
    """The Float8 linears' memory is read (torchao's saved float8 weight and its casts); False:
    memory is charged as the bf16 layers' and the command says so."""
    float8_saves_input: bool = False
    """A tensorwise Float8 linear saves the float8 cast of its input for the weight gradient, so the
    backward casts no saved input again (torchao eab345c); False: it saves the bf16 input and casts
    it again (torchao v0.11.0), or the Float8 record's own rule (Transformer Engine). Read by
    planner/cost/float8.py (Float8Linears.bwd_input_recast_ms)."""

    # -- the layers' kernels (read by planner/cost/fusedkernels.py; issue 35)
    # -- Megatron-LM's DDP and TE's settings the Megatron-Bridge recipes run (planner/cost/fp8params.py)
    bf16_grad_bytes: int = 0
    """Bytes per parameter of the gradient buffer where the job reduces gradients in bf16 (Megatron-LM's
    --grad-reduce-in-bf16: grad_reduce_in_fp32 False, main_grad in the parameter's dtype, bf16: 2); 0: not
    read, the setting refused."""
    bf16_grad_step_copy_bytes: int = 0
    """Bytes per parameter of the optimizer's shard that the step allocates beside bf16 gradients: Megatron-LM's
    distributed optimizer sets each fp32 main parameter's .grad to an fp32 copy of its bf16 shard (4), held
    until the next zero_grad; 0: none."""
    # -- fp16 with a loss scaler (TrainingSetup.precision fp16-mixed; planner/cost/runtime_fp16.py)
    fp16_grad_bytes: int = 0
    """Bytes per parameter of the gradient accumulated and reduced under fp16-mixed (Megatron-LM's fp16 main_grad
    buffer, DeepSpeed's fp16 partitions: 2); 0: the runtime trains no fp16, refused saying its source."""
    fp16_grad_step_copy_bytes: int = 0
    """Bytes per parameter of the rank's shard of the step's fp32 copy of those gradients, held past the step to the
    next zero_grad (Megatron-LM's main_param.grad = main_grad.float(): 4); 0: none beside what bf16 holds."""
    fp16_scaler_bytes: int = 0
    """Bytes per parameter of the rank's shard the loss scaler's step reads and writes beyond bf16's (Megatron-LM:
    the fp16-to-fp32 gradient copy, 2 + 4, and the unscale with its found-inf check, 4 + 4: 14)."""
    fp16_step_collectives: tuple[tuple[str, str, str], ...] = ()
    """The loss scaler's scalar all-reduces at the step beyond bf16's, as step_collectives names them."""
    fp16_min_zero: int = 0
    """The lowest ZeRO stage whose fp16 optimizer was read (DeepSpeed: 1, ZeRO 0 runs FP16_Optimizer); below it refused."""
    fp8_param_bytes: int = 0
    """Bytes per Float8 linear's weight parameter a rank holds where the weights are kept in FP8 (Megatron-LM's
    --fp8-param-gather: TE Float8Tensor parameters in a uint8 parameter buffer, 1); 0: not read, refused."""
    fp8_param_transpose_bytes: int = 0
    """Beside them, on a GPU whose FP8 GEMMs take only the TN layout (Hopper), the Float8Tensor's transpose TE
    creates for the backward's GEMMs and keeps on the parameter (1); Blackwell uses the one copy for both."""
    batch_positions: bool = False  # the batch holds positions beside its inputs (batch_held)
    te_weight_workspace_bytes: int = 0
    """Under Transformer Engine's Float8 without FP8 parameters, the FP8 copy of each Float8 linear's weight TE
    caches across microbatches (its "weight" workspace), bytes per weight parameter beside the bf16 one (1; its
    transpose on Hopper, fp8_param_transpose_bytes, beside it); 0: not read."""
    te_float8_saved_inputs: bool = False
    """Under Transformer Engine's Float8 (tensorwise) the linears save their inputs quantized, 1 B an element
    (the column-parallel ones under sequence parallelism keep the row-wise copy for the backward's all-gather,
    and on Hopper its transpose too), where a bf16 linear saves 2: planner/cost/float8.py te_saved_inputs_delta."""
    fused_swiglu_saves_input_only: bool = False
    """The runtime's SwiGLU is one fused function that saves only its input (the first linear's 2f-wide output)
    and recomputes SiLU in its backward, so a dense block keeps no SiLU output (planner/cost/te_kept.py); False:
    the eager ops' tensors, as the analytic profile counts them."""
    te_window_offload: bool = False
    """The layers' activation offload (the `offload` option on a block's first N layers) is Transformer Engine's
    window handler, as megatron-core runs it under --cpu-offloading: each layer's whole saved set (its input too)
    moves, group i held on the device from layer i to layer window[i], each copy beside its window's compute
    (planner/cost/te_offload.py); False: ckplan's per-layer option (the input kept, each layer's copies beside
    its own passes: planner/profiler/analytic_kept.offload_option)."""
    te_window_handler: str = "v2.9"
    """The TE handler running the window: "v2.9"'s group map or "v2.10"'s synchronizer (te_offload.window_map)."""
    offload_refuses_pipeline: bool = False
    """The runtime refuses the layers' activation offload beside pipeline parallelism (megatron-core's
    TransformerConfig raises under --cpu-offloading with PP > 1): no plan of more than one pipeline stage offloads
    a layer (useful.useful_options, runnable.offload_refused); False: offload beside a pipeline as charged."""
    te_moe_experts_kept: bool = False
    """A MoE layer keeps what megatron-core's TEGroupedMLP under the alltoall dispatcher keeps: the experts' input,
    linear_fc1's output and the activation's output, the fused router's and aux loss's intermediates and routing map,
    no copy of the dispatched or combined tokens (planner/cost/te_moe_kept.py); False: the analytic profile's mixture."""
    te_router_scores: str = "logits"
    """The dtype TE's fused router and aux-loss score kernels save their intermediate in: "logits" (the router
    logits', TE v2.9-v2.12) or "fp32" (TE v2.13 on); read by te_moe_kept.py."""
    chunked_loss: bool = False
    """The runtime's config can run the loss over chunks of each sequence, the LM head's forward and
    backward per chunk inside the loss (torchtitan 0.3.0's ChunkedLossWrapper: planner/cost/chunkedloss.py);
    False: it has no such loss (--chunked-cross-entropy refused)."""
    te_cross_entropy: LossRegion | None = None
    """The loss region of Transformer Engine's fused cross-entropy (Megatron-LM's --cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te): the gradient written in place into the logits, which the output layer's
    backward receives (grad_in_logits); None: not read, refused."""
    fused_cross_entropy: LossRegion | None = None
    """The loss region of the runtime's own fused cross-entropy (Megatron-LM's --cross-entropy-loss-fusion with
    the native implementation: megatron/core/fusions/fused_cross_entropy.py, its functions torch.compile'd);
    None: not read, refused."""

    fused_kernels: str | None = None
    """Which fused kernels the runtime's layers run for their norms, rotary and activations:
    "transformer-engine" (Megatron-core on TE's layers: LayerNormLinear's norm, TE's fused rotary, the
    fused bias-SwiGLU / bias-GELU), read from a profile's `te_time`; None: the profile's passes as
    they are (the model code's own ops)."""

    # -- pipeline outputs (read by rules.held_outputs_bytes, chunked.sends_held_bytes)
    outputs_held_to_step_end: str = "none"
    """Which stages' outputs the schedule keeps for every microbatch until the next step begins
    (torch.distributed.pipelining's `output_chunks`, merged and returned by `step()`): "every-stage"
    (torch before pytorch#153383, 2025-05-13, appended every stage's), "last-stage" (the last
    stage's, the logits where the schedule applies the loss: torch since then, when `step()`
    returns its outputs), "none" (the runtime asks for none back: `return_outputs=False`, or its
    own schedules keep no outputs). A microbatch's output is among its activations until its
    backward; from then on only this keeps it (planner/cost/rules.py held_outputs_bytes)."""
    logits_held_in_backward: str = "always"
    """Whether the last stage's output, the logits, stays referenced while the stage's layers run their
    backward: "always" (the schedule holds it: torch.distributed.pipelining's backward_one_chunk keeps the
    stage output it pops from fwd_cache to the end of that backward; DeepSpeed's pipe buffers), "pipeline"
    (only beside a pipeline: torchtitan's train step deletes `pred` before `loss.backward()` without one and
    runs torch's pipelining with one), "never" (Megatron-LM: the GPT model returns the loss, the logits are
    dropped once it is made). Where not held, the 1x of the loss region's kept bytes the stage output
    carries is the loss's, freed with it before the output layer's backward (rules.logits_in_loss_kept)."""
    # -- FSDP2's units (planner/cost/fsdpunits.py; read by gathered.unsharded_bytes and fsdp_unit_*_bytes)
    fsdp_units: str = "largest-layer"
    """How ZeRO 3's units group the model's layers, and so what is gathered when: "largest-layer" (the
    buffer term measured on ckplan's runtime, where every layer is its own unit: the model's largest
    layer's, charged at every moment; kept by the runtimes whose ZeRO was not read as units),
    "per-layer" (every layer its own unit, charged per moment), "root-ends" (the model's first and
    last layers one root unit, every other layer its own, charged per moment), "submodules" (DeepSpeed's
    coordinator: each submodule gathered as it runs, released by reuse distance; planner/cost/deepspeed_terms.py
    where the block's submodules are known, the largest-layer term elsewhere)."""
    fsdp_gathered_from_forward: tuple[str, ...] = ()
    """The units kept gathered from their forward to the end of their backward without a pipeline,
    each named by a layer it holds: "first", "last", "before-last" (fsdpunits.gathered_from_forward)."""
    cpu_collectives: str = ""
    """The collectives' library where the device is the CPU: "gloo" (ckplan's runtime, what its work holds beside
    FSDP2's moments: planner/cost/gloowork.py); "" where the runtime runs on GPUs alone (NCCL)."""

    sources: dict[str, str] = field(default_factory=dict, compare=False)
    """Per fact field, the file (and lines) and version it was read from."""
