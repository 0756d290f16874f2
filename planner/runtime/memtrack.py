"""Peak memory of one device over a region of code, measured the same way by the
profiler and the runtime.

cuda: the caching allocator's statistics (`max_memory_allocated`), i.e. live tensor
bytes as the allocator rounds them, and the segments it reserved (`max_memory_reserved`). cpu: `torch.distributed._tools.mem_tracker.MemTracker`,
which follows every tensor storage created inside the region (a TorchDispatchMode)
plus the parameters, gradients and optimizer states of the objects passed as
`external`, and records the peak of their sum at every allocation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class PeakMemory:
    """`with PeakMemory(device, external=[model, optimizer]) as mem: ...; mem.peak_bytes`"""

    def __init__(self, device: torch.device | str, *, external: Iterable[object] = (), module_hooks: bool = True):
        self.device = torch.device(device)
        self.module_hooks = module_hooks  # cpu: False follows tensors only (see _NoModules)
        self.external = [obj for obj in external if obj is not None]
        self.peak_bytes = 0
        self.reserved_bytes: int | None = None  # cuda: the caching allocator's reserved peak
        self._tracker = None
        self._base_bytes = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            self._tracker = MemTracker()
            if not self.module_hooks or _holds_frozen(self.external):
                self._tracker._mod_tracker = _NoModules()
            if self.external:
                self._tracker.track_external(*self.external)
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            self.reserved_bytes = int(torch.cuda.max_memory_reserved(self.device))
            return
        self._tracker.__exit__(*exc_info)
        snapshot = self._tracker.get_tracker_snapshot("peak")
        self.peak_bytes = int(sum(stats["Total"] for dev, stats in snapshot.items() if dev.type == "cpu"))


def _holds_frozen(external: Iterable[object]) -> bool:
    """Whether a tracked module holds a parameter with requires_grad False (a fine-tuning model's frozen
    backbone): torch 2.13's MemTracker, at each module's forward, registers a gradient hook on every parameter
    of it (mem_tracker.py _track_module_params_and_buffers, §711), which torch refuses on a tensor that does
    not require a gradient; such a stage is followed by its tensors only (_NoModules), the same peak."""
    return any(isinstance(obj, torch.nn.Module) and any(not param.requires_grad for param in obj.parameters())
               for obj in external)


class _NoModules:
    """MemTracker's module tracker, doing nothing: its per-module statistics hook every module's
    inputs with multi-grad hooks, which torch's split backward (`autograd.grad` for a zero-bubble
    schedule's input gradient) refuses on a leaf input. The peak is the tracked tensors' total
    either way; only its breakdown by module and phase is lost."""

    is_bw = False
    parents: set[str] = set()

    def register_user_hooks(self, *hooks) -> None:
        pass

    def clear_user_hooks(self) -> None:
        pass

    def get_known_fqn(self, module) -> str | None:
        return None

    def __enter__(self) -> _NoModules:
        return self

    def __exit__(self, *exc_info) -> None:
        pass
