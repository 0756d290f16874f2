"""What each term charges: the value functions TERMS' rows call (planner/cost/terms.py), and what
each runtime's pipeline holds besides the layers' own saved tensors (read from their code)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.cost import (
    chunkedloss,
    comm,
    compiledrerun,
    dataparallel,
    ep_exchange,
    fsdpunits,
    runtimes,
    schedules,
    stepcounts,
)
from planner.cost.layers import LayerCost
from planner.cost.opsacep import op_sac_reruns_exchanges
from planner.schema import PipelineSetup, Profile, TimeConstants, TrainSetup

# (weights, grads, optimizer state) bytes per parameter before sharding.
_BYTES_PER_PARAM = dataparallel.BYTES_PER_PARAM


def bytes_per_param(setup: TrainSetup) -> float:
    """Weights + grads + optimizer state per parameter on one device (dataparallel.bytes_per_param)."""
    return dataparallel.bytes_per_param(setup)


def in_flight(pipeline: PipelineSetup, stage: int) -> int:
    """Microbatches whose activations stage `stage` holds at its peak: for 1F1B and GPipe, the
    one-chunk case of what schedules.peak_in_flight reads off torch's order (a test holds the
    two equal), in closed form so a solve of thousands of microbatches never walks the order;
    all M for a stage of a schedule of several per rank (its count depends on the order)."""
    if pipeline.chunks > 1:
        return pipeline.microbatches
    return schedules.one_chunk_in_flight(pipeline.schedule, num_ranks=pipeline.stages,
                                         num_microbatches=pipeline.microbatches, rank=stage)


def static_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """Weights, gradients and optimizer state of the layer on one rank: its dense parameters at
    the setup's bytes per parameter; under expert parallelism its 1/E of the routed experts' at
    those of their expert-data-parallel group (ZeRO over dp / E ranks, dataparallel.expert_setup)."""
    return (per_param_bytes(layer, setup, dataparallel.bytes_per_param)
            - dataparallel.fp8_whole_saving_bytes(layer.float8_param_count, setup))


def per_param_bytes(layer: LayerCost, setup: TrainSetup, per_param: Callable[[TrainSetup], float]) -> float:
    """Σ over the layer's parameters of `per_param` bytes (a dataparallel function of the
    setup): the dense ones with the setup, the rank's 1/E of the routed experts with their
    expert-data-parallel group's."""
    if not layer.expert_param_count:
        return layer.param_count * per_param(setup)
    dense = layer.param_count - layer.expert_param_count
    held = dataparallel.held_expert_params(layer.expert_param_count, setup)
    return dense * per_param(setup) + held * per_param(dataparallel.expert_setup(setup))


def all_to_all_ms(layer: LayerCost, option: int, setup: TrainSetup) -> float:
    """A MoE block's token all-to-all per microbatch under expert parallelism E: the dispatch
    before the experts and the combine after them in forward, both again (their gradients) in
    backward, and the forward's two once more when the option recomputes the whole layer; each
    a2a_bytes · (E-1)/E over the EP link, or at the flex dispatcher's backend's rates (ep_exchange.exchange_ms). On the
    critical path: the experts wait for their tokens, and Megatron-LM hides the all-to-all only
    with its 1F1B A2A overlap (--overlap-moe-expert-parallel-comm, off by default), torchtitan
    not at all. 0 without ep, for a dense layer, and where the link is not known."""
    if setup.data_parallel.ep == 1 or not layer.a2a_bytes:
        return 0.0
    # torchtitan's op-level SAC reruns them too where they are not save ops (planner/cost/opsacep.py)
    count = 4 + 2 * (option == 1 or op_sac_reruns_exchanges(layer, option, setup))
    return count * ep_exchange.exchange_ms(layer.a2a_bytes, setup.data_parallel)


def tied_once_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """A tied parameter whose holders all share a stage exists there once, while each holder's
    param bytes count it: minus the copies beyond the first. Known from the stage's position
    only on a single-stage pipeline, where every holder is on stage 0. With more stages each
    holder is charged a copy: exact for the sets that hold the first and the last layer (the
    token embedding and the LM head, always split), over by the copies for a set whose holders
    share an inner stage (a cost that can only over-state memory)."""
    if setup.pipeline.stages != 1:
        return 0.0
    copies = sum((len(item.layers) - 1) * item.param_count for item in profile.tied)
    return -copies * bytes_per_param(setup)


def passed_grad_bytes(layer: LayerCost) -> int:
    """The input gradient a split backward's input pass makes for this layer and hands to the layer
    before it, which torch's stage_backward_input keeps until the weight pass (measured with torch
    2.13 over 1, 2 and 3 blocks, tests/test_chunked_schedules.py: each inner boundary adds its gradient to what the pass leaves, the profile's
    per-layer split_held_bytes counting neither the incoming nor the outgoing gradient); 0 for a
    layer that makes no input gradient (the model's first)."""
    return layer.input_bytes if layer.options[0].split_input_peak_bytes > 0 else 0


def input_pass_peak_bytes(layers: Sequence[tuple[float, float]]) -> float:
    """A stage's split-backward input pass over what is live before it, from each layer's (input
    peak, what it leaves for the weight pass) in stage order: the pass runs the layers last to
    first, each on top of what the later ones left."""
    peak, left = 0.0, 0.0
    for input_peak, held in reversed(layers):
        peak = max(peak, left + input_peak)
        left += held
    return peak


def rank_tied_once_bytes(profile: Profile, chunks: Sequence[set[str]], setup: TrainSetup) -> float:
    """A rank holds a tied parameter once however many of its chunks (its stages' layer names)
    hold it (a V puts the token embedding and the LM head on rank 0; one module, one
    nn.Parameter): minus the copies charged to its chunks beyond the first (inside one stage,
    tied_once_bytes), and their step counts (stepcounts.rank_tied_once_bytes)."""
    copies = sum(item.extra_holders(chunks) * item.param_count
                 for item in profile.tied)
    return -copies * bytes_per_param(setup) + stepcounts.rank_tied_once_bytes(profile, chunks, setup)


def reduced_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """HSDP's ZeRO 3: the reduced gradient shard FSDP2 keeps for this layer through the rest of
    the stage's backward (dataparallel.reduced_bytes_per_param). Charged for every layer, with
    the buffers; the stage's first layer takes its own back (first_layer_buffer_bytes): the
    most are held while it computes, one for each layer after it. 0 where charged at FSDP2's moments (fsdpunits)."""
    if fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0.0
    return per_param_bytes(layer, setup, dataparallel.reduced_bytes_per_param)


def kept_bytes(layer: LayerCost, option: int) -> int:
    """Bytes per microbatch this layer keeps until its backward under option `option` (False:
    none, its activations; True: full, its input)."""
    if option < 2:  # the hot path: plans of whole layers
        return layer.input_bytes if option else layer.act_bytes
    return layer.options[option].kept_bytes


def recompute_ms(layer: LayerCost, setup: TrainSetup | None = None, profile: Profile | None = None) -> float:
    """What checkpointing adds to the layer's backward: the profile's recompute (measured, or from FLOPs), which stops once
    the last saved tensor is back; a whole forward where it was not measured, or where the runtime reruns whole forwards
    (recompute_whole_forward: Megatron-LM's, DeepSpeed's and Hugging Face's reentrant checkpoints, torchtitan's early_stop=
    False at b5bcd76c) and the block is not compiled (compiledrerun.py: the partitioner's rerun, the profile's recompute), less
    the backward's FP8 weight transposes where the rerun's serve it (Megatron-FSDP on Hopper, fsdp_transpose_ms)."""
    whole = setup is not None and runtime_facts(setup).recompute_whole_forward and not compiledrerun.rerun_partitioned(layer.kind, setup.training)
    if layer.recompute_ms is not None and not whole:
        return layer.recompute_ms
    from planner.cost.float8 import fsdp_transpose_ms  # a cycle otherwise
    return layer.fwd_ms - (fsdp_transpose_ms(profile, setup) * layer.float8_param_count  # no GPU read without FP8
                           if whole and profile is not None and layer.float8_param_count else 0.0)


def option_recompute_ms(layer: LayerCost, option: int, setup: TrainSetup | None = None, profile: Profile | None = None) -> float:
    """What option `option` adds to the layer's backward: nothing for none, recompute_ms for
    full, the option's own (measured, or from its FLOPs) for a selective one."""
    if option == 0:
        return 0.0
    return recompute_ms(layer, setup, profile) if option == 1 else layer.options[option].recompute_ms


def layer_time_ms(layer: LayerCost, option: int, setup: TrainSetup | None = None, profile: Profile | None = None) -> float:
    """Forward + backward, plus what the option recomputes."""
    return layer.fwd_ms + layer.bwd_ms + option_recompute_ms(layer, option, setup, profile)


def compute_ms(time_ms: float, time: TimeConstants) -> float:
    """A profiled compute time as the run will take it: times the calibrated compute scale
    (the launch's threads against the profile's, ranks sharing cores; 1 uncalibrated)."""
    return time_ms * time.compute_scale


def send_ms(num_bytes: int, time: TimeConstants) -> float:
    """One point-to-point send: latency + bytes / bandwidth (calibrated; 0 uncalibrated)."""
    if time.send_gb_per_s is None:
        return time.send_latency_ms
    return time.send_latency_ms + num_bytes / (time.send_gb_per_s * 1e6)


def first_layer_comm_ms(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """Per microbatch, a stage past the first sends its input's gradient back."""
    return send_ms(layer.input_bytes, setup.time) if stage > 0 else 0.0


def last_layer_comm_ms(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """Per microbatch, a stage before the last sends its output forward."""
    return send_ms(layer.output_bytes, setup.time) if stage < setup.pipeline.stages - 1 else 0.0


def stage_constant_comm_ms(stage: int, time: TimeConstants) -> float:
    """Per microbatch every stage runs two schedule actions (forward, backward)."""
    return 2 * time.action_overhead_ms


def layer_step_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """What this layer costs once per iteration: the setup's optimizer step over its
    parameters (ZeRO ≥ 1: the rank's 1/shard-group of them; offload: copies and the host
    step) and data parallelism's gradient reduction and weight gathers
    (dataparallel.step_term_ms); the step is 0 when the profile has no step time for that
    optimizer. Plus the sums that keep its tied parameters tied, which run before the step (tied_sum_ms). On one
    stage a parameter an earlier layer shares is that one's to step and reduce, gathered by each holder (§307)."""
    shared = layer.shared_before if setup.pipeline.stages == 1 and layer.param_count else 0
    step = layer.step_at(setup.training.optimizer, setup.time.rank_threads) * (1 - shared / max(1, layer.param_count))
    return dataparallel.step_term_ms(layer.param_count, step, setup, fwd_ms=compute_ms(layer.fwd_ms, setup.time),
                                     bwd_ms=compute_ms(layer.bwd_ms, setup.time),
                                     expert_count=layer.expert_param_count, frozen=layer.frozen_param_count,
                                     fp8_count=layer.float8_param_count, shared=shared) + tied_sum_ms(layer, setup)


def tied_sum_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """The all-reduce that keeps the layer's shared parameters tied, once per iteration before the
    optimizer step, as each holder's rank runs it (docs/framework-facts.md §247-§249): a ring
    all-reduce of the gradient the runtime sums (tied_grad_bytes) over the holders' ranks, across
    the link between the pipeline's first and last stages (comm.stage_all_reduce_ms: the network
    where their ranks lie in two nodes), or a calibrated send line's time for the bytes a rank moves.
    Megatron-core all-reduces the embedding's main_grad over its embedding group (the first and the
    last pipeline rank), DeepSpeed's pipeline engine the tied weight's gradient (_hp_grad under
    BF16_Optimizer) over the stages holding it, ckplan's runtime each copy's .grad (tie.py).

    Nothing where the first and last stages share a rank (one stage; a V schedule's rank 0): there
    the holders share one nn.Parameter and no framework runs a collective (DeepSpeed ties only where
    the pipeline has stages; Megatron's embedding group is one rank). On one stage autograd adds the
    two contributions (InputBuffer's add, then one AccumulateGrad), which tiedadd.tied_local_add_ms
    charges where no charged accumulation stands for it (§249, §349); on a V schedule's rank 0 the two
    stages' backwards run apart, two AccumulateGrads, the later one's add the profile's accumulation.

    Exact for a set the first and the last layers hold (the token embedding and the LM head,
    the solvers' fixed ends); a set with an inner holder is charged as if its holders sat on those
    two stages (over where they share a stage or a node; under where a V schedule puts two of
    them on two ranks while its ends share one)."""
    if not layer.tied:
        return 0.0
    pipeline = setup.pipeline
    order = schedules.pipeline_schedule(pipeline.schedule, num_ranks=pipeline.stages // pipeline.chunks,
                                        num_microbatches=pipeline.microbatches, num_chunks=pipeline.chunks)
    last = order.num_stages - 1
    if order.stage_to_rank[0] == order.stage_to_rank[last]:
        return 0.0
    per_param = tied_grad_bytes(setup)
    total = 0.0
    for count, holders in layer.tied:
        num_bytes = count * per_param
        total += comm.stage_all_reduce_ms(num_bytes, holders, setup, stage=0, to=last)
        if setup.time.send_gb_per_s is not None:
            total += send_ms(int(2 * (holders - 1) / holders * num_bytes), setup.time)
    return total


def tied_grad_bytes(setup: TrainSetup) -> float:
    """Bytes per parameter of the gradient a tie's all-reduce sums: the optimizer's own fp32 gradient
    where the runtime keeps one (DeepSpeed's _hp_grad), else the gradient it accumulates (Megatron's
    main_grad, torch's .grad), a shard of it where ZeRO ≥ 2 shards the gradients (ckplan's runtime
    under FSDP2 sums matching shards: tie.py)."""
    held = dataparallel.param_bytes(setup)
    if held.hp_grads:
        return held.hp_grads
    if setup.data_parallel.zero >= 2 and not dataparallel.kept_whole(setup):
        return held.grads / dataparallel.shard_size(setup)
    return held.grads


def step_checks_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """What the runtime reads once a step beside the optimizer (its record's step_whole_bytes over
    the layer's whole gradients, step_shard_bytes over the rank's shard of them), memory-bound at
    the profile's GPU's HBM bandwidth; 0 where the profile names none (a measured step)."""
    record = runtime_facts(setup)
    hbm_tbps = profile.assumptions.get("gpu_hbm_tbps")
    if not (record.step_whole_bytes or record.step_shard_bytes) or not isinstance(hbm_tbps, (int, float)) \
            or setup.data_parallel.offload:
        return 0.0
    read = layer.param_count * (record.step_whole_bytes + record.step_shard_bytes / dataparallel.shard_size(setup))
    return read / (hbm_tbps * 1e12) * 1e3


# What each runtime's 1F1B pipeline holds besides the layers' own saved tensors: its record's
# pipeline-buffer facts (planner/cost/runtimes.py, each with the file it was read from).


def runtime_facts(setup: TrainSetup) -> runtimes.RuntimeFacts:
    """The record of what the setup's runtime holds (planner/cost/runtimes.py)."""
    return runtimes.of(setup.training)


def pipe_buffers(stage: int, pipeline: PipelineSetup) -> int:
    """DeepSpeed's TrainSchedule.num_pipe_buffers (a record's "pipe-buffers")."""
    return max(2, min(pipeline.stages - stage, pipeline.microbatches))


def first_layer_kept_bytes(layer: LayerCost, setup: TrainSetup) -> int:
    """Correction to kept bytes for the layer that opens a stage: under torch's pipelining its
    input is a receive buffer (past stage 0) or a slice of the whole batch the schedule holds
    (stage 0), both counted in buffers, so the layer's saved copy of it is not kept twice. The
    frameworks' own pipelines hand the layer a tensor of its own, kept as the layer's."""
    return -layer.input_in_act_bytes if runtime_facts(setup).stage_input_in_receive_buffer else 0


def last_layer_kept_bytes(layer: LayerCost, stage: int, profile: Profile, setup: TrainSetup) -> int:
    """The stage output waits until its backward (fwd_cache, output_objs, DeepSpeed's buffers);
    Megatron frees its storage once sent (the last stage's output, the logits, stays for the loss);
    where nothing but the loss keeps the logits' 1x (logits_in_loss_kept), it is the loss's kept bytes."""
    last = stage == setup.pipeline.stages - 1
    if (runtime_facts(setup).frees_sent_output and not last) or (last and logits_in_loss_kept(profile, setup)):
        return 0
    return layer.output_bytes


def outputs_held(stage: int, num_stages: int, training, *, ranks: int) -> bool:
    """Whether the runtime's schedule keeps stage `stage` (of `num_stages`, over `ranks` pipeline
    ranks)'s output of every microbatch until the next step begins (its record's
    outputs_held_to_step_end). Without a pipeline (one rank) the frameworks run no schedule:
    their microbatches are gradient accumulation, keeping nothing."""
    if ranks == 1:
        return False
    held = runtimes.of(training).outputs_held_to_step_end
    return held == "every-stage" or (held == "last-stage" and stage == num_stages - 1)


def held_outputs_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> int:
    """The stage outputs of the microbatches past their backward, which the schedule keeps until
    the step ends (outputs_held; the last stage's are the logits): M - k of them at a 1F1B stage's
    peak (its k in flight are among the activations), none under GPipe. A schedule walked action
    by action charges them there instead (chunked.sends_held_bytes: ChunkBytes.sent_output)."""
    pipeline = setup.pipeline
    if not schedules.closed_form(pipeline.schedule, pipeline.chunks) or \
            not outputs_held(stage, pipeline.stages, setup.training, ranks=pipeline.stages):
        return 0
    return (pipeline.microbatches - in_flight(pipeline, stage)) * layer.output_bytes


def first_layer_buffer_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """What holds the stage input besides the first layer (none on stage 0): torch's pipelining one receive buffer
    per microbatch plus the input's gradient being sent (none for an input needing none: §731); Megatron-LM and
    ColossalAI only that gradient; DeepSpeed its pipe buffers and the receive buffer."""
    if stage == 0:
        return 0
    held = runtime_facts(setup).input_receive_buffers
    if held == "one":
        copies = 1
    elif held == "pipe-buffers":
        copies = pipe_buffers(stage, setup.pipeline) + 1
    else:
        copies = setup.pipeline.microbatches + held_input_grads(stage, setup) * layer.input_grad
    return copies * layer.input_bytes


def held_input_grads(stage: int, setup: TrainSetup) -> int:
    """Input gradients stage `stage` (past the first) holds at its peak under torch's pipelining: the one being
    sent; where each stays on its buffer's `.grad` to the next step (input_grads_held_to_step_end), every one
    before the peak. 1F1B peaks at each steady backward, the most gradients at its last, after M - min(P - s, M)
    backwards: that many plus the one it makes. GPipe's first backward holds none (§645: the one its first layer
    makes is in that layer's transient); its later ones each hold one more (gpipeheld). Several: their own walk."""
    pipeline = setup.pipeline
    if pipeline.schedule != "1F1B" or pipeline.chunks > 1:
        return 0 if pipeline.schedule == "GPipe" else 1  # the walk: chunked.sends_held_bytes
    if stage == 0 or not runtime_facts(setup).input_grads_held_to_step_end:
        return 1
    return pipeline.microbatches - in_flight(pipeline, stage) + 1


def first_layer_reduced_back_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """The stage's first layer's own reduced gradient shard (reduced_bytes), charged with every
    layer's, is not yet made while that layer computes, when the most are held: taken back."""
    return -reduced_bytes(layer, setup)


def last_layer_buffer_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> int:
    """Receive buffers for the gradient of the stage output (none on the last stage): one per microbatch under
    torch's pipelining, none for an output needing no gradient (§731); the frameworks take one gradient at a time."""
    per_microbatch = runtime_facts(setup).output_grad_buffers_per_microbatch
    if stage == setup.pipeline.stages - 1 or (per_microbatch and not layer.output_grad):
        return 0
    return (setup.pipeline.microbatches if per_microbatch else 1) * layer.output_bytes


def batch_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """The data the schedule holds: torch's pipelining the whole batch, inputs on the first stage and targets on the
    last; Megatron-LM one microbatch per forward (the inputs are the first layer's, the targets of those in flight
    stay); ColossalAI and torchtitan the whole batch on every stage, once a rank (b5bcd76c with its positions), but
    without a pipeline what the loop keeps as it accumulates (accumulated_batch); DeepSpeed one a pipe buffer."""
    pipeline, inputs, targets, facts = setup.pipeline, profile.batch_input_bytes, profile.batch_target_bytes, runtime_facts(setup)
    first, last, m = stage == 0, stage == pipeline.stages - 1, pipeline.microbatches
    if (kind := facts.batch_held) == "in-flight-targets":
        return in_flight(pipeline, stage) * targets * last
    if kind == "every-stage":
        held = {"current": (1, 1), "inputs": (m, 1)}.get(facts.accumulated_batch, (m, m)) if pipeline.stages == 1 else (m, m)
        return (held[0] * inputs * (1 + facts.batch_positions) + held[1] * targets) * (stage < pipeline.stages // pipeline.chunks)
    return (pipe_buffers(stage, pipeline) if kind == "pipe-buffers" else m) * (inputs * first + targets * last)


def profile_tp(profile: Profile) -> int:
    """The tensor-parallel degree an analytic profile records (1 where none is, or where the value
    is not a positive integer: the exporters refuse such a profile in their own sentence)."""
    tp = profile.assumptions.get("tp", 1)
    return tp if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 else 1


def loss_compiled(training) -> bool:
    """Whether the setup compiles the loss: its compile_loss where given (torchtitan's
    compile.components), else with the layers (bare --compile)."""
    return training.compile if training.compile_loss is None else training.compile_loss


def runtime_loss(profile: Profile, setup: TrainSetup) -> tuple[float, runtimes.LossRegion] | None:
    """(the bf16 logits' bytes, the loss region the runtime's record says it runs) for an analytic
    bf16 profile, whose loss is a formula rather than a measurement; None for a measured or fake
    profile (the model file's own loss was measured) and for other dtypes (the records' multiples
    are of bf16 logits)."""
    if profile.source != "analytic" or profile.dtype != "bfloat16":
        return None
    tp = profile_tp(profile)
    region = runtimes.loss_region(runtime_facts(setup), tp=tp, compiled=loss_compiled(setup.training),
                                  te_fused=getattr(setup.training, "te_cross_entropy", False),
                                  native_fused=getattr(setup.training, "fused_cross_entropy", False))
    return profile.layers[-1].output_bytes, region


def loss_holds_logits(profile: Profile, setup: TrainSetup) -> bool:
    """Whether the runtime's loss region saves the logits themselves and hands their storage back as their
    gradient (LossRegion.grad_in_logits: Transformer Engine's fused cross-entropy). Then the loss keeps the
    logits (not the stage output), and they stay to the end of the last layer's backward, whose transient
    (its received gradient) is in their storage: every layer before it runs its backward without them
    (stage_sums' transient credits the loss's kept bytes to the whole stage's backward)."""
    known = runtime_loss(profile, setup)
    return known is not None and known[1].grad_in_logits


def logits_in_loss_kept(profile: Profile, setup: TrainSetup) -> bool:
    """Whether the 1x of the loss region's kept bytes the last stage's output would carry is the loss's
    (loss_kept_bytes, a stage term: stage_sums' transient credits it to every layer's backward, as the DP and
    the MILP do): where the loss saves the logits themselves (loss_holds_logits), or where the runtime does
    not hold the logits while the stage runs its backward (RuntimeFacts.logits_held_in_backward: Megatron-LM
    drops them once the loss is made; torchtitan deletes them without a pipeline), so that all the region
    keeps (the fp32 copy the vocab-parallel loss saves, the log-softmax torchtitan's saves) is freed by the
    loss's backward, before the output layer's. Else (torch's pipelining, DeepSpeed) the stage output's 1x stays
    to the stage's backward's end. Each microbatch's kept total is the same either way."""
    if loss_holds_logits(profile, setup):
        return True
    if runtime_loss(profile, setup) is None:  # a measured loss: the stage output is the logits it measured
        return False
    held = runtime_facts(setup).logits_held_in_backward
    return held == "never" or (held == "pipeline" and setup.pipeline.stages == 1)


def loss_kept_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """What the loss keeps for backward, per microbatch, on the last stage: the profile's, or
    for an analytic profile the runtime's loss region (runtime_loss) less the logits the last
    layer keeps as its output (none where they are the loss's: logits_in_loss_kept, or where the region's
    kept_x does not count them: LossRegion.kept_counts_logits, torchtitan's eager loss, whose log_softmax saves
    its fp32 result beside the bf16 logits torch's pipelining keeps in output_chunks), plus the loss value
    (4 B)."""
    if stage != setup.pipeline.stages - 1:
        return 0
    known = runtime_loss(profile, setup)
    if known is None:
        return profile.loss_bytes
    logits, region = known
    chunked = chunkedloss.setup_loss_bytes(profile, setup, region)
    if chunked is not None:  # no whole logits: the loss value alone (planner/cost/chunkedloss.py)
        return chunked.kept_bytes - (0 if logits_in_loss_kept(profile, setup) else int(logits))
    held_apart = region.kept_counts_logits and not logits_in_loss_kept(profile, setup)
    return int(round((region.kept_x - (1 if held_apart else 0)) * logits)) + 4


def stage_constant_transient_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """The loss's scratch (e.g. cross-entropy's gradients) on the last stage: the profile's, or
    for an analytic profile the runtime's loss region's peak beyond what it keeps (runtime_loss;
    e.g. Megatron-LM's vocab-parallel cross-entropy writes the gradient into the fp32 softmax it
    saved, so only its cast back to bf16 is new: 1x)."""
    if stage != setup.pipeline.stages - 1:
        return 0
    known = runtime_loss(profile, setup)
    if known is None:
        return profile.loss_transient_bytes
    logits, region = known
    chunked = chunkedloss.setup_loss_bytes(profile, setup, region)
    if chunked is not None:
        return chunked.peak_bytes - chunked.kept_bytes
    return int(round((region.peak_x - region.kept_x) * logits))


def stage_constant_ms(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """The loss's forward + backward on the last stage (scaled like the layers' compute): compiled
    where the runtime compiles it and the profile recorded its compiled time."""
    if stage != setup.pipeline.stages - 1:
        return 0.0
    compiled = (loss_compiled(setup.training) and profile.compiled_loss_ms is not None
                and runtime_facts(setup).loss_compiled is not None)
    chunked_ms = chunkedloss.setup_extra_ms(profile, setup) if runtime_loss(profile, setup) else 0.0
    return compute_ms((profile.compiled_loss_ms if compiled else profile.loss_ms) + chunked_ms, setup.time)


def expert_parallel_transient_back(layer: LayerCost, setup: TrainSetup) -> int:
    """What expert parallelism over E ranks takes off a MoE layer's transient: the temporaries of
    its routed experts' weight gradients, of which a rank holds 1/E."""
    ep = setup.data_parallel.ep
    return layer.expert_transient_bytes * (ep - 1) // ep


def layer_extra_bytes(layer: LayerCost, option: int) -> int:
    """A layer's peak beyond what it keeps: its transient, plus what its option recomputes at once."""
    if option < 2:
        return layer.transient_bytes + (layer.recompute_peak_bytes if option else 0)
    return layer.transient_bytes + layer.options[option].peak_bytes
