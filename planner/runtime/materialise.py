"""Build a model on the meta device and give memory only to the layers a process trains.

The recipe of torch.distributed.pipelining's docs and torchtitan: build the whole model
under `torch.device("meta")` (no memory, no init), keep what the stage owns, allocate
it, then initialise it. A model file opts in by defining

    def init_layer(name: str, layer: nn.Module) -> None

which fills every parameter and buffer of one pipeline layer in place (they arrive
allocated, uninitialised). Each layer is initialised under its own seed (from the run's
seed and the layer's position in the chain), so a layer gets the same values on
whichever stage it lands and in the one-process reference. A parameter several layers
share keeps the value its first holder gave it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import torch
from torch import nn

from planner.errors import UserError
from planner.models.modelfile import Layers, ModelFile, _user_traceback, pipeline_layers

InitLayer = Callable[[str, nn.Module], None]


def init_hook(model_file: ModelFile) -> InitLayer | None:
    hook = getattr(model_file.module, "init_layer", None)
    if hook is not None and not callable(hook):
        raise UserError(f"{model_file.path}: init_layer must be a function (name, layer) -> None")
    return hook


def layer_seed(seed: int, index: int) -> int:
    return (seed << 20) + index


def build_on_meta(model_file: ModelFile, init_layer: InitLayer, *, seed: int, keep: Collection[str] | None) -> Layers:
    """The model's pipeline layers; those in `keep` (all when None) on the CPU and
    initialised, the others left on the meta device (they hold no memory)."""
    try:
        with torch.device("meta"):
            model = model_file.build_model()
    except UserError as exc:
        raise UserError(f"{exc}; a model file that defines init_layer() must build on the meta device") from exc
    layers = pipeline_layers(model, model_file.path)
    # meta tensor id -> (that tensor, kept alive so its id is not reused; its allocated replacement)
    done: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for index, (fqn, layer) in enumerate(layers):
        if keep is None or fqn in keep:
            _materialise(fqn, layer, done, init_layer, seed=layer_seed(seed, index), path=model_file.path)
    for _, layer in layers:  # a layer left on meta shares what it shares with a kept one: identity shows ties
        for table, name, tensor in _meta_slots(layer):
            if id(tensor) in done:
                table[name] = done[id(tensor)][1]
    return layers


def _meta_slots(layer: nn.Module) -> list[tuple[dict, str, torch.Tensor]]:
    """(table, name, tensor) for every parameter and buffer of the layer still on meta."""
    return [(table, name, tensor) for module in layer.modules() for table in (module._parameters, module._buffers)
            for name, tensor in table.items() if tensor is not None and tensor.is_meta]


def _materialise(fqn: str, layer: nn.Module, done: dict[int, tuple[torch.Tensor, torch.Tensor]],
                 init_layer: InitLayer, *, seed: int, path: Path) -> None:
    earlier = []  # tensors an earlier layer initialised: they keep its values
    by_earlier = set(done)
    for table, name, tensor in _meta_slots(layer):
        if id(tensor) in done:
            table[name] = done[id(tensor)][1]
            if id(tensor) in by_earlier:
                earlier.append((table[name], table[name].detach().clone()))
            continue
        fresh = torch.empty_like(tensor, device="cpu")
        table[name] = nn.Parameter(fresh, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else fresh
        done[id(tensor)] = (tensor, table[name])
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            init_layer(fqn, layer)
    except Exception as exc:
        raise UserError(f"{path}: init_layer({fqn!r}) raised {_user_traceback(exc, path)}") from exc
    with torch.no_grad():
        for tensor, value in earlier:
            tensor.copy_(value)
