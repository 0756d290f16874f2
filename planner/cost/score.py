"""The one evaluator: any plan of any schedule scored alike. Each of the pipeline's P·V stages
(V = 1 for 1F1B and GPipe) by the stage accumulator (assembly.stage_sums); each rank from its
stages' sums, with what the schedule says: its chunks, their in-flight microbatches at its peak
(schedules.rank_peak), whether its sends hold their tensors and its backward splits in two; and
the iteration from the schedule's makespan (schedule_time.makespan_ms). So every plan, the solvers',
each baseline's and every export's rounding, is scored by one body."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.cost import (
    afterstep,
    allocator,
    bridgeterms,
    gpipeheld,
    gradtiming,
    megatron_dp,
    pipereduce,
    runtimes,
    schedule_time,
    schedules,
    splittime,
    stagesends,
    zeroone,
)
from planner.cost.assembly import (
    PlanCost,
    StageCost,
    StageSums,
    capacity_ms,
    communicator_bytes,
    cublas_workspaces_bytes,
    fragmentation,
    host_cap_bytes,
    limit_bytes,
    option_indices,
    peak_bytes,
    stage_sums,
    step_end_peak_bytes,
    workspace_bytes,
)
from planner.cost.chunked import (
    loss_freed_at_input_pass_bytes,
    schedule_of,
    sends_held_bytes,
    stages_view,
    step_end_bytes,
)
from planner.cost.dataparallel import ddp_buckets
from planner.cost.layers import LayerCost, layer_costs
from planner.cost.replayed_reserve import with_replayed_reserve
from planner.cost.rules import in_flight, rank_tied_once_bytes
from planner.cost.terms import Context
from planner.schema import (
    OPTION_OFFLOAD,
    PipelineSetup,
    Profile,
    StagePlan,
    TrainingSetup,
    TrainSetup,
)

Chunk = tuple[list[LayerCost], list[int]]  # a pipeline stage's layers and their option indices


def evaluate(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """Score any plan: one StagePlan per rank (its `chunks` the layers of its stages, chunk 0
    first, where the schedule gives it several). Raises ValueError if the ranks' stages are not a
    contiguous, complete, in-order cover of the profile's layers."""
    order = schedule_of(setup)
    chunks = placed_chunks(ranks, profile, order)
    view = stages_view(setup, order)
    sums = [stage_sums(layers, options, stage=k, profile=profile, setup=view) for k, (layers, options) in enumerate(chunks)]
    costs = [rank_cost(order, rank, chunks, sums, profile=profile, setup=setup) for rank in range(order.num_ranks)]
    # the allocator's replay of a rank's step where one runs (reserve.py; several chunks a rank: FSDP2's only)
    costs = [with_replayed_reserve(cost, plan, rank, profile=profile, setup=setup)
             for rank, (cost, plan) in enumerate(zip(costs, ranks))]
    reductions = [pipereduce.stage_reductions_ms(layers, setup) for layers, _ in chunks]
    splits = [splittime.stage_split(layers, options, setup) for layers, options in chunks] if order.splits_backward else None
    return PlanCost(stages=costs, iteration_ms=plan_iteration_ms(order, sums, setup, reductions=reductions,
                                                                 stage_layers=[layers for layers, _ in chunks],
                                                                 splits=splits, profile=profile))


def stage_cost(layers: Sequence[LayerCost], checkpointed: Sequence[int], *, stage: int, profile: Profile,
               setup: TrainSetup) -> StageCost:
    """The cost of rank `stage` holding `layers` (in order) under a schedule of one stage per rank
    (1F1B, GPipe), as evaluate scores it: there a rank's cost depends on its own stage alone."""
    order = schedule_of(setup)
    if order.num_chunks != 1:
        raise ValueError(f"{setup.pipeline.schedule} gives a rank {order.num_chunks} stages: score the plan (evaluate)")
    chunks = {stage: (list(layers), list(checkpointed))}
    sums = {stage: stage_sums(layers, checkpointed, stage=stage, profile=profile, setup=setup)}
    return rank_cost(order, stage, chunks, sums, profile=profile, setup=setup)


def placed_chunks(ranks: Sequence[StagePlan], profile: Profile, order: schedules.Schedule) -> list[Chunk]:
    """The plan's pipeline stages in order, each its layers' costs and options, placed on ranks as
    the schedule places them; ValueError for a plan that does not fit the schedule or the profile."""
    if len(ranks) != order.num_ranks:
        raise ValueError(f"plan has {len(ranks)} stages, setup has {order.num_ranks} ranks")
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    staged: dict[int, tuple[list[str], StagePlan]] = {}
    for rank, plan in enumerate(ranks):
        mine = plan.chunks or [plan.layers]
        if len(mine) != order.num_chunks:
            raise ValueError(f"rank {rank} holds {len(mine)} chunks, the schedule gives it {order.num_chunks}")
        staged.update({stage: (list(chunk), plan) for chunk, stage in zip(mine, order.stages_of(rank))})
        offloaded = [name for name in plan.layers if plan.option(name) == OPTION_OFFLOAD]
        if offloaded and order.num_chunks > 1:  # useful_options never gives such a stage one
            raise ValueError(f"rank {rank}'s layer {offloaded[0]} offloads its activations, which a schedule of "
                             f"several stages per rank does not model yet; recompute it instead")
    flat = [name for stage in range(order.num_stages) for name in staged[stage][0]]
    if flat != [layer.name for layer in costs]:
        unknown = [name for name in flat if name not in position]
        detail = f"unknown layers {unknown[:3]}" if unknown else "layers missing, repeated or out of order"
        raise ValueError(f"stages do not cover the profile's layers in order: {detail}")
    chunks = []
    for stage in range(order.num_stages):
        names, plan = staged[stage]
        layers = [costs[position[name]] for name in names]
        chunks.append((layers, option_indices(plan, layers)))
    return chunks


def rank_cost(order: schedules.Schedule, rank: int, chunks, sums, *, profile: Profile,
              setup: TrainSetup) -> StageCost:
    """Rank `rank`'s cost from its stages' sums (`chunks`, `sums`: by pipeline stage): held bytes
    added up (a tied parameter its chunks share held once), its peak at the moment its schedule
    holds the most (its chunks' in-flight microbatches, the tensors its sends hold, the
    transient of the pass that runs then), the optimizer step's scratch of all its stages."""
    stages = order.stages_of(rank)
    lazy = late_gradients(order, rank, chunks, setup)
    view = stages_view(setup, order)
    held = {k: chunk_bytes(chunks[k][0], sums[k], stage=k, order=order, training=setup.training,
                           loss_freed=loss_freed_at_input_pass_bytes(profile, k, view)) for k in stages}
    if order.num_chunks > 1:  # a rank of several chunks: each chunk's late gradients where its actions hold them
        held = {k: dataclasses.replace(held[k], late_grad=g) for k, g in zip(stages, lazy)}
    peak = schedules.rank_peak(order, rank, stage_bytes=held)
    mine: list[StageSums] = [sums[k] for k in stages]
    tied = rank_tied_once_bytes(profile, [{layer.name for layer in chunks[k][0]} for k in stages], setup) \
        if profile.tied and len(stages) > 1 else 0.0
    # one ZeroRedundancyOptimizer over all the rank's chunks (ZeRO 1 on ckplan's runtime): its partition, not theirs
    static = sum(s.static_bytes for s in mine) + tied + zeroone.rank_excess_bytes(
        [chunks[k][0] for k in stages], profile=profile, setup=view)
    # the input gradient being sent, among a stage's buffers, is counted by its sends where they are held
    buffers = sum(sums[k].buffer_bytes - held[k].sent_input_grad for k in stages)
    activations = int(round(peak.live - peak.transient - peak.late_grads))
    transient = int(round(peak.transient))
    scratch = (sum if profile.device.type == "cuda" else max)(s.step_scratch_bytes for s in mine)
    total = int(round(peak_bytes(static + buffers - sum(lazy), 1, activations,
                                 transient + gradients_above(order, rank, lazy, mine, setup, peak,
                                                                 first=chunks[stages[0]][0][0]), scratch)))
    # the step's end, its own moment: the outputs still kept and the last stage's merge of them
    # (the whole gradients the runtime allocates at a stage's first backward reduced and gone, as at the step)
    last = order.num_stages - 1
    logits = chunks[last][0][-1].output_bytes if last in stages else 0
    end = step_end_bytes(order, rank, held, last_output_bytes=logits, training=setup.training)
    total = max(total, int(round(step_end_peak_bytes(static + buffers, late_grad_bytes=sum(lazy), end_bytes=end))))
    ctx = Context(profile, setup)
    cublas = cublas_workspaces_bytes(ctx, rank)  # kept from the first matmul: at every moment, the peak's included
    total += cublas
    cuda = ctx.device_type == "cuda"
    reserved = allocator.reserved_bytes(total, fragmentation(setup.pipeline, device_type="cuda")) if cuda else None
    in_flight = {c.stage: c.activations for c in peak.chunks}
    return StageCost(
        static_bytes=int(round(static)), kept_bytes=sum(s.kept_bytes for s in mine),
        in_flight=peak.activations or peak.weight_grad_inputs, activation_bytes=activations,
        buffer_bytes=int(round(buffers)), transient_bytes=transient, peak_bytes=total,
        time_ms=sum(s.time_ms for s in mine), cap_bytes=setup.pipeline.mem_caps_bytes[rank],
        step_ms=sum(s.step_ms for s in mine), step_scratch_bytes=int(round(scratch)),
        step_end_bytes=int(round(end)),
        comm_ms=sum(s.comm_ms for s in mine),
        host_bytes=int(round(sum(sums[k].host_bytes + in_flight[k] * sums[k].offloaded_bytes for k in stages))),
        host_cap_bytes=host_cap_bytes(setup.data_parallel, pipeline=setup.pipeline), limit_bytes=limit_bytes(rank, ctx) + cublas,
        reserved_bytes=reserved,
        workspace_bytes=workspace_bytes(rank, ctx), nccl_buffers=communicator_bytes(rank, ctx),
        after_step_bytes=afterstep.after_step_bytes(static, [chunks[k][0][0] for k in stages], stages,
                                                    training=setup.training, profile=profile, comm=setup.comm,
                                                    holds_output=last in stages,
                                                    step_copy_bytes=bridgeterms.held_step_copy_bytes(
                                                        [layer for k in stages for layer in chunks[k][0]], setup)))


def late_gradients(order: schedules.Schedule, rank: int, chunks, setup: TrainSetup) -> list[float]:
    """Per stage of the rank, the whole gradients its runtime allocates at the stage's first
    backward rather than holding all iteration (gradtiming.lazy_grad_bytes; static charges them)."""
    return [gradtiming.lazy_grad_bytes(chunks[k][0], setup) for k in order.stages_of(rank)]


def gradients_above(order: schedules.Schedule, rank: int, lazy: Sequence[float], mine: Sequence[StageSums],
                    setup: TrainSetup, peak: schedules.RankPeak, first: LayerCost | None = None) -> float:
    """What those gradients add at the rank's peak (gradtiming): in closed form for one stage a
    rank (`first`: its first layer), with what each GPipe backward leaves held to the step's end
    (gpipeheld: the peak may be the last backward's); for several, those the chunks hold at the
    moment of the peak, which the walk over torch's action order found with them counted
    (schedules.rank_peak, ChunkBytes.late_grad), as the chunked MILP's rows count them at every
    moment (milp_ranks._rank_rows)."""
    if order.num_chunks == 1:  # with what each GPipe backward leaves held (gpipeheld)
        sent = gpipeheld.held_per_backward_bytes(first, stage=rank, setup=setup) if first is not None else 0
        return one_chunk_gradients_above(lazy[0], stage=rank, kept=mine[0].kept_bytes, pipeline=setup.pipeline,
                                         per_backward=sent)
    return peak.late_grads if any(lazy) else 0.0


def one_chunk_gradients_above(lazy: float, *, stage: int, kept, pipeline: PipelineSetup, maximum=max,
                              per_backward: float = 0.0):
    """gradients_above for a rank of one stage (1F1B, GPipe), `kept` per microbatch, `per_backward`
    what each GPipe backward leaves held (gpipeheld): the DP scores its checkpoint sets by it
    (`maximum=np.maximum` for many at once)."""
    return gradtiming.one_chunk(lazy, in_flight=in_flight(pipeline, stage), kept=kept,
                                microbatches=pipeline.microbatches, steady=pipeline.schedule == "1F1B",
                                maximum=maximum, per_backward=per_backward)


def chunk_bytes(layers: Sequence[LayerCost], sums: StageSums, *, stage: int, order: schedules.Schedule,
                training: TrainingSetup, loss_freed: int = 0) -> schedules.ChunkBytes:
    """What one microbatch of the stage holds, by when the schedule frees it: all its kept bytes at
    its backward, or, where the backward splits, until its weight pass (an upper bound: W needs
    only the linears' inputs), with the gradients its input pass leaves for W; and what its
    sends hold where the schedule's runtime holds them. On the pipeline's first stage a split
    schedule's I runs nothing and its W the stage's whole backward as one autograd call (torch 2.13.0
    pipelining/stage.py 1017-1029, 1085-1106; splittime.py): no gradients left for W, no input pass
    peak, and W's peak the full backward's (the stage's B transient), not the split weight pass's
    (docs/framework-facts.md §250). On the last stage the input pass frees the loss's saved tensors, `loss_freed`
    (chunked.loss_freed_at_input_pass_bytes, §306): among what is freed at I, not kept for W."""
    output, input_grad = sends_held_bytes(layers[0], layers[-1], stage=stage, order=order, training=training)
    split = order.splits_backward
    passes = split and stage > 0  # the split passes run: past the pipeline's first stage
    freed = loss_freed if passes else 0
    return schedules.ChunkBytes(
        freed if split else sums.kept_bytes, sums.kept_bytes - freed if split else 0.0,
        sent_output=output, sent_input_grad=input_grad,
        held_for_weight_grad=sums.weight_grad_bytes if passes else 0, transient=sums.transient_bytes,
        input_pass_transient=sums.input_pass_peak_bytes if passes else 0,
        weight_pass_transient=(sums.weight_pass_peak_bytes if passes else sums.transient_bytes) if split else 0)


def plan_iteration_ms(order: schedules.Schedule, sums: Sequence[StageSums], setup: TrainSetup, *,
                      reductions: Sequence[float] | None = None,
                      stage_layers: Sequence[Sequence[LayerCost]] | None = None,
                      splits: Sequence[splittime.StageSplit] | None = None,
                      profile: Profile | None = None) -> float:
    """The schedule's makespan with each stage's forward and backward (its sends and actions
    with them: half each), a split backward's input and weight passes as the stage's layers
    recorded them (`splits`, per stage: splittime.stage_split; the rest half each, the first
    stage's I nothing: splittime.split_pass_ms), then the slowest rank's optimizer step; or,
    when fewer ranks than there are compute at once (capacity_ms), all the work spread over them.
    `reductions`, per stage (pipereduce.stage_reductions_ms): the gradient reductions a runtime runs
    after the stage's last backward, placed there in the schedule (the step carries none of them).
    `stage_layers`, per stage: its layers, whose data-parallel collectives Megatron-LM's DDP issues
    beside the schedule's compute (megatron_dp.py; without them its reductions are not charged), slowing it by
    NCCL's CTAs on `profile`'s GPU (None: not slowed)."""
    if order.splits_backward:
        splits = splits or [splittime.StageSplit()] * len(sums)
    beside = stagesends.beside_ms(order, stage_layers, stages_view(setup, order)) if stage_layers else None
    times = splittime.stage_times(sums, splits=splits if order.splits_backward else None, reductions=reductions,
                                  beside=beside)
    # what the split passes take beyond the full backwards (the busy time the stages' sums charge)
    split_extra = (sum(t.busy_ms for t in times) + sum(map(sum, beside or []))
                   - sum(max(s.busy_ms, t.forward_ms) for s, t in zip(sums, times)))
    steps = [sum(sums[k].step_ms for k in order.stages_of(rank)) for rank in range(order.num_ranks)]
    lockstep = runtimes.of(setup.training).multi_schedule_lockstep
    makespan = schedule_time.makespan_ms(order, stage_times=times, lockstep=lockstep, stage_sends=beside)
    if stage_layers is not None and ddp_buckets(setup) and order.actions:
        windows = [sum(sums[k].step_ms for k in order.stages_of(rank)[1:]) for rank in range(order.num_ranks)]
        makespan = megatron_dp.makespan_ms(order, times, stage_layers, setup, step_window_ms=windows, profile=profile,
                                           stage_sends=beside)
    makespan += max(steps)
    return max(makespan, capacity_ms(sum(stage.busy_ms for stage in sums) + split_extra, sum(steps), setup))
