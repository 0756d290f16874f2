"""A pipeline stage's gradient reductions where its runtime runs them after the stage's last
backward (the record's reduces_after_last_backward).

Read at torch 2.6.0 (torchtitan 9dec370's torch; the record's source names the lines): beside
torch's pipelining every backward but a stage's M-th runs with FSDP2's gradient sync off, and the
M-th, once its backward is queued, calls each FSDP2 group's post_backward in turn. Each waits on
the rank's compute stream for the previous group's reduce-scatter, copies its own gradients into
the reduce-scatter input there, and starts its reduce-scatter on FSDP2's stream; only then does the
schedule queue the stage's input-gradient send, whose NCCL stream waits for the compute stream. So
on the rank's stream the stage's M-th backward is followed by all its groups' reduce-scatters but the
last one (nothing waits for that: it runs beside what follows), and so is its send to the stage
before: the time charged at the stage's last backward (schedule_time.StageTimes.reduce_ms).

The reduce-scatters' time is dataparallel's (ring, bytes over the shard group's link); their
copy-ins stay in the step with FSDP2's other copies (fsdp2work.py). The last group is taken as the
stage's largest layer's (torchtitan's root group, the embedding or the head, is reduced first;
its last group is a block).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import runtimes
from planner.cost.dataparallel import expert_setup, grad_reduce_ms, held_expert_params, kept_whole
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup


def reduced_after_last_backward(setup: TrainSetup) -> bool:
    """Whether a pipeline stage's gradients, kept whole through its microbatches, are reduced only
    after its last backward, none beside it (the runtime record's reduces_after_last_backward;
    dataparallel.exposed_comm_ms then hides none behind the backward)."""
    return (setup.pipeline.stages > 1 and kept_whole(setup) and setup.data_parallel.dp > 1
            and runtimes.of(setup.training).reduces_after_last_backward)


def layer_reduce_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """One layer's gradient reduction once an iteration (its routed experts' in their own group),
    as dataparallel.exposed_comm_ms counts it."""
    dense = layer.param_count - layer.expert_param_count
    experts = (grad_reduce_ms(held_expert_params(layer.expert_param_count, setup), expert_setup(setup))
               if layer.expert_param_count else 0.0)
    return grad_reduce_ms(dense, setup) + experts


def stage_reductions_ms(layers: Sequence[LayerCost], setup: TrainSetup) -> tuple[float, float]:
    """(all the stage's reductions, the part its rank's stream waits for after the stage's last
    backward: all but the last group's); (0, 0) where the runtime reduces beside the backward."""
    if not reduced_after_last_backward(setup):
        return 0.0, 0.0
    each = [layer_reduce_ms(layer, setup) for layer in layers]
    return sum(each), sum(each) - max(each, default=0.0)
