"""Layer kinds: the solver treats layers of one kind as interchangeable."""

from __future__ import annotations

import torch
from torch import nn

from planner.profiler.storages import storage_key, storage_nbytes


def _structure(layer: nn.Module) -> tuple:
    """Class plus every parameter's and buffer's name, shape, dtype (and whether it trains)."""
    params = tuple((name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in layer.named_parameters())
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in layer.named_buffers())
    return (type(layer), params, buffers)


def layer_kinds(layers: list[tuple[str, nn.Module]], input_grads: list[bool] | None = None) -> list[str]:
    """One readable kind per layer: the class name for the first structure of a class
    seen, then "Block#2", "Block#3" for structurally different layers of that class. `input_grads`
    (input_requires_grad): a layer running no backward (its output needs no gradient: the next layer's input) is a
    kind apart (a frozen block before every trained layer runs none, one after them does)."""
    structures: dict[str, list[tuple]] = {}  # class name -> its distinct structures, in order
    kinds = []
    for index, (_, layer) in enumerate(layers):
        seen = structures.setdefault(type(layer).__name__, [])
        structure = (_structure(layer), [*input_grads[1:], True][index] if input_grads else None)
        if structure not in seen:
            seen.append(structure)
        index = seen.index(structure)
        kinds.append(type(layer).__name__ + (f"#{index + 1}" if index else ""))
    return kinds


def lookup_param_count(layer: nn.Module) -> int:
    """The layer's embedding tables (nn.Embedding's, nn.EmbeddingBag's): parameters whose gradient the lookup's
    backward makes, not a linear's GEMM (LayerProfile.lookup_param_count), each shared table counted once."""
    tables = {id(p): p for module in layer.modules() if isinstance(module, (nn.Embedding, nn.EmbeddingBag))
              for p in module.parameters(recurse=False) if p.requires_grad}
    return sum(p.numel() for p in tables.values())


def buffer_bytes(layer: nn.Module) -> int:
    """The layer's registered buffers (module.buffers(): a fixed table, a mask), each storage once
    (LayerProfile.buffer_bytes)."""
    return sum({storage_key(b): storage_nbytes(b) for b in layer.buffers()}.values())


def input_grads(layers: list[tuple[str, nn.Module]], layer_inputs: list[torch.Tensor]) -> list[bool]:
    """Whether each layer's input requires a gradient in the model's own forward (LayerProfile.input_requires_grad):
    the batch's never does; each layer runs once, grad-enabled, on its input cut from the graph and requiring a
    gradient as the layer before's output does, and autograd says whether its output does (it does where the input
    does or a parameter it uses trains: §730)."""
    needs = [False]
    with torch.enable_grad():
        for (_, layer), x in zip(layers[:-1], layer_inputs[:-1], strict=True):
            output = layer(x.detach().requires_grad_(needs[-1] and x.is_floating_point()))
            needs.append(isinstance(output, torch.Tensor) and output.requires_grad)
            del output
    return needs
