"""One pipeline stage as a module: the plan's layers for that stage, nothing else.

The stage keeps each layer under its FQN in the full model ("blocks.3.qkv.weight"
stays "blocks.3.qkv.weight"), so parameters and gradients of a stage can be compared
with a single-process model by name. Each layer runs under its recompute option
(planner/runtime/recompute.py): "full" under `torch.utils.checkpoint.checkpoint(use_reentrant=False)`,
its activations dropped after forward and recomputed in backward; a selective option
checkpoints parts of it. A stage trains in train mode, and
each layer draws its random numbers (dropout) from a seed of its own per step and
microbatch, so a pipeline and one process draw the same ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Mapping

import torch
from torch import nn

from planner.cost.optimizers import make_optimizer
from planner.cost.tied import check_tieable
from planner.errors import UserError
from planner.models.modelfile import Layers, ModelFile, pipeline_layers
from planner.runtime.materialise import build_on_meta, init_hook
from planner.runtime.recompute import layer_runner, option_error
from planner.schema import OPTION_FULL, OPTION_NONE, StagePlan


class StageModule(nn.Module):
    """Runs `layers` in order, each under its recompute option: `options` maps a layer to its
    option's name (planner/runtime/recompute.py; absent: none), the layers named in `checkpointed` are
    full. A layer's option it does not have is a UserError naming both."""

    def __init__(self, layers: Layers, checkpointed: Iterable[str] = (), *, options: Mapping[str, str] | None = None):
        super().__init__()
        chosen = {**dict(options or {}), **dict.fromkeys(checkpointed, OPTION_FULL)}
        for fqn, layer in layers:
            _register(self, fqn, layer)
        # A plain list, not registered again: the layers are already children above.
        self._chain = [(fqn, layer, chosen.get(fqn, OPTION_NONE)) for fqn, layer in layers]
        self._runners = [_runner(fqn, layer, option) for fqn, layer, option in self._chain]
        self.running: str | None = None  # the layer whose forward runs (or raised)
        self.rng_key: tuple[int, int, int] | None = None  # (seed, step, microbatch) of the forward that runs

    @property
    def layer_names(self) -> list[str]:
        return [fqn for fqn, _, _ in self._chain]

    @property
    def layers(self) -> list[nn.Module]:
        return [layer for _, layer, _ in self._chain]

    @property
    def checkpointed(self) -> list[str]:
        return [fqn for fqn, _, option in self._chain if option == OPTION_FULL]

    @property
    def options(self) -> dict[str, str]:
        """Each layer's recompute option, none included."""
        return {fqn: option for fqn, _, option in self._chain}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for (fqn, _, _), run in zip(self._chain, self._runners):
            self.running = fqn
            if self.rng_key is not None:  # checkpoint saves this state and restores it to recompute
                torch.manual_seed(layer_rng_seed(*self.rng_key, fqn))
            x = run(x)
        return x


def _runner(fqn: str, layer: nn.Module, option: str):
    problem = option_error(fqn, layer, option)
    if problem is not None:
        raise UserError(problem)
    return layer_runner(layer, option)


def stage_options(stage: StagePlan) -> dict[str, str]:
    """The plan's recompute option of each layer of the stage whose option is not none."""
    chosen = {name: stage.option(name) for name in stage.layers}
    return {name: option for name, option in chosen.items() if option != OPTION_NONE}


def layer_rng_seed(seed: int, step: int, microbatch: int, fqn: str) -> int:
    """The seed of one layer's random numbers (dropout) on one microbatch of one step: the
    same on whichever stage the layer runs and in the one-process reference."""
    return zlib.crc32(f"{seed}/{step}/{microbatch}/{fqn}".encode())


def _register(root: nn.Module, fqn: str, layer: nn.Module) -> None:
    """Add `layer` under the dotted path `fqn`, creating empty containers on the way."""
    *parents, leaf = fqn.split(".")
    node = root
    for name in parents:
        if name not in node._modules:
            node.add_module(name, nn.Module())
        node = node._modules[name]
    node.add_module(leaf, layer)


def build_stage_module(model_file: ModelFile, stage: StagePlan, *, seed: int) -> StageModule:
    """The stage's layers of the model as `build_model` makes it under `seed` (so every
    rank and the one-process reference agree on the weights), in train mode."""
    by_name = dict(build_layers(model_file, seed=seed, keep=stage.layers))
    return stage_module([(fqn, by_name[fqn]) for fqn in stage.layers], options=stage_options(stage))


def stage_module(layers: Layers, checkpointed: Iterable[str] = (), *,
                 options: Mapping[str, str] | None = None) -> StageModule:
    """Train mode whatever the model was built in: a model file returning an eval()
    model (dropout off) must train as it would in one process."""
    return StageModule(layers, checkpointed, options=options).train()


def build_layers(model_file: ModelFile, *, seed: int, keep: Collection[str] | None = None) -> Layers:
    """The model's pipeline layers, built under `seed`. A model file with init_layer()
    is built on the meta device and only the layers in `keep` (all when None) get memory
    and values (planner.runtime.materialise); any other is built whole, as one process
    builds it, and its shared parameters checked to be keepable tied."""
    init_layer = init_hook(model_file)
    if init_layer is not None:
        return build_on_meta(model_file, init_layer, seed=seed, keep=keep)
    torch.manual_seed(seed)
    model = model_file.build_model()
    layers = pipeline_layers(model, model_file.path)
    check_tieable(layers, model_file.path)
    return layers


def training_batch(model_file: ModelFile, num_samples: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch every step trains on: drawn under `seed` alone, so the ranks and the
    one-process reference draw the same one however each built its model."""
    torch.manual_seed(seed)
    return model_file.example_batch(num_samples)


def optimizer_for(name: str, module: nn.Module) -> torch.optim.Optimizer | None:
    """The stage's optimizer; None for a stage of parameter-free layers (a lone ReLU):
    there is nothing to step."""
    params = [param for param in module.parameters() if param.requires_grad]
    return make_optimizer(name, params) if params else None


def torch_dtype(name: str) -> torch.dtype:
    """'float32', 'torch.bfloat16' -> the torch dtype."""
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise UserError(f"the plan's dtype {name!r} is not a torch dtype (e.g. float32, bfloat16)")
    return dtype


def to_device(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Move a batch tensor; floating tensors take the plan's dtype, indices stay integers."""
    if tensor.is_floating_point():
        return tensor.to(device=device, dtype=dtype)
    return tensor.to(device=device)


def allocate_grads(module: nn.Module) -> None:
    """Gradients exist from the start and are zeroed, never freed, between steps, so
    weights + grads + optimizer state stay steady as the cost model's static memory."""
    for param in module.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
