"""Where a schedule puts the pipeline's stages: its P ranks hold P·V stages (V chunks each; one
for 1F1B and GPipe), placed as the schedule places them, and the setup a stage's terms read."""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import lossvalues, runtimes, schedules, splittime, stagesends
from planner.cost.assembly import option_indices, stage_sums
from planner.cost.layers import LayerCost, layer_costs
from planner.cost.rules import loss_kept_bytes, outputs_held
from planner.schema import PipelineSetup, Profile, StagePlan, TrainingSetup, TrainSetup


def schedule_of(setup: TrainSetup) -> schedules.Schedule:
    return pipeline_order(setup.pipeline)


def pipeline_order(pipeline: PipelineSetup) -> schedules.Schedule:
    """The schedule as the cost model reads it (schedules.pipeline_schedule)."""
    return schedules.pipeline_schedule(pipeline.schedule, num_ranks=pipeline.stages,
                                       num_microbatches=pipeline.microbatches, num_chunks=pipeline.chunks)


def stages_view(setup: TrainSetup, order: schedules.Schedule) -> TrainSetup:
    """The setup as a stage's terms read it: a pipeline of the schedule's P·V stages (the last one
    computes the loss, every one past the first receives its input), each with its rank's cap;
    everything else, the schedule included, as given. The setup itself where each rank holds one."""
    if order.num_stages == setup.pipeline.stages:
        return setup
    caps = [setup.pipeline.mem_caps_bytes[rank] for rank in order.stage_to_rank]
    return setup.model_copy(update={"stages": order.num_stages, "mem_caps_bytes": caps})


def ranks_of(stages: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """The pipeline's P·V stages (in order) as the P ranks that hold them, chunk 0 first, as
    the schedule places them (interleaved loops, ZBV and DualPipeV run a V)."""
    order = schedule_of(setup)
    ranks = []
    for rank in range(setup.pipeline.stages):
        mine = [stages[k] for k in order.stages_of(rank)]
        ranks.append(StagePlan(index=rank, layers=[name for stage in mine for name in stage.layers],
                               chunks=[list(stage.layers) for stage in mine],
                               recompute={name: option for stage in mine for name, option in stage.recompute.items()},
                               checkpointed=[name for stage in mine for name in stage.checkpointed]))
    return ranks


def pipeline_stages(ranks: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """A plan's P·V pipeline stages in order (the inverse of ranks_of), each with its layers'
    recompute; the plan's own stages where each rank holds one."""
    if setup.pipeline.chunks == 1:
        return list(ranks)
    order = schedule_of(setup)
    placed = {}
    for rank, plan in enumerate(ranks):
        for chunk, stage in zip(plan.chunks, order.stages_of(rank)):
            placed[stage] = StagePlan(index=stage, layers=list(chunk),
                                      recompute={n: o for n, o in plan.recompute.items() if n in chunk},
                                      checkpointed=[n for n in plan.checkpointed if n in chunk])
    return [placed[stage] for stage in range(order.num_stages)]


def as_ranks(stages: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """A plan's pipeline stages (P·V of them, in order) as its ranks, each with its chunks: the
    stages themselves where each rank holds one (ranks_of)."""
    return list(stages) if setup.pipeline.chunks == 1 else ranks_of(stages, setup)


def chunked_linear_ms(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> float:
    """The chunked MILP's linear time for a plan (milp_ranks._chunked_time, from each of its P·V
    stages' busy time as evaluate scores them: F + I + W, splittime.stage_times, so a split
    backward's passes as they run): for every rank, its work, M·Σ its stages' busy less the sends its
    runtime runs beside the compute (stagesends.beside_ms) plus its warm-up forwards' sends, which it
    waits for (stagesends.warmup_sends), + (P - 1)·the slowest stage (its sends included: the fill and
    drain cross one at every rank boundary) + the slowest rank's step; the largest over the ranks.
    The rank's work is exact: what schedule_time.simulate_time runs on the rank's compute stream; the
    fill and drain are the interleaved schedule's bubble, (P - 1)·(t_f + t_b) (Narayanan et al. 2021,
    exact for equal stages), as before. The search holds the MILP's objective to it; the plan reports
    the simulated schedule's time (evaluate)."""
    order = schedule_of(setup)
    view = stages_view(setup, order)
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    per_stage, stage_layers, splits = [], [], [] if order.splits_backward else None
    for k, stage in enumerate(pipeline_stages(ranks, setup)):
        layers = [costs[position[name]] for name in stage.layers]
        options = option_indices(stage, layers)
        per_stage.append(stage_sums(layers, options, stage=k, profile=profile, setup=view))
        stage_layers.append(layers)
        if splits is not None:
            splits.append(splittime.stage_split(layers, options, setup))
    times = splittime.stage_times(per_stage, splits=splits)
    busy = [t.busy_ms for t in times]
    sends = _rank_sends(order, stagesends.beside_ms(order, stage_layers, view))
    work = max(setup.pipeline.microbatches * (sum(busy[k] for k in order.stages_of(r)) - sends[r][0]) + sends[r][1]
               for r in range(order.num_ranks))
    step = max(sum(per_stage[k].step_ms for k in order.stages_of(r)) for r in range(order.num_ranks))
    return work + (order.num_ranks - 1) * max(busy) + step


def rank_sends_ms(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> list[tuple[float, float]]:
    """Per rank: (its stages' sends its runtime runs beside the compute, ms per microbatch
    (stagesends.beside_ms), the sends of its warm-up forwards it waits for at once, ms in all
    (stagesends.warmup_sends)): what chunked_linear_ms takes out of the rank's work and adds back to it,
    (0, 0) where the runtime runs no send beside its compute."""
    order = schedule_of(setup)
    view = stages_view(setup, order)
    costs = {layer.name: layer for layer in layer_costs(profile)}
    stage_layers = [[costs[name] for name in stage.layers] for stage in pipeline_stages(ranks, setup)]
    return _rank_sends(order, stagesends.beside_ms(order, stage_layers, view))


def _rank_sends(order: schedules.Schedule, beside: list[tuple[float, float]] | None) -> list[tuple[float, float]]:
    if not beside:
        return [(0.0, 0.0)] * order.num_ranks
    held = stagesends.warmup_sends(order) if any(out for out, _ in beside) else [{}] * order.num_ranks
    return [(sum(sum(beside[k]) for k in order.stages_of(r)), sum(count * beside[k][0] for k, count in held[r].items()))
            for r in range(order.num_ranks)]


def sends_held_bytes(first: LayerCost, last: LayerCost, *, stage: int, order: schedules.Schedule,
                     training: TrainingSetup) -> tuple[int, int]:
    """Per microbatch, the stage's output and input gradient held until the step ends
    (schedules.ChunkBytes), where the schedule's runtime holds its sends (Schedule.holds_sends):
    torch's runtime for several stages per rank waits for its sends only then, and a neighbour
    on the same rank (a V's turn) keeps the tensor it was handed in its receive buffer as long
    (measured on the runtime: a rank's live bytes grew by one boundary tensor per send or
    hand-over); and the outputs the schedule itself keeps to the step's end (rules.outputs_held:
    from a microbatch's backward on, the same tensor its send would hold, counted once). On a walked schedule's last
    stage, each microbatch's loss value with its output (lossvalues.walked_value_bytes)."""
    kept = outputs_held(stage, order.num_stages, training, ranks=order.num_ranks)  # the schedule's output_chunks
    value = lossvalues.walked_value_bytes(stage, order, training)
    if not order.holds_sends or not runtimes.of(training).sends_held_to_step_end:
        return (last.output_bytes if kept else 0) + value, 0
    output = last.output_bytes if stage + 1 < order.num_stages or kept else 0
    input_grad = first.input_bytes if stage > 0 else 0
    return output + value, input_grad


def loss_freed_at_input_pass_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """Per microbatch, what the loss keeps that a split backward's input pass frees on the pipeline's last stage:
    torch's stage_backward_input ends by detaching the loss (`t.detach_()`, torch 2.13.0 cf30153c
    distributed/pipelining/_backward.py 263-265), which drops the loss's graph and the tensors it saved
    (cross-entropy's log-softmax result), so only the loss value (kept in backward_state for W) stays to the weight
    pass (docs/framework-facts.md §306). From the loss's recorded allocations where the profile has them (what its
    forward made and kept, less its output: not the targets it saves, which the schedule's chunks hold), else the
    loss's kept bytes less the 4 B loss value (loss_kept_bytes); 0 on any other stage."""
    if stage != setup.pipeline.stages - 1:
        return 0
    record = profile.loss_alloc
    if record is None or not record.forward:
        return max(0, loss_kept_bytes(profile, stage, setup) - 4)
    sizes, live = {}, {}
    for event in record.forward:  # n > 0 allocates the next id, -k frees id k (AllocRecord)
        if event > 0:
            sizes[len(sizes) + 1] = event
            live[len(sizes)] = event
        else:
            live.pop(-event, None)
    live.pop(record.output, None)
    return sum(live.values())


def step_end_bytes(order: schedules.Schedule, rank: int, held: dict[int, schedules.ChunkBytes], *,
                   last_output_bytes: int, training: TrainingSetup) -> float:
    """What rank `rank` holds at its step's end beyond what it holds all iteration, once every
    microbatch's backward has run (no activations then): the sum of its stages' parts
    (stage_end_bytes), `last_output_bytes` the last stage's output (the logits)."""
    return sum(stage_end_bytes(order, k, held[k], output_bytes=last_output_bytes, training=training)
               for k in order.stages_of(rank))


def stage_end_bytes(order: schedules.Schedule, stage: int, held: schedules.ChunkBytes, *, output_bytes: int,
                    training: TrainingSetup) -> float:
    """Stage `stage`'s part of its rank's step end: the stage outputs and input gradients the
    schedule still keeps (`held`: score.chunk_bytes; a walked schedule's every microbatch, a
    closed form's last k, its warm-up's in flight, the M - k others being among the stage's
    buffers: rules.held_outputs_bytes) and, on the pipeline's last stage where the schedule keeps
    its outputs, their merge: `step()` returns `merge_chunks(output_chunks)`, a torch.cat of the
    M outputs (`output_bytes` each, the logits) while output_chunks still holds them, emptied only
    as the next step begins (torch 2.6.0, git 2236df17, the release of torch 1963fc8's month:
    pipelining/schedules.py 478-509 PipelineScheduleSingle.step, 1168-1199
    PipelineScheduleMulti.step; microbatch.py 349-470 merge_chunks; stage.py 507-514
    clear_runtime_states). The records whose schedule keeps the last stage's outputs
    (rules.outputs_held) are those whose step merges them: torch keeps output_chunks to return
    them (RuntimeFacts.outputs_held_to_step_end).

    Linear in held.sent_output, held.sent_input_grad and output_bytes, and independent of what
    the stage recomputes: the solvers add it up from the stage's first and last layers
    (opening_end_bytes + closing_end_bytes)."""
    microbatches = order.num_microbatches
    if order.actions:
        end = microbatches * (held.sent_output + held.sent_input_grad)
    else:
        k = schedules.one_chunk_in_flight(order.name, num_ranks=order.num_ranks, num_microbatches=microbatches,
                                          rank=order.stage_to_rank[stage])
        end = k * held.sent_output
    last = order.num_stages - 1
    if stage == last and outputs_held(last, order.num_stages, training, ranks=order.num_ranks):
        end += microbatches * output_bytes
    return end


def closing_end_bytes(last: LayerCost, *, stage: int, order: schedules.Schedule, training: TrainingSetup) -> float:
    """What `last`, closing pipeline stage `stage`, adds to its rank's step end: its output's part
    of stage_end_bytes (the sends and kept outputs, the last stage's merge)."""
    output, _ = sends_held_bytes(last, last, stage=stage, order=order, training=training)
    return stage_end_bytes(order, stage, schedules.ChunkBytes(0.0, 0.0, sent_output=output),
                           output_bytes=last.output_bytes, training=training)


def opening_end_bytes(first: LayerCost, *, stage: int, order: schedules.Schedule, training: TrainingSetup) -> float:
    """What `first`, opening pipeline stage `stage`, adds to its rank's step end: its input
    gradient's part of stage_end_bytes (held by its send where the runtime holds sends)."""
    if not order.holds_sends:  # sends_held_bytes holds no input gradient then: nothing (the DP asks often)
        return 0.0
    _, input_grad = sends_held_bytes(first, first, stage=stage, order=order, training=training)
    return stage_end_bytes(order, stage, schedules.ChunkBytes(0.0, 0.0, sent_input_grad=input_grad),
                           output_bytes=0, training=training)
