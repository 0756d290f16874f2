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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from planner.errors import UserError
from planner.models.timelimit import time_limit

Layers = list[tuple[str, nn.Module]]


@dataclass
class Chain:
    """What the profiler measures: the layers, one microbatch, and each layer's output
    on it (the next layer's input), all on the device in the dtype."""

    layers: Layers
    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    layer_outputs: list[torch.Tensor]


def cast_batch(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Floating tensors take the profile's dtype; integer token ids stay integers. Each in storage of its own,
    as the runtime holds its batch (runtime/worker.py replica_batch clones its slice): example_batch's inputs
    and targets sliced from one tensor of seq + 1 tokens a row would record that tensor's bytes as each one's,
    and a loss that flattens its non-contiguous targets a copy the runtime never makes (§44.smallfix)."""
    moved = tensor.to(device=device, dtype=dtype) if tensor.is_floating_point() else tensor.to(device=device)
    return moved.clone() if moved is tensor else moved


def default_loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if not target.is_floating_point():
        return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))
    return nn.functional.mse_loss(output.float(), target.float())


def compact_loss(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """`loss_fn` whose value owns no more memory than it shows: torch's mse_loss on cpu
    returns its mean as a view of the whole elementwise buffer (0.5 MiB behind a 4-byte
    scalar), and torch's pipeline schedule keeps every microbatch's loss until the step
    ends, so the last stage held M - 1 such buffers the cost model never saw. A copy of
    such a value (the same number, the same gradient) lets the buffer go."""

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = loss_fn(output, target)
        if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > value.numel() * value.element_size():
            return value.clone()
        return value

    return loss


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
    timeout_s: float | None = None  # bound on each call into the file; None: unbounded

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
            return compact_loss(default_loss_fn)
        if not callable(user_fn):
            raise UserError(f"{self.path}: loss_fn must be a function (output, target) -> Tensor")
        return compact_loss(user_fn)

    def bounded(self, what: str):
        """A context in which the user's code may run at most timeout_s seconds."""
        return time_limit(self.timeout_s, f"{self.path}: {what}", self.path)

    def _call(self, name: str, *args):
        fn = getattr(self.module, name)
        with self.bounded(f"{name}()"):
            try:
                return fn(*args)
            except SystemExit as exc:
                raise UserError(f"{self.path}: {name}() called sys.exit({exc.code!r}); {_NO_EXIT}") from None
            except Exception as exc:  # the user's code: show where it broke, not our stack
                raise UserError(f"{self.path}: {name}() raised {_user_traceback(exc, self.path)}") from exc

    def check_loss(self, output: torch.Tensor, targets: torch.Tensor) -> None:
        """The loss runs once on the chain's output, so a mismatch blames the right function."""
        if getattr(self.module, "loss_fn", None) is None:
            _check_default_loss(output, targets, self.path)
            return
        with self.bounded("loss_fn()"):
            try:
                self.loss_fn(output, targets)
            except SystemExit as exc:
                raise UserError(f"{self.path}: loss_fn() called sys.exit({exc.code!r}); {_NO_EXIT}") from None
            except Exception as exc:
                raise UserError(
                    f"{self.path}: loss_fn(output, target) failed on the last layer's output (shape "
                    f"{tuple(output.shape)}) and example_batch()'s targets (shape {tuple(targets.shape)}): "
                    f"{_user_traceback(exc, self.path)}"
                ) from exc


_NO_EXIT = "a model file must return, not exit: ckplan runs it in its own process"


def _check_default_loss(output: torch.Tensor, targets: torch.Tensor, path: Path) -> None:
    """The default loss (the file defines no loss_fn) needs targets shaped like the output:
    class ids for every output row (cross-entropy), or values of the output's shape (MSE)."""
    if not targets.is_floating_point():
        expected, rule = tuple(output.shape[:-1]), "cross-entropy: integer targets, one class id per output row"
    else:
        expected, rule = tuple(output.shape), "mean-squared error: floating targets of the output's shape"
    if tuple(targets.shape) != expected:
        raise UserError(
            f"{path}: example_batch() returns targets of shape {tuple(targets.shape)} but the last layer's output "
            f"has shape {tuple(output.shape)}; the file defines no loss_fn, and the default loss ({rule}) needs "
            f"targets of shape {expected}: fix the targets or define loss_fn(output, target)"
        )


def load_model_file(path: str | Path, *, timeout_s: float | None = None) -> ModelFile:
    """Import the file (within timeout_s seconds, when given) and check it defines the contract's
    functions; the ModelFile bounds every later call into the file by timeout_s too."""
    path = Path(path).resolve()
    if path.is_dir():
        raise UserError(f"model file {path} is a folder, not a file; give the path of a .py model file")
    if not path.is_file():
        raise UserError(f"model file {path} does not exist; check the path")
    if path.suffix != ".py":
        raise UserError(f"model file {path} is not a Python file (.py); see the model-file contract in the README")
    _moved_modules(path)
    module_name = f"ckplan_model_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    try:
        with time_limit(timeout_s, f"importing model file {path}", path):
            _import(spec, module, path)
    except BaseException:
        del sys.modules[module_name]
        raise
    for required in ("build_model", "example_batch"):
        if not callable(getattr(module, required, None)):
            raise UserError(
                f"model file {path} defines no function {required}(); the contract needs "
                "build_model() and example_batch(micro_batch_size)"
            )
    return ModelFile(path=path, module=module, timeout_s=timeout_s)


# Modules a model file ckplan wrote may import from where they were before planner/ had packages:
# `profile --hf-config` wrote `from planner.hfmodels import model_file` until it moved to planner/models/.
MOVED_MODULES = {"planner.hfmodels": "planner.models.hfmodels"}


def _moved_modules(path: Path) -> None:
    """Let a model file import a module by its old name (MOVED_MODULES), where it does."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for old, new in MOVED_MODULES.items():
        if f"from {old} import" in text or f"import {old}" in text:
            sys.modules.setdefault(old, importlib.import_module(new))


def _import(spec, module: ModuleType, path: Path) -> None:
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        line = f"line {exc.lineno}: " if exc.lineno is not None else ""
        raise UserError(f"model file {path} is not valid Python: {line}{exc.msg}") from exc
    except SystemExit as exc:
        raise UserError(f"model file {path} called sys.exit({exc.code!r}) while being imported; {_NO_EXIT}") from None
    except Exception as exc:
        raise UserError(f"model file {path} failed to import: {_user_traceback(exc, path)}") from exc


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
        raise UserError(
            f"{path}: the model has no pipeline layers; build_model() must return an nn.Sequential with at least "
            "one child, or a module whose pipeline_layers() returns its layers as (fqn, module) pairs"
        )
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


def _own_forward(model: nn.Module) -> bool:
    """Whether forward() is the model's own: nn.Sequential's is the chain itself."""
    return not isinstance(model, nn.Sequential) and type(model).forward is not nn.Module.forward


def _main_tensor(output: object) -> torch.Tensor | None:
    """The tensor a forward() returns, or its first: a Hugging Face output's logits, a tuple's head."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, tuple | list) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Dropout off, so the chain and forward() see the same computation; each module's mode restored."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def forward_mismatch(model: nn.Module, layers: Layers, inputs: torch.Tensor, path: Path | str = "model") -> str | None:
    """Where the model defines its own forward(), run it and the layer chain once on the
    inputs (eval mode, no grad) and refuse when they differ: a position embedding, a
    causal mask or a residual done in forward() but in no layer is lost in a pipeline.
    Returns a warning when forward() cannot be compared (it raised, or returned no tensor)."""
    if not _own_forward(model):
        return None
    with torch.no_grad(), _eval_mode(model):
        chain = inputs
        for _, layer in layers:
            chain = layer(chain)
        try:
            direct = _main_tensor(model(inputs))
        except Exception as exc:  # forward() may need arguments the pipeline never passes
            return f"could not check the layer chain against {type(model).__name__}.forward(): it raised {type(exc).__name__}: {exc}"
    if direct is None:
        return f"could not check the layer chain against {type(model).__name__}.forward(): it returned no tensor"
    _compare_outputs(chain, direct, type(model).__name__, path)
    return None


def _compare_outputs(chain: torch.Tensor, direct: torch.Tensor, model_name: str, path: Path | str) -> None:
    remedy = ("pipeline_layers() must cover every step of forward() (a position embedding, a causal mask or a "
              "residual computed outside the layers is lost when the model is cut into stages)")
    if chain.shape != direct.shape:
        raise UserError(f"{path}: the layer chain returns shape {tuple(chain.shape)} but {model_name}.forward() "
                        f"returns {tuple(direct.shape)} on example_batch(); {remedy}")
    diff = (chain.double() - direct.double()).abs().max().item() if chain.numel() else 0.0
    scale = max(direct.double().abs().max().item() if direct.numel() else 0.0, 1.0)
    tolerance = 1e-4 if chain.dtype in (torch.float32, torch.float64) else 2e-2
    if not diff <= tolerance * scale:  # also refuses NaN
        raise UserError(f"{path}: the layer chain's output differs from {model_name}.forward() on example_batch() "
                        f"by up to {diff:.3g} (tolerance {tolerance * scale:.2g}); {remedy}")


def checkpointed_inside(layers: Layers) -> list[str]:
    """Layers that already checkpoint something inside themselves: Hugging Face's
    gradient_checkpointing_enable() flag, or torch's checkpoint_wrapper. The profile would
    measure them as kept and a plan could checkpoint them twice."""
    return [fqn for fqn, layer in layers if any(_checkpoints(module) for module in layer.modules())]


def _checkpoints(module: nn.Module) -> bool:
    return getattr(module, "gradient_checkpointing", False) is True or type(module).__name__ == "CheckpointWrapper"


def frozen_parameters(layers: Layers) -> list[tuple[str, int]]:
    """Each layer holding parameters with requires_grad False (a frozen backbone, a fixed embedding), with their
    count. The measured profile times their step as none (measure.py steps what requires a gradient) and records
    each layer's trained count beside its param_count (trained_param_count), so plans hold them as weights alone."""
    counts = [(fqn, sum(p.numel() for p in layer.parameters() if not p.requires_grad)) for fqn, layer in layers]
    return [(fqn, count) for fqn, count in counts if count]
