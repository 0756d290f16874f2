"""Load a user's model file and check it against the model-file contract.

A model file is plain Python defining:

    build_model() -> torch.nn.Module                       # required
    example_batch(micro_batch_size) -> (inputs, targets)   # required
    loss_fn(output, target) -> Tensor                      # optional

The pipeline layers are the model's top-level children if it is an nn.Sequential,
else what its `pipeline_layers()` returns as ordered (fqn, module) pairs. Each layer
takes one tensor and returns one tensor.

Without `loss_fn`, the default is cross-entropy when the target is an integer
tensor (class indices, logits flattened over all leading dimensions), else
mean-squared error.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from planner.errors import UserError

Layers = list[tuple[str, nn.Module]]


def default_loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if not target.is_floating_point():
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))
    return nn.functional.mse_loss(output.float(), target.float())


def _user_traceback(exc: BaseException, path: Path, last: int = 3) -> str:
    """The last frames of the user's traceback that point into their file, plus the error."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    shown = "; ".join(f"line {f.lineno}: {(f.line or '').strip()}" for f in frames[-last:])
    where = f" at {shown}" if shown else ""
    return f"{type(exc).__name__}: {exc}{where}"


@dataclass
class ModelFile:
    """A loaded model file: its functions, called with errors that name the file."""

    path: Path
    module: ModuleType

    def build_model(self) -> nn.Module:
        model = self._call("build_model")
        if not isinstance(model, nn.Module):
            raise UserError(
                f"{self.path}: build_model() returned {type(model).__name__}, expected a torch.nn.Module"
            )
        return model

    def example_batch(self, micro_batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._call("example_batch", micro_batch_size)
        if not (isinstance(batch, tuple | list) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
            raise UserError(
                f"{self.path}: example_batch({micro_batch_size}) must return a pair of tensors "
                f"(inputs, targets), got {type(batch).__name__}"
            )
        return batch[0], batch[1]

    @property
    def loss_fn(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        user_fn = getattr(self.module, "loss_fn", None)
        if user_fn is None:
            return default_loss_fn
        if not callable(user_fn):
            raise UserError(f"{self.path}: loss_fn must be a function (output, target) -> Tensor")
        return user_fn

    def _call(self, name: str, *args):
        fn = getattr(self.module, name)
        try:
            return fn(*args)
        except Exception as exc:  # the user's code: show where it broke, not our stack
            raise UserError(f"{self.path}: {name}() raised {_user_traceback(exc, self.path)}") from exc


def load_model_file(path: str | Path) -> ModelFile:
    path = Path(path).resolve()
    if not path.is_file():
        raise UserError(f"model file {path} does not exist; check the path")
    if path.suffix != ".py":
        raise UserError(f"model file {path} is not a Python file (.py); see the model-file contract in the README")
    module_name = f"ckplan_model_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise UserError(f"model file {path} is not valid Python: line {exc.lineno}: {exc.msg}") from exc
    except Exception as exc:
        del sys.modules[module_name]
        raise UserError(f"model file {path} failed to import: {_user_traceback(exc, path)}") from exc
    for required in ("build_model", "example_batch"):
        if not callable(getattr(module, required, None)):
            raise UserError(
                f"model file {path} defines no function {required}(); the contract needs "
                "build_model() and example_batch(micro_batch_size)"
            )
    return ModelFile(path=path, module=module)


def pipeline_layers(model: nn.Module, path: Path | str = "model") -> Layers:
    """The ordered (fqn, module) pairs the pipeline is cut between."""
    if isinstance(model, nn.Sequential):
        layers = list(model.named_children())
    elif callable(getattr(model, "pipeline_layers", None)):
        layers = list(model.pipeline_layers())
    else:
        raise UserError(
            f"{path}: build_model() returned a {type(model).__name__} that is neither an nn.Sequential "
            "nor has a pipeline_layers() method returning (fqn, module) pairs"
        )
    if not layers:
        raise UserError(f"{path}: the model has no pipeline layers")
    for entry in layers:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], nn.Module)):
            raise UserError(f"{path}: pipeline_layers() must yield (fqn, module) pairs, got {entry!r:.80}")
        fqn, module = entry
        try:
            found = model.get_submodule(fqn)
        except AttributeError:
            found = None
        if found is not module:
            raise UserError(f"{path}: pipeline layer name {fqn!r} is not the FQN of that module in the model")
    names = [fqn for fqn, _ in layers]
    if len(set(names)) != len(names):
        raise UserError(f"{path}: pipeline layer names repeat; each layer must appear once")
    return layers


def check_chain(layers: Layers, inputs: torch.Tensor, path: Path | str = "model") -> list[torch.Tensor]:
    """Run the inputs through the layers one by one (no grad); return every layer's output.

    Names the layer that breaks the one-tensor-in, one-tensor-out contract.
    """
    outputs = []
    current = inputs
    previous = "example_batch()"
    with torch.no_grad():
        for fqn, layer in layers:
            try:
                current = layer(current)
            except Exception as exc:
                raise UserError(
                    f"{path}: layer {fqn!r} failed on the output of {previous} "
                    f"(shape {tuple(outputs[-1].shape) if outputs else tuple(inputs.shape)}): "
                    f"{type(exc).__name__}: {exc}; each layer must accept the previous layer's output"
                ) from exc
            if not isinstance(current, torch.Tensor):
                raise UserError(
                    f"{path}: layer {fqn!r} returned {type(current).__name__}, expected one tensor "
                    "(pipeline layers take one tensor and return one tensor)"
                )
            outputs.append(current)
            previous = f"layer {fqn!r}"
    return outputs
