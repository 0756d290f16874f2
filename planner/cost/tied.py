"""Parameters shared between pipeline layers (tied weights, e.g. GPT-2's token embedding
and LM head): found by identity in the built model.

A pipeline split puts each layer on one stage, so a parameter shared by layers on two
stages exists twice, once per stage. The runtime keeps the copies equal the way
Megatron keeps its embeddings tied: the same initial value on every owning stage, and
their gradients summed over the owning stages before each optimizer step. What that
cannot keep equal is refused (`check_tieable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from planner.errors import UserError


@dataclass(frozen=True)
class TiedParam:
    """One parameter reachable from several pipeline layers, under one name per layer."""

    names: tuple[tuple[str, str], ...]  # (layer fqn, parameter name inside that layer), in layer order
    param_count: int
    param_bytes: int

    @property
    def layers(self) -> list[str]:
        return [layer for layer, _ in self.names]


def tied_params(layers: list[tuple[str, nn.Module]]) -> list[TiedParam]:
    """Every parameter that more than one pipeline layer holds, in model order."""
    holders: dict[int, list[tuple[str, str]]] = {}
    params: dict[int, nn.Parameter] = {}
    for fqn, layer in layers:
        for name, param in layer.named_parameters():
            holders.setdefault(id(param), []).append((fqn, name))
            params[id(param)] = param
    return [
        TiedParam(tuple(names), params[key].numel(), params[key].numel() * params[key].element_size())
        for key, names in holders.items() if len(names) > 1
    ]


def check_tieable(layers: list[tuple[str, nn.Module]], path: object = "the model") -> None:
    """Refuse sharing that summing gradients of whole parameters cannot keep: two
    different parameters (or a parameter and a buffer) of different layers over the same
    memory, e.g. one layer's weight a view of another's. Needs a materialised model (a
    meta build has no memory to compare)."""
    seen: dict[tuple[int, int], tuple[str, str, torch.Tensor]] = {}
    for fqn, layer in layers:
        for name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:
            if tensor.is_meta or tensor.numel() == 0:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.device.index or 0)
            first = seen.setdefault(key, (fqn, name, tensor))
            trained = isinstance(tensor, nn.Parameter) or isinstance(first[2], nn.Parameter)
            if first[0] != fqn and first[2] is not tensor and trained:
                raise UserError(
                    f"{path}: {first[0]}.{first[1]} and {fqn}.{name} share memory without being the same "
                    "parameter; ckplan keeps only whole shared parameters tied across stages: tie the "
                    "nn.Parameter itself (layer_b.weight = layer_a.weight)"
                )


def stage_of(stage_layers: list[list[str]]) -> dict[str, int]:
    return {name: index for index, names in enumerate(stage_layers) for name in names}


def cross_stage(tied: list[TiedParam], stage_layers: list[list[str]]) -> list[tuple[TiedParam, list[int]]]:
    """The tied parameters whose layers land on more than one stage, with those stages."""
    where = stage_of(stage_layers)
    spans = [(item, sorted({where[layer] for layer in item.layers})) for item in tied]
    return [(item, stages) for item, stages in spans if len(stages) > 1]


def lookup(module: nn.Module, layer: str, name: str) -> torch.Tensor:
    return module.get_submodule(layer).get_parameter(name)
