"""A layer's and the loss's transient bytes: the extra peak of a forward and backward beyond what they keep, followed
by a memory tracker (the device's allocator, or the fake profiler's storages), and how much of a layer's is the
gradient of its output (LayerProfile.incoming_grad_bytes)."""

from __future__ import annotations

import torch
from torch import nn

from planner.profiler.saved import LossFn
from planner.profiler.storages import memory_tracker, storage_nbytes


def _backward(output: torch.Tensor, grad: torch.Tensor | None) -> bool:
    """Backward through the layer if anything in it needs a gradient; whether it ran."""
    if grad is None or not output.requires_grad:
        return False
    torch.autograd.backward(output, grad)
    return True


def _transient_bytes(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, *,
                     tracker=memory_tracker) -> int:
    """Extra peak beyond what the layer keeps (_transient_parts' first)."""
    return _transient_parts(layer, x, grad, tracker=tracker)[0]


def _transient_parts(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, *,
                     tracker=memory_tracker) -> tuple[int, int]:
    """(transient, incoming): _transient_passes' first two."""
    return _transient_passes(layer, x, grad, tracker=tracker)[:2]


def _transient_passes(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, *,
                      tracker=memory_tracker) -> tuple[int, int, int]:
    """(transient, incoming): the extra peak beyond what the layer keeps, the forward's peak over what is live at
    its end (saved tensors and output) or the backward's over that plus the incoming gradient, which is live
    throughout the layer's backward; how much of it that gradient is, the transient less the transient
    without it (0 where the forward sets it): LayerProfile.incoming_grad_bytes; and the forward's alone
    (LayerProfile.forward_transient_bytes). `tracker(device)`: how memory is
    followed (the fake profiler's storages, whatever the device)."""
    with tracker(x.device) as memory:
        output = layer(x)
        kept_bytes = memory.live_bytes
        fwd_extra = memory.peak_bytes - kept_bytes
        memory.reset_peak()
        ran = _backward(output, grad)
        incoming = storage_nbytes(grad) if ran else 0
        bwd_extra = memory.peak_bytes - kept_bytes + incoming
        del output
    transient = max(0, fwd_extra, bwd_extra)
    return transient, transient - max(0, fwd_extra, bwd_extra - incoming), max(0, fwd_extra)


def forward_only_bytes(layer: nn.Module, x: torch.Tensor, *, tracker=memory_tracker) -> int:
    """A layer that runs no backward (its input needs no gradient and none of its parameters trains: a fine-tuning
    model's frozen first layers): its forward's peak with its input and output, the transient the cost model charges
    it. It keeps nothing, so neither tensor is any layer's kept bytes: the input is the layer before's output, freed
    once this layer returns, and the output only the next layer's input (torch 2.13's pipelining runs no backward
    through such layers: §730). At a stage's edges the receive buffer or the stage output pays for one of them."""
    with tracker(x.device) as memory:
        output = layer(x)
        peak = memory.peak_bytes
        del output
    return peak + storage_nbytes(x)


def _loss_transient_bytes(loss_fn: LossFn, output: torch.Tensor, targets: torch.Tensor, *,
                          tracker=memory_tracker) -> int:
    """Extra peak during the loss's forward and backward beyond what it keeps: e.g. the
    gradient of the log-softmax and of the logits during cross-entropy's backward."""
    leaf = output.detach().requires_grad_(output.is_floating_point())
    with tracker(output.device) as memory:
        value = loss_fn(leaf, targets)
        kept_bytes = memory.live_bytes
        fwd_extra = memory.peak_bytes - kept_bytes
        memory.reset_peak()
        if value.requires_grad:
            value.backward()
        bwd_extra = memory.peak_bytes - kept_bytes
        del value
        leaf.grad = None
    return max(0, fwd_extra, bwd_extra)
