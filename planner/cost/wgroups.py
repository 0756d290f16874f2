"""A split backward's weight pass across a stage's layers: torch's stage_backward_weight keeps one
parameter group's weight gradients alive while the next group's are computed.

torch 2.13 pipelining/_backward.py 281-341: per param_group (stage_backward_input's
get_param_groups, 89-140: the parameters whose first node on the stage's input-to-output path is
the same, e.g. a Linear's weight and bias, keyed by that node, in the order of the stage's
parameters), `dweights = torch.autograd.grad(...)` returns the group's every weight gradient
together and adds them into `.grad`; the tuple stays bound to `dweights` (and its last tensor to
`dw`) until the next group's autograd.grad returns. So the next group's peak sits on top of the
last group's gradients, while the group's saved output gradient (`del param_group["grads"]`, what
the input pass left it: the profile's split_held_bytes) is gone. Within a layer the profiler's
split_peak_bytes saw the same (it runs stage_backward_weight on the layer); across two layers of a
stage, the profiler measures each layer's first group's peak and what its last group leaves
(splitbackward.split_backward_bytes); a profile made before they were recorded is charged the
layer's whole weight gradient as its carry, on its whole peak (above: a layer of several groups).
Measured on ckplan's own run (dp_tiny under ZBV, framework-facts §836-838): the peak is inside the
second layer's group, 4,224 B of the first layer's gradients beside the second's, the first's 512 B
saved gradient freed.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import dataparallel
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup


def weight_pass_carry_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> float:
    """What the layer's weight pass leaves alive while the stage's next layer's first group runs: the
    profile's split_carry_bytes (its last group's result less the saved gradients that group frees),
    or where it was not recorded, its whole weight gradient in the weights' dtype (autograd's, before
    it is added into .grad; a rank's share of routed experts) less what its input pass left it. 0 for
    a layer with no weight pass (no split peak)."""
    chosen = layer.options[option]
    if chosen.split_peak_bytes <= 0:
        return 0.0
    if chosen.split_carry_bytes is not None:
        return float(chosen.split_carry_bytes)
    trained = layer.trained_count - layer.expert_param_count + layer.expert_param_count / setup.data_parallel.ep
    return max(0.0, trained * dataparallel.param_bytes(setup).weights - chosen.split_held_bytes)


def weight_pass_first_peak_bytes(layer: LayerCost, option: int) -> float:
    """The layer's first parameter group's peak over what is live before its weight pass (the profile's
    split_first_peak_bytes), where the layer before's carry sits; its whole pass's where not recorded."""
    chosen = layer.options[option]
    return float(chosen.split_peak_bytes if chosen.split_first_peak_bytes is None else chosen.split_first_peak_bytes)


def weight_pass_left_bytes(layer: LayerCost, option: int) -> float:
    """Of the layer's carry, what stays to the end of the stage's weight pass (the profile's
    split_left_bytes: a checkpointed region's reruns its groups did not unpack, §889-§890); 0 where not
    recorded (profiles made before, charged as then) or where there is no weight pass."""
    chosen = layer.options[option]
    if chosen.split_peak_bytes <= 0 or chosen.split_left_bytes is None:
        return 0.0
    return float(chosen.split_left_bytes)


def weight_pass_peak_bytes(layers: Sequence[tuple[float, ...]]) -> float:
    """A stage's weight pass over what is live before it, from each layer's (weight-pass peak, first
    group's peak, carry[, left]) in stage order: each layer's peak, and its first group's on top of what
    the last earlier layer with a weight pass carries into it, both on what every earlier layer left to
    the pass's end (its carry less that is its last group's result, gone once the next group's returns)."""
    peak, bound, lefts = 0.0, 0.0, 0.0
    for layer_peak, first, layer_carry, *left in layers:
        if layer_peak > 0:
            peak = max(peak, lefts + max(layer_peak, first + bound))
            stays = min(left[0], layer_carry) if left else 0.0
            bound, lefts = layer_carry - stays, lefts + stays
    return peak
