"""Python's cyclic garbage collector paused over work that makes many small objects whose garbage can wait for
its end: a stage's allocator replay (its events and its blocks).

CPython starts a collection every 700 container objects made net (gc.get_threshold()'s first figure, the CPython
default), and every tenth of those an older generation's, which walks every object the process holds: a solve holds
its profile's records, so a replay's few hundred thousand tuples cost several times their own making in collections
that find little. Measured on Mistral-Small-24B's plan of 8 stages (docs/published-runs.md §43.solvespeed): evaluate()
0.46-0.65 s of CPU with the collector running, 0.30 s paused. Nothing computed depends on when a collection runs; the
collector's state before is restored after, so a caller that paused it keeps it paused. Nothing here reads a file or
prints."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector paused inside the block, as it was after."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()
