"""Which layers a fake profile may measure once (`ckplan profile --fake`, planner/profiler/fake.py).

Under FakeTensorMode no op reads a value: what a layer's fake run records (its work per pass, its
transients, kept bytes per option, allocation records, Float8 calls, split backward) is a function
of what the run can see: the module tree's classes and plain attributes, its parameters' and
buffers' metadata, its input's and output's metadata, and the hooks torch calls. Two layers equal
in all of that record the same figures, so fake_measure runs the first and copies it to the others
(a model of 32 identical decoder blocks runs one).

`signature` is that "all of that", built to err on the side of "different" (a false "different"
only costs time; a false "same" would be a wrong profile):

- every submodule's class (the type object) and path; any hook on any of them (forward, forward
  pre-, backward, backward pre-) makes the layer its own (None: never shared);
- every parameter and buffer: its path, tensor type, shape, stride, storage offset, dtype, device,
  whether it trains and has a gradient; a parameter the layer shares with another layer (a tied
  embedding) makes it its own, one shared inside the layer is recorded as the sharing;
- every plain attribute of every submodule (`training`, transformers' `sliding_window`,
  `is_causal`, `attention_type`, a MoE block's `top_k`): numbers, strings, enums, dtypes, and
  tuples, lists, dicts and sets of them by value; tensors held as attributes by their metadata;
  an instance of a Python class (a transformers config, which each of ckplan's Decoders holds a
  copy of in its rotary embedding) by its class and its __dict__, the same way; functions, classes
  and any other object (torch's C++ objects) by identity; a submodule held outside `_modules` by
  its path when it is inside the layer, else by identity;
- `layer_idx` is left out (transformers numbers every layer; its code reads it to index the KV
  cache, which training does not use), but where the module holds a config, every config
  list the index picks from (`layer_types`, `no_rope_layers`, ...) is read at it: a layer's
  own entry, not its number, is what its code can act on;
- the input as fake_measure feeds it (metadata, requires_grad, its storage's size) and the output.

What it cannot see it cannot prove equal: code that reads `layer_idx` for something other than a
per-layer config entry, or global state a layer's forward changes as it runs.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Hashable

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

IGNORED = {"layer_idx"}
# nn.Module's own bookkeeping: the trees and hooks are read on their own; state-dict hooks do not run
BOOKKEEPING = {"_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
               "_backward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
               "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"}
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
# a hook that only notes which layer is running (planner/profiler/device_attention.py: its attention kernels by
# layer) changes nothing a run computes; it carries this attribute, and no other hook is passed over
NOTES_ONLY = "ckplan_notes_only"
PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.layout,
         torch.memory_format, torch.Size)


class _Own(Exception):
    """The layer must be measured on its own."""


def tensor_facts(tensor: torch.Tensor) -> tuple:
    """What a fake run of a tensor can see: no values (a real tensor's values it can: its identity)."""
    real = None if isinstance(tensor, FakeTensor) or tensor.is_meta else id(tensor)
    return (real, type(tensor), tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), tensor.dtype,
            tensor.device, tensor.requires_grad, tensor.grad is None, tensor.untyped_storage().nbytes(),
            tensor._base is not None)


def signature(layer: nn.Module, x: torch.Tensor, output: torch.Tensor, shared: set[int]) -> Hashable | None:
    """The layer's key: equal keys, equal fake figures (the module's docstring). `x` the input as
    measured, `output` the layer's output; `shared`: ids of the parameters another layer holds too.
    None where the layer must be measured on its own."""
    paths: dict[int, str] = {}  # every submodule, parameter and buffer of the layer by its first path
    for named in (layer.named_modules, layer.named_parameters, layer.named_buffers):
        for path, item in named(remove_duplicate=False):
            paths.setdefault(id(item), path)
    try:
        tree = tuple(_module_facts(path, module, paths, shared)
                     for path, module in layer.named_modules(remove_duplicate=False))
    except _Own:
        return None
    same_storage = x.untyped_storage()._cdata == output.untyped_storage()._cdata
    return tree, tensor_facts(x), tensor_facts(output), same_storage


def renamed(linears: list, old: str, new: str) -> list:
    """Layer `old`'s nn.Linear calls (float8.module_linears) as layer `new`'s: each FQN and the FQN of
    the linear whose input it reads under the new layer's name."""

    def rename(fqn: str) -> str:
        return new + fqn[len(old):] if fqn == old or fqn.startswith(old + ".") else fqn

    return [dataclasses.replace(linear, fqn=rename(linear.fqn), reads=rename(linear.reads)) for linear in linears]


def shared_parameters(modules: list[nn.Module]) -> set[int]:
    """Ids of the parameters more than one of `modules` holds (tied weights)."""
    seen: dict[int, int] = {}
    shared = set()
    for index, module in enumerate(modules):
        for param in {id(p) for p in module.parameters()}:
            if seen.setdefault(param, index) != index:
                shared.add(param)
    return shared


def _module_facts(path: str, module: nn.Module, paths: dict[int, str], shared: set[int]) -> tuple:
    if any(not getattr(hook, NOTES_ONLY, False) for name in HOOKS for hook in (getattr(module, name, None) or {}).values()):
        raise _Own
    params = []
    for name, param in module._parameters.items():
        if param is not None and id(param) in shared:
            raise _Own
        params.append((name, None if param is None else (paths[id(param)], tensor_facts(param))))
    buffers = tuple((name, None if buffer is None else tensor_facts(buffer)) for name, buffer in module._buffers.items())
    attributes = tuple((name, _value(value, paths)) for name, value in vars(module).items()
                       if name not in BOOKKEEPING and name not in IGNORED)
    return path, type(module), tuple(params), buffers, attributes, _indexed_config(module)


def _indexed_config(module: nn.Module) -> tuple:
    """The entries of the module's config's per-layer lists at its layer_idx (transformers'
    layer_types and the like): what its code can act on in place of its number."""
    index, config = getattr(module, "layer_idx", None), getattr(module, "config", None)
    if not isinstance(index, int) or config is None:
        return ()
    found = []
    layers = getattr(config, "num_hidden_layers", None)  # a per-layer list has an entry a layer (else: any list)
    for name, value in sorted(vars(config).items()) if hasattr(config, "__dict__") else ():
        if isinstance(value, list | tuple) and 0 <= index < len(value) and len(value) == (layers or len(value)):
            found.append((name, _value(value[index], {})))
    return tuple(found)


def _value(value, paths: dict[int, str], depth: int = 0) -> Hashable:
    """A plain attribute as the signature compares it."""
    if depth > 8:  # a container nested that deep (or holding itself): not worth proving equal
        raise _Own
    inner = functools.partial(_value, paths=paths, depth=depth + 1)
    if isinstance(value, PLAIN) or isinstance(value, enum.Enum):
        return type(value), value
    if isinstance(value, torch.Tensor):
        return "tensor", paths.get(id(value)), tensor_facts(value)
    if isinstance(value, nn.Module):
        inside = paths.get(id(value))
        return ("module", inside) if inside is not None else ("object", id(value))
    if isinstance(value, tuple | list):
        return type(value), tuple(inner(item) for item in value)
    if isinstance(value, dict):
        return type(value), tuple((inner(key), inner(item)) for key, item in value.items())
    if isinstance(value, set | frozenset):
        return type(value), frozenset(inner(item) for item in value)
    if isinstance(value, functools.partial):
        return (functools.partial, inner(value.func), inner(value.args),
                inner(value.keywords))
    if isinstance(value, types.MethodType):
        return types.MethodType, value.__func__, inner(value.__self__)
    if _plain_object(value):  # a Python object's behaviour is its class's code on its state
        return type(value), tuple((name, inner(item)) for name, item in vars(value).items())
    return "object", id(value)  # functions, classes, C++ objects: the same object or different


HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a `class` statement, not by C code


def _plain_object(value) -> bool:
    """An instance whose state is all in its __dict__: a Python class's (every class of it one, no
    __slots__), not a function, a class or torch's C++ objects."""
    kind = type(value)
    if isinstance(value, type | types.FunctionType | types.BuiltinFunctionType) or not hasattr(value, "__dict__"):
        return False
    return kind.__module__.split(".")[:2] != ["torch", "_C"] and all(
        base.__flags__ & HEAPTYPE and "__slots__" not in vars(base) for base in kind.__mro__[:-1])
