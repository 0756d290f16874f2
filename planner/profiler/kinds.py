"""Layer kinds: the solver treats layers of one kind as interchangeable."""

from __future__ import annotations

from torch import nn

from planner.profiler.storages import storage_key, storage_nbytes


def _structure(layer: nn.Module) -> tuple:
    """Class plus every parameter's and buffer's name, shape, dtype (and whether it trains)."""
    params = tuple((name, tuple(p.shape), p.dtype, p.requires_grad) for name, p in layer.named_parameters())
    buffers = tuple((name, tuple(b.shape), b.dtype) for name, b in layer.named_buffers())
    return (type(layer), params, buffers)


def layer_kinds(layers: list[tuple[str, nn.Module]]) -> list[str]:
    """One readable kind per layer: the class name for the first structure of a class
    seen, then "Block#2", "Block#3" for structurally different layers of that class."""
    structures: dict[str, list[tuple]] = {}  # class name -> its distinct structures, in order
    kinds = []
    for _, layer in layers:
        seen = structures.setdefault(type(layer).__name__, [])
        structure = _structure(layer)
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
