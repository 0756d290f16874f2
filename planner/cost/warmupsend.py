"""The stage output a 1F1B warm-up send keeps past its backward (issue 33; docs/framework-facts.md §666-§668).

torch's Schedule1F1B (torch 2.13.0 distributed/pipelining/schedules.py 1062-1147) keeps the Work of each warm-up
forward's send in `send_work` until the next warm-up forward replaces it; the last warm-up forward's send is fused
with the first backward's receive instead, so the Work of microbatch w - 2's send (w = min(M, P - s) warm-up
forwards, stage s of P) stays referenced through the whole steady phase, replaced only after it (line 1147). The
Work keeps the tensor it sends (gloo's SendWork::tensor_, NCCL's WorkNCCL::outputs_): that microbatch's stage output
outlives its backward, at the steady backwards w - 1 to M - w, each of which holds w microbatches in flight. So where
M - w >= w - 1 the stage holds one output beyond its in-flight microbatches at its peak; at 2 microbatches on stage 0
of 2 (w = 2, M - w = 0) none (measured on ckplan's runtime: tests/test_warmupsend.py). Where the schedule keeps
every output to the step's end anyway (rules.outputs_held: held_outputs_bytes counts this one among them), nothing
more; a schedule of several stages per rank holds every send to the step's end (chunked.sends_held_bytes)."""

from __future__ import annotations

from planner.cost import schedules
from planner.cost.layers import LayerCost
from planner.cost.rules import in_flight, outputs_held, runtime_facts
from planner.schema import TrainSetup


def held_send_outputs(stage: int, setup: TrainSetup) -> int:
    """How many stage outputs stage `stage`'s warm-up send keeps beyond its in-flight microbatches at its 1F1B
    peak (module docstring): 1 or 0."""
    pipeline = setup.pipeline
    if pipeline.schedule != "1F1B" or not schedules.closed_form(pipeline.schedule, pipeline.chunks):
        return 0
    if not runtime_facts(setup).warmup_send_held or \
            outputs_held(stage, pipeline.stages, setup.training, ranks=pipeline.stages):
        return 0
    warmup = in_flight(pipeline, stage)
    return int(warmup >= 2 and pipeline.microbatches - warmup >= warmup - 1)


def held_send_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> int:
    """The bytes of it: the stage's last layer's output (`layer` closes stage `stage`)."""
    return held_send_outputs(stage, setup) * layer.output_bytes
