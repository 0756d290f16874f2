"""What each GPipe backward leaves held to the step's end, so that a stage past the first may peak at its last
backward rather than its first (issue 33; docs/framework-facts.md §714-§716, §45.ownunder).

torch's ScheduleGPipe runs all M forwards, then all M backwards, and waits for the backwards' sends only once the
last has run (torch 2.13.0 distributed/pipelining/schedules.py 930-955: `bwd_sends_to_wait`, each send's work holding
its tensor, the input gradient the stage sends back); the last stage keeps each microbatch's loss value to the step's
end as well (299-304, 318-339: `_internal_losses`, lossvalues.py). So at its j-th backward (0-based) a stage past the
first holds M - j microbatches' kept bytes K and j of these, h = G + v each (G: the input gradient, v: the loss
value): held + (M - j)·K + j·h + T, linear in j, the most at j = 0 (M·K, charged as the closed form's in-flight
microbatches) or at j = M - 1 (K + (M - 1)·h): the stage's peak is held + K + (M - 1)·max(K, h) + T. Where whole
gradients arrive at the first backward (gradtiming), both ends after it hold them: gradtiming.one_chunk.

1F1B is not affected: Schedule1F1B waits for each backward's send before firing the next (schedules.py 1149-1172),
the one in flight charged among the stage's buffers (rules.held_input_grads), and holds no more values than
lossvalues.held_values charges; a schedule of several stages per rank is walked (chunked.sends_held_bytes)."""

from __future__ import annotations

from planner.cost import lossvalues
from planner.cost.layers import LayerCost
from planner.cost.rules import runtime_facts
from planner.schema import TrainSetup


def sends_held(stage: int, setup: TrainSetup) -> bool:
    """Whether stage `stage` runs GPipe's backwards with an input gradient to send (past the first stage) and the
    runtime's record waits for those sends only at the step's end (sends_held_to_step_end): the replays of a step
    (reserve.py, fsdp2_chunks.one_stage_rank) hold each sent gradient as the cost model does."""
    pipeline = setup.pipeline
    return pipeline.schedule == "GPipe" and pipeline.chunks == 1 and pipeline.stages > 1 and stage > 0 and \
        runtime_facts(setup).sends_held_to_step_end


def held_per_backward_bytes(first: LayerCost, stage: int, setup: TrainSetup) -> int:
    """Per GPipe backward run, what stage `stage` (whose first layer is `first`) holds from then to the step's end,
    beyond the bytes charged to its microbatches in flight: the input gradient its send holds (not on the first
    stage, none where the stage's input needs no gradient: LayerCost.input_grad), where the runtime's record waits
    for its sends only at the step's end (sends_held_to_step_end), and on the last stage the loss value
    (lossvalues.held_values: 4 B). 0 under any other schedule, or without a pipeline."""
    pipeline = setup.pipeline
    if pipeline.schedule != "GPipe" or pipeline.chunks > 1 or pipeline.stages == 1:
        return 0
    grad = first.input_bytes if first.input_grad and sends_held(stage, setup) else 0
    value = lossvalues.LOSS_VALUE_BYTES if lossvalues.held_values(stage, setup) else 0
    return grad + value
