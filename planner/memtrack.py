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

    def __init__(self, device: torch.device | str, *, external: Iterable[object] = ()):
        self.device = torch.device(device)
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
