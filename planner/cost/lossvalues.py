"""The loss values torch's pipelining keeps on the last stage, and the seed of its backward (issue 33;
docs/framework-facts.md §649, §669).

torch's schedules append each microbatch's loss to `_internal_losses` (torch 2.13.0 distributed/pipelining/schedules.py
299-304), kept to the step's end (`_update_losses`, 318-339, hands them to the caller's list); the last stage's backward
is `torch.autograd.backward` of the loss without a gradient, for which autograd makes `ones_like(loss)`
(autograd/__init__.py 225-234), held through that whole backward, the loss's and the layers'. A profile's loss bytes
count the value of each microbatch in flight (kept), and the cost model nets them off before the layers' backward as if
freed with the loss's saved tensors: the value stays. So at a layer's backward with k microbatches in flight (1F1B's
last stage: k = 1, its last backward after every loss is made; GPipe: k = M, every loss made in the forward phase) the
stage holds all M values, k - 1 of them charged as kept, and the seed: M - k + 2 values beyond what is charged. 4 B
each, an fp32 scalar (rules.loss_kept_bytes's loss value). Where the loss's own backward is the stage's peak, one value
fewer is beyond (that microbatch's is kept there); at the optimizer step the seed is gone: over by 4-8 B there.

A walked schedule (several stages a rank: interleaved 1F1B, ZBV) finds its peak by stepping through torch's actions
(schedules.rank_peak): there each microbatch's value, kept with its in-flight bytes up to its backward (or, split, its
weight pass: the input pass frees the loss's saved tensors but not its value, §306), stays from that backward on as a
held send's tensor does: charged per microbatch past B or W with the last stage's output (walked_value_bytes, through
chunked.sends_held_bytes: ChunkBytes.sent_output, the chunked MILP's sent-output rows and the step's end alike)."""

from __future__ import annotations

from planner.cost import runtimes, schedules
from planner.cost.rules import in_flight, runtime_facts
from planner.schema import TrainSetup

LOSS_VALUE_BYTES = 4  # an fp32 scalar, as rules.loss_kept_bytes charges a loss's value


def held_values(stage: int, setup: TrainSetup) -> int:
    """How many loss values (the seed among them) the last stage holds beyond its charged bytes at its peak (the
    module's docstring); 0 on any other stage, without a pipeline, or where the schedule is walked."""
    pipeline = setup.pipeline
    if stage != pipeline.stages - 1 or pipeline.stages == 1 or not runtime_facts(setup).loss_values_held:
        return 0
    if not schedules.closed_form(pipeline.schedule, pipeline.chunks):
        return 0
    return pipeline.microbatches - in_flight(pipeline, stage) + 2


def held_values_bytes(stage: int, setup: TrainSetup) -> int:
    return held_values(stage, setup) * LOSS_VALUE_BYTES


def walked_value_bytes(stage: int, order: schedules.Schedule, training) -> int:
    """Per microbatch past its backward, what the last stage of a walked schedule keeps to the step's end beyond its
    charged bytes: its loss value (the module's docstring); 0 on any other stage, on a closed form (held_values), or
    where the runtime's record does not keep the values."""
    if stage != order.num_stages - 1 or not order.actions or not runtimes.of(training).loss_values_held:
        return 0
    return LOSS_VALUE_BYTES
