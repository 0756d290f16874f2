"""Real model code on fake tensors (`ckplan profile --fake`, planner/profiler/fake.py): the mode, the
module's meta parameters and buffers and the batch moved onto it, and the one sentence a user gets when
the model code asks a fake tensor for a value it does not have (`.item()`, a boolean mask, MoE routing's
counts), naming the layer and the operation."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)

from planner.errors import UserError
from planner.profiler.saved import Layers


def new_mode() -> FakeTensorMode:
    """Real tensors made outside (a batch from example_batch()) are converted on entry."""
    return FakeTensorMode(allow_non_fake_inputs=True)


def fake_module(module: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """Replace every meta parameter and buffer of `module` by a fake tensor on the CPU, in
    place; a tensor several modules share stays one (tied weights stay tied)."""
    made: dict[int, torch.Tensor] = {}
    device = torch.device("cpu")

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in made:
            if tensor.device.type == "meta":
                out = mode.fake_tensor_converter.from_meta_and_device(mode, tensor, device)
            else:  # made on a real device despite the meta default: same shape, no data kept
                out = mode.from_tensor(tensor)
            made[id(tensor)] = nn.Parameter(out, requires_grad=tensor.requires_grad) \
                if isinstance(tensor, nn.Parameter) else out
        return made[id(tensor)]

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = fake(param)
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = fake(buffer)
    return module


def fake_tensor(tensor: torch.Tensor, mode: FakeTensorMode) -> torch.Tensor:
    if tensor.device.type == "meta":
        return mode.fake_tensor_converter.from_meta_and_device(mode, tensor, torch.device("cpu"))
    return mode.from_tensor(tensor.cpu() if tensor.device.type != "cpu" else tensor)


# What the ops that need a tensor's values are, in the user's words: the op a fake tensor
# refuses (DataDependentOutputException, DynamicOutputShapeException) names the call.
_VALUE_OPS = {
    "_local_scalar_dense": "reads a tensor's value as a Python number (.item(), int(), float(), or an if on a tensor)",
    "nonzero": "selects elements by their values (a boolean mask, nonzero(), or torch.where with one argument)",
    "masked_select": "selects elements by a boolean mask",
    "bincount": "counts by value (bincount(), as mixture-of-experts routing counts the tokens per expert)",
    "unique": "keeps the unique values (torch.unique)",
    "repeat_interleave": "repeats by counts held in a tensor (repeat_interleave)",
}


def value_dependence(exc: BaseException) -> tuple[str, str, str] | None:
    """(op, what it does, ' at FILE:LINE' in the user's code or '') for an exception caused by
    code that needs tensor values under FakeTensorMode, following its causes; None otherwise."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DataDependentOutputException | DynamicOutputShapeException):
            func = getattr(exc, "func", None)
            op = str(getattr(func, "__name__", func) or str(exc)).split(".")[0].removeprefix("aten::")
            phrase = _VALUE_OPS.get(op, "makes an output whose size or value depends on the tensor's values")
            return f"aten.{op}", phrase, _user_line(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _user_line(exc: BaseException) -> str:
    """' at file.py:LINE (code)' for the innermost frame of the exception outside torch and ckplan."""
    import traceback

    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in frame.filename and "/planner/" not in frame.filename]
    if not frames:
        return ""
    frame = frames[-1]
    code = f" ({frame.line.strip()})" if frame.line else ""
    return f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}{code}"


@contextmanager
def data_free(what: str, layers: Layers = ()):
    """Code that asks a fake tensor for a value (`.item()`, a boolean mask, a branch on data,
    MoE routing's counts) cannot run without the data: say which layer and which operation, and
    what to do, in one sentence, however the error was wrapped on its way out. `layers`: the
    pipeline layers whose forward may be running (the last one started is named)."""
    started: list[str] = []
    hooks = [layer.register_forward_pre_hook(partial(_started, started, name)) for name, layer in layers]
    try:
        yield
    except (UserError, DataDependentOutputException, DynamicOutputShapeException) as exc:
        found = value_dependence(exc)
        if found is None:
            raise
        op, phrase, line = found
        where = f"layer {started[-1]!r} of {what}" if started else what
        raise UserError(f"{where} {phrase}: {op}{line}; a --fake profile has shapes, not values, so it cannot run "
                        "that: profile without --fake where the model fits, or make that code shape-only") from exc
    finally:
        for hook in hooks:
            hook.remove()


def _started(started: list[str], name: str, module, args) -> None:
    started.append(name)


def hf_model_on_meta(config: dict, *, seq_len: int):
    """A transformers model from `config` (planner/models/hfmodels.py) built on meta in bfloat16 for training:
    (the model, its pipeline layers, its batch function, a new FakeTensorMode to make it fake in with
    fake_module). For the scripts and tests that trace one layer's ops."""
    from planner.models import hfmodels

    build, batch = hfmodels.model_file(config, seq_len=seq_len)
    with torch.device("meta"):
        model = build()
    model.to(dtype=torch.bfloat16).train()
    return model, model.pipeline_layers(), batch, new_mode()
