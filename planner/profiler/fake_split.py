"""A fake profile's split backward times (`ckplan profile --fake`, planner/profiler/fake.py): torch's
own stage_backward_input and stage_backward_weight run on the layer under the fake mode's work
counters, per recompute option that can split, each pass's work at the roofline (the fake profile's
time model), as the measured profiler times them (planner/profiler/splitbackward.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc,
    stage_backward_input,
    stage_backward_weight,
)

from planner.models.archs import GPU
from planner.profiler.roofline import Work, roofline_ms
from planner.profiler.splitbackward import recorded_split_ms
from planner.runtime.recompute import layer_runner
from planner.schema import LayerProfile, runs_split_backward


def split_work(run, layer: nn.Module, x: torch.Tensor, grad: torch.Tensor, counting: Callable) -> tuple[Work, Work, Work]:
    """(input pass, weight pass, plain backward) work of x -> run(x), the first two split as a
    zero-bubble schedule runs it; `counting()`: the fake profile's counters (fake.counting), whose
    `done()` is the work so far. One forward serves both: the plain backward first, keeping the graph
    (`retain_graph`: no op of its own; a checkpoint recomputes per backward call, its selective
    policy's saved outputs found again by their index, torch/utils/checkpoint.py), the yardstick;
    then torch's stage_backward_input and stage_backward_weight on the same graph. The forward runs
    under the counters, so the passes' ops are classed by the module running them, on the tensor the
    stage cut at: that is `x` seen through a view (torch's own `_get_grad_fn_or_grad_acc` trick), so
    the counters' hooks meet a node, not a leaf (torch's stage_backward_input refuses a leaf in
    `_will_engine_execute_node` under autograd.grad), and torch's passes run as they would in the
    pipeline (docs/framework-facts.md §73); a region checkpointed whole (full, save-matmuls) reruns
    the layer's forward inside each backward pass, under the counters."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    for weight in weights:  # W adds into .grad (`weight.grad += dw`), as from a step's second microbatch on
        if weight.grad is None:  # and as the profile's bwd_ms was counted (fake.fake_measure)
            weight.grad = torch.zeros_like(weight)
    x.grad = None
    with counting() as done, warnings.catch_warnings():
        cut = x.view_as(x)  # no data moved; its backward a view of the gradient, which the counters skip
        output = run(cut)
        forward = done()
        output.backward(grad, retain_graph=True)
        before_split = done()
        plain = before_split - forward
        x.grad = None  # the plain backward's, through the view; the input pass sets cut.grad alone
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
        _, groups = stage_backward_input([output], [grad], [cut], iter(weights))  # sets cut.grad: no op
        input_pass = done() - before_split
        stage_backward_weight(iter(weights), groups)
        weight_pass = done() - before_split - input_pass
    del output, groups, cut
    x.grad = None
    layer.zero_grad(set_to_none=True)
    return input_pass, weight_pass, plain


def torch_param_groups(layer: nn.Module, x: torch.Tensor) -> list[list[str]]:
    """The parameter groups torch 2.13's stage_backward_input makes of `layer` on input `x` (one
    torch.autograd.grad call of stage_backward_weight each), each as its parameters' names, sorted:
    torch's own grouping (_backward.get_param_groups), which analytic_split counts from a block's
    structure. Runs the layer once forward and the input pass (real or fake tensors)."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    x = x.detach().requires_grad_(True)
    output = layer(x)
    _, groups = stage_backward_input([output], [torch.ones_like(output)], [x], iter(weights))
    names = {_get_grad_fn_or_grad_acc(p): name for name, p in layer.named_parameters() if p.requires_grad}
    found = sorted(sorted(names[node] for node in group["params"]) for group in groups)
    layer.zero_grad(set_to_none=True)
    return found


def with_split_times(profile: LayerProfile, layer: nn.Module, x: torch.Tensor | None, output: torch.Tensor, *,
                     gpu: GPU, counting: Callable, works: dict | None = None) -> LayerProfile:
    """The layer's profile with each splittable option's input_grad_ms and weight_grad_ms: the two
    passes' work at the roofline, in the proportion to the same count's plain backward that they
    hold, against the backward the profile charges the option (bwd_ms and its recompute), as the
    measured profiler records them (splitbackward.recorded_split_ms). `x` the layer's input (None:
    the batch, which has no gradient); the profile as it was where there is nothing to split (no
    weight, no floating output), and each option's as it was where torch's split refuses the layer
    (split_per_option's case: a zero-bubble schedule cannot run it either). Full's pair counts its
    rerun as torch runs it: once in the input pass and once in each parameter group's call of the
    weight pass (§62, §73). `works`: the passes' work by option already counted on a layer this one is
    like (fake_same.py), None where torch refused it; what is counted here is added to it."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    if x is None or not (x.is_floating_point() and output.is_floating_point() and weights):
        return profile
    x = x.detach().requires_grad_(True)  # cut at the layer's input, as a pipeline stage's
    grad = torch.zeros_like(output)
    found, works = {}, {} if works is None else works
    for index, option in enumerate(profile.recompute_options):
        if runs_split_backward(option.name):
            if option.name not in works:
                try:
                    works[option.name] = split_work(layer_runner(layer, option.name), layer, x, grad, counting)
                except RuntimeError:  # torch's split refuses the layer (an output that is a view)
                    works[option.name] = None
            if works[option.name] is None:
                continue
            rerun = 0.0 if index == 0 else option.recompute_ms
            input_ms, weight_ms = recorded_split_ms(tuple(roofline_ms(w, gpu) for w in works[option.name]),
                                                    profile.bwd_ms + rerun)
            found[option.name] = {"input_grad_ms": input_ms, "weight_grad_ms": weight_ms}
    options = [option.model_copy(update=found.get(option.name, {})) for option in profile.recompute_options]
    return profile.model_copy(update={"recompute_options": options})
