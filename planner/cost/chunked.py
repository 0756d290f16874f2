"""Schedules whose ranks hold several stages (interleaved 1F1B, ZB, ZBV, DualPipeV): the stages
as ranks, and a rank's peak and the iteration from the simulated order of torch's own schedules."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.cost import allocator, schedules
from planner.cost.assembly import (
    PlanCost,
    StageCost,
    fragmentation,
    host_cap_bytes,
    limit_bytes,
    option_indices,
    peak_bytes,
    stage_cost,
    workspace_bytes,
)
from planner.cost import gradtiming
from planner.cost.layers import (
    LayerCost,
    layer_costs,
)
from planner.cost.rules import (
    runtime_facts,
    compute_ms,
    rank_tied_once_bytes,
)
from planner.cost.terms import Context
from planner.schema import (
    OPTION_OFFLOAD,
    SPLIT_BACKWARD_SCHEDULES,
    Profile,
    StagePlan,
    TrainSetup,
)

# ---------------------------------------------------------------- schedules with chunks
#
# Interleaved 1F1B, ZB, ZBV and DualPipeV give each rank several stages (chunks). Every
# stage is scored by stage_cost as the stage of a P·V-stage pipeline (its layers' rows, its
# position's: the batch on the first, the loss on the last, PipelineStage's receive buffers on
# each), and a rank adds its stages up, with two things the schedule decides, read from its
# simulation of torch's own action order (planner/cost/schedules.py):
#   activations_r = max over the rank's steps t of Σ_c live_c(t) · kept_c   (the peak step
#                   depends on the chunks' bytes); zero-bubble schedules (ZB, ZBV, DualPipeV)
#                   keep a microbatch's activations until its weight-gradient pass: all of
#                   kept_c counted until W, an upper bound (W needs only the linears' inputs)
#   T_iter        = the simulated makespan (each stage's forward, and its backward split
#                   evenly into input and weight gradient where the schedule splits it, as
#                   Qi et al. 2023 take T_B ≈ T_W for transformer layers) + the slowest step
# and the rank's peak = static + buffers + max(activations + the largest transient, scratch).


def schedule_of(setup: TrainSetup) -> schedules.Schedule:
    return schedules.build_schedule(setup.pipeline.schedule, num_ranks=setup.pipeline.stages,
                                    num_microbatches=setup.pipeline.microbatches, num_chunks=setup.pipeline.chunks)


def stage_setup(setup: TrainSetup, order: schedules.Schedule) -> TrainSetup:
    """The setup each stage is scored under: one of P·V stages, its rank's cap."""
    caps = [setup.pipeline.mem_caps_bytes[rank] for rank in order.stage_to_rank]
    return setup.model_copy(update={"stages": order.num_stages, "schedule": "GPipe", "chunks": 1,
                                    "mem_caps_bytes": caps, "parallel_stages": None})


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


def evaluate_chunked(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """Score a plan of a chunked schedule: one StagePlan per rank whose `chunks` are its
    stages' layers, chunk 0 first (see the section's comment)."""
    order = schedule_of(setup)
    if len(ranks) != setup.pipeline.stages:
        raise ValueError(f"plan has {len(ranks)} ranks, setup has {setup.pipeline.stages}")
    staged: dict[int, tuple[list[str], StagePlan]] = {}
    for rank, plan in enumerate(ranks):
        if len(plan.chunks) != setup.pipeline.chunks:
            raise ValueError(f"rank {rank} holds {len(plan.chunks)} chunks, the schedule gives it {setup.pipeline.chunks}")
        for chunk, stage in zip(plan.chunks, order.stages_of(rank)):
            staged[stage] = (chunk, plan)
        offloaded = [name for name in plan.layers if plan.option(name) == OPTION_OFFLOAD]
        if offloaded:  # useful_options never gives a chunked stage one
            raise ValueError(f"rank {rank}'s layer {offloaded[0]} offloads its activations, which a chunked schedule "
                             f"does not model yet; recompute it instead")
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    if [name for stage in range(order.num_stages) for name in staged[stage][0]] != [layer.name for layer in costs]:
        raise ValueError("the ranks' chunks do not cover the profile's layers in pipeline order")
    inner = stage_setup(setup, order)
    per_stage, held = [], []
    split = setup.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES
    for stage in range(order.num_stages):
        names, plan = staged[stage]
        layers = [costs[position[name]] for name in names]
        cost = stage_cost(layers, option_indices(plan, layers), stage=stage, profile=profile, setup=inner)
        output, input_grad = sends_held_bytes(layers[0], layers[-1], stage, order, setup)
        # the single-stage buffers' one input gradient being sent is counted by the sends here
        per_stage.append(dataclasses.replace(cost, buffer_bytes=cost.buffer_bytes - input_grad))
        kept = (0.0, cost.kept_bytes) if split else (cost.kept_bytes, 0.0)
        held.append(schedules.ChunkBytes(*kept, sent_output=output, sent_input_grad=input_grad,
                                         held_for_weight_grad=cost.weight_grad_bytes if split else 0,
                                         transient=cost.transient_bytes,
                                         input_pass_transient=cost.input_pass_peak_bytes if split else 0,
                                         weight_pass_transient=cost.weight_pass_peak_bytes if split else 0))
    peaks = schedules.peak_in_flight(order, stage_bytes=held)
    ctx = Context(profile, setup)
    rank_costs = []
    for rank in range(setup.pipeline.stages):
        mine = [per_stage[stage] for stage in order.stages_of(rank)]
        names = {name for stage in order.stages_of(rank) for name in staged[stage][0]}
        static = sum(c.static_bytes for c in mine) + rank_tied_once_bytes(profile, names, setup)
        buffers = sum(c.buffer_bytes for c in mine)
        # the rank's peak is after an action, or during a chunk's backward with that chunk's transient
        activations = int(round(peaks[rank].live - peaks[rank].transient))
        transient = int(round(peaks[rank].transient))
        scratch = (sum if profile.device.type == "cuda" else max)(c.step_scratch_bytes for c in mine)
        # each chunk's gradients made at its first backward (gradtiming.py), over torch's order
        lazy = [gradtiming.lazy_grad_bytes([costs[position[n]] for n in staged[stage][0]], inner)
                for stage in order.stages_of(rank)]
        above = gradtiming.walked(order.actions[rank], [c.kept_bytes for c in mine], lazy) if any(lazy) else 0.0
        peak = int(round(peak_bytes(static + buffers - sum(lazy), 1, activations, transient + above, scratch)))
        cuda = ctx.device_type == "cuda"
        rank_costs.append(StageCost(
            static_bytes=static, kept_bytes=sum(c.kept_bytes for c in mine),
            in_flight=peaks[rank].activations or peaks[rank].weight_grad_inputs, activation_bytes=activations,
            buffer_bytes=buffers, transient_bytes=transient, peak_bytes=peak,
            time_ms=sum(c.time_ms for c in mine), cap_bytes=setup.pipeline.mem_caps_bytes[rank],
            step_ms=sum(c.step_ms for c in mine), step_scratch_bytes=scratch, comm_ms=sum(c.comm_ms for c in mine),
            host_bytes=sum(c.host_bytes for c in mine), host_cap_bytes=host_cap_bytes(setup),
            limit_bytes=limit_bytes(rank, ctx),
            reserved_bytes=allocator.reserved_bytes(peak, fragmentation(setup, ctx.device_type)) if cuda else None,
            workspace_bytes=workspace_bytes(rank, ctx)))
    return PlanCost(stages=rank_costs, iteration_ms=chunked_iteration_ms(per_stage, costs, staged, order, setup))


def as_ranks(stages: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """A plan's pipeline stages (P·V of them, in order) as its ranks, each with its chunks: the
    stages themselves where each rank holds one (ranks_of)."""
    return list(stages) if setup.pipeline.chunks == 1 else ranks_of(stages, setup)


def chunked_linear_ms(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> float:
    """The chunked MILP's linear time for a plan (milp._chunked_time, from each of its P·V
    stages' busy time as evaluate_chunked scores them): M·Σ a rank's stages' busy + (P - 1)·the
    slowest stage + the slowest rank's step. The search holds the MILP's objective to it; the
    plan reports the simulated schedule's time (evaluate)."""
    order = schedule_of(setup)
    inner = stage_setup(setup, order)
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    per_stage = []
    for k, stage in enumerate(pipeline_stages(ranks, setup)):
        layers = [costs[position[name]] for name in stage.layers]
        per_stage.append(stage_cost(layers, option_indices(stage, layers), stage=k, profile=profile, setup=inner))
    busy = [cost.busy_ms for cost in per_stage]
    work = max(setup.pipeline.microbatches * sum(busy[k] for k in order.stages_of(r)) for r in range(order.num_ranks))
    step = max(sum(per_stage[k].step_ms for k in order.stages_of(r)) for r in range(order.num_ranks))
    return work + (order.num_ranks - 1) * max(busy) + step


def sends_held_bytes(first: LayerCost, last: LayerCost, stage: int, order: schedules.Schedule,
                     setup: TrainSetup) -> tuple[int, int]:
    """Per microbatch, the stage's output and input gradient held until the step ends
    (schedules.ChunkBytes): torch's runtime for several stages per rank waits for its sends only
    then, and a neighbour on the same rank (a V's turn) keeps the tensor it was handed in its
    receive buffer as long (measured on the runtime: a rank's live bytes grew by one boundary
    tensor per send or hand-over)."""
    if not runtime_facts(setup).sends_held_to_step_end:
        return 0, 0
    output = last.output_bytes if stage + 1 < order.num_stages else 0
    input_grad = first.input_bytes if stage > 0 else 0
    return output, input_grad


def chunked_iteration_ms(per_stage: Sequence[StageCost], costs: Sequence[LayerCost], staged: dict,
                         order: schedules.Schedule, setup: TrainSetup) -> float:
    """The simulated makespan of the schedule with each stage's forward and backward (its sends
    and actions with them), plus the slowest rank's optimizer step."""
    forward = {layer.name: compute_ms(layer.fwd_ms, setup.time) for layer in costs}
    times = []
    for stage, cost in enumerate(per_stage):
        fwd = sum(forward[name] for name in staged[stage][0]) + cost.comm_ms / 2
        backward = max(cost.busy_ms - fwd, 0.0)
        times.append(schedules.StageTimes(fwd, backward / 2, backward / 2))
    steps = [sum(per_stage[stage].step_ms for stage in order.stages_of(rank)) for rank in range(order.num_ranks)]
    return schedules.simulate_time(order, stage_times=times).makespan_ms + max(steps)
