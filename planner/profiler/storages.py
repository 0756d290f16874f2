"""Tensor storages: the unit ckplan counts memory in.

Two tensors that share a storage (a view, an in-place result, the same tensor saved
by two ops) cost its bytes once, so everything here is keyed by the storage's data
pointer. Among storages that are alive at the same time data pointers are unique,
which is all the keys have to be.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planner.cost.allocator import block_bytes


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def storage_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of the whole storage behind `tensor`: a view keeps all of it alive."""
    return counted_bytes(tensor.untyped_storage().nbytes(), tensor.device)


_COUNTED_AS: ContextVar[str | None] = ContextVar("counted_as", default=None)


@contextmanager
def counted_as(device_type: str):
    """Count every storage inside as `device_type`'s allocator would, whatever device it is
    on: a fake profile for a GPU runs torch's CPU kernels on fake CPU tensors."""
    token = _COUNTED_AS.set(device_type)
    try:
        yield
    finally:
        _COUNTED_AS.reset(token)


def counted_bytes(nbytes: int, device: torch.device) -> int:
    """A storage's bytes as its device's allocator counts them: on cuda (or inside
    counted_as("cuda")) the caching allocator's 512-byte blocks (allocator.block_bytes),
    elsewhere exact."""
    return block_bytes(nbytes) if (_COUNTED_AS.get() or device.type) == "cuda" else nbytes


class StorageTracker(TorchDispatchMode):
    """Follows every storage an op creates inside the region, on any device.

    `live_bytes` is what those storages hold now, `peak_bytes` the most they held at
    once (since entry or the last `reset_peak()`), `created` the keys of every storage
    created in the region. Storages that existed before entry are never counted, not
    even when a view of them appears inside: an op's output that shares a storage
    with one of its arguments is not new.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.created: set[int] = set()
        self._alive: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        # lift_fresh hands back the tensor torch.tensor(...) just built outside dispatch.
        fresh = func is torch.ops.aten.lift_fresh.default
        arg_keys = set() if fresh else {storage_key(t) for t in _tensors((args, kwargs))}
        for tensor in _tensors(result):
            self._track(tensor.untyped_storage(), tensor.device, arg_keys)
        return result

    def __exit__(self, *exc_info):
        # Dropping the weakrefs drops their callbacks: nothing counts after the region.
        self._alive.clear()
        return super().__exit__(*exc_info)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _track(self, storage: torch.UntypedStorage, device: torch.device, arg_keys: set[int]) -> None:
        key, nbytes = storage._cdata, counted_bytes(storage.nbytes(), device)
        if nbytes == 0 or key in arg_keys or key in self._alive:
            return
        # Storage objects are preserved while their memory lives, so the callback
        # fires exactly when the memory is freed.
        self._alive[key] = weakref.ref(storage, partial(self._freed, key, nbytes))
        self.created.add(key)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _freed(self, key: int, nbytes: int, _ref: weakref.ref) -> None:
        if self._alive.pop(key, None) is not None:
            self.live_bytes -= nbytes


def _tensors(tree) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


class AllocatorTracker:
    """StorageTracker's interface from the CUDA caching allocator's counters.

    On a GPU the allocator is the truth: it sees workspaces no op returns and rounds
    sizes the way the memory is really taken. Frees of older storages inside the
    region count too, so `live_bytes` may go below zero.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base_bytes = 0

    def __enter__(self) -> AllocatorTracker:
        torch.cuda.synchronize(self.device)
        self._base_bytes = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc_info) -> None:
        torch.cuda.synchronize(self.device)

    @property
    def live_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.device) - self._base_bytes

    @property
    def peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device) - self._base_bytes

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


def memory_tracker(device: torch.device) -> StorageTracker | AllocatorTracker:
    """Live and peak bytes allocated inside a region, measured as well as the device allows."""
    return AllocatorTracker(device) if device.type == "cuda" else StorageTracker()
