"""What a zero-bubble schedule's split backward holds and peaks at, per layer and recompute option:
torch's stage_backward_input, then stage_backward_weight, under the memory tracker
(LayerProfile's split_held_bytes, split_input_peak_bytes, split_peak_bytes)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from planner.profiler.storages import memory_tracker, storage_nbytes
from planner.runtime.recompute import layer_runner
from planner.schema import runs_split_backward


def split_per_option(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None,
                     names: list[str]) -> dict[str, tuple[int, int, int]]:
    """split_backward_bytes of the layer under each option a split backward can run; none where
    torch's split backward refuses the layer (its `detach_` of an output that is a view, e.g. a
    Linear's on a 3-d input: a zero-bubble schedule cannot run it either)."""
    found = {}
    for name in names:
        if runs_split_backward(name):
            x.grad = None
            try:
                found[name] = split_backward_bytes(layer_runner(layer, name), layer, x, grad)
            except RuntimeError:
                break
    x.grad = None
    for param in layer.parameters():  # a failed input pass may have left gradients half made
        if param.grad is not None:
            param.grad.zero_()
    return found


def split_backward_bytes(run, layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, *,
                         tracker=memory_tracker) -> tuple[int, int, int]:
    """A zero-bubble schedule's split backward of x -> run(x), as the pipeline runs it (torch's
    stage_backward_input, then stage_backward_weight): (what the input pass leaves live for the
    weight pass beyond what the forward kept, the incoming gradient and the input gradient it
    made; the input pass's peak over what is live before it, its input gradient included; the
    weight pass's peak over what is live before it). Zeros where there is no input gradient to
    split off (a first layer) or no weight."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    if grad is None or not x.requires_grad or not x.is_floating_point() or not weights:
        return 0, 0, 0
    with tracker(x.device) as memory:
        output = run(x)
        if not output.requires_grad:
            return 0, 0, 0
        before = memory.live_bytes
        memory.reset_peak()
        input_grads, groups = stage_backward_input([output], [grad], [x], iter(weights))
        input_peak = memory.peak_bytes - before
        live = memory.live_bytes
        held = live - before - sum(storage_nbytes(g) for g in input_grads if g is not None)
        memory.reset_peak()
        stage_backward_weight(iter(weights), groups)
        peak = memory.peak_bytes - live
        del output, input_grads, groups
    return max(0, held), max(0, input_peak), max(0, peak)
