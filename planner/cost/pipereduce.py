"""A pipeline stage's gradient reductions where its runtime runs them after the stage's last
backward (the record's reduces_after_last_backward).

Read at torch 2.6.0 (torchtitan 9dec370's torch; the record's source names the lines): beside
torch's pipelining every backward but a stage's M-th runs with FSDP2's gradient sync off, and the
M-th, once its backward is queued, calls each FSDP2 group's post_backward in turn. Each waits on
the rank's compute stream for the previous group's reduce-scatter, copies its own gradients into
the reduce-scatter input there, and starts its reduce-scatter on FSDP2's stream; only then does the
schedule queue the stage's input-gradient send, whose NCCL stream waits for the compute stream. So
on the rank's stream the stage's M-th backward is followed by its groups' reduce-scatters, and so
is its send to the stage before: the time charged at the stage's last backward
(schedule_time.StageTimes.reduce_ms). Nothing waits for the last group's reduce-scatter; it is
charged with the others (at most one group a stage too much: 28 ms a stage on the 405B rows), so
that the charge is a sum over layers the solvers carry whatever the cuts (drain_ms).

The reduce-scatters' time is dataparallel's (ring, bytes over the shard group's link); their
copy-ins stay in the step with FSDP2's other copies (fsdp2work.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import schedules
from planner.cost.dataparallel import collectives_ms, reduced_after_last_backward
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup


def stage_reductions_ms(layers: Sequence[LayerCost], setup: TrainSetup) -> float:
    """The stage's reductions after its last backward, on its rank's stream and before its send; 0
    where the runtime reduces beside the backward (dataparallel.exposed_comm_ms charges them there)."""
    if not reduced_after_last_backward(setup):
        return 0.0
    return sum(collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                             frozen=layer.frozen_param_count)[1] for layer in layers)


def drain_ms(layers: Sequence[LayerCost], setup: TrainSetup) -> float:
    """What the stages' reductions add to a one-stage-a-rank schedule's closed form (the drain passes
    each stage's once, schedule_time.makespan_ms): every layer's, wherever the cuts fall, so the
    solvers add it as a constant (costmodel.pipeline_ms, the MILP's critical path); 0 for a schedule
    of several stages a rank, whose simulation places each stage's (schedule_time.simulate_time)."""
    if not schedules.closed_form(setup.pipeline.schedule, setup.pipeline.chunks):
        return 0.0
    return stage_reductions_ms(layers, setup)
