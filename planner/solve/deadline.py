"""One time limit for a whole solve: baselines, bounds, the search itself.

The solver checks `expired()` between units of work and stops there; the clock is
injectable so a test can move time forward instead of waiting for it.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


class Expired(Exception):
    """The time limit passed; whoever set the deadline keeps the best plan found so far.
    `found`: what the search had found by then, where it has something to offer."""

    found = None


@dataclass(frozen=True)
class Deadline:
    limit_s: float | None  # None: no limit
    clock: Callable[[], float] = time.perf_counter
    started: float = field(default=math.nan)

    def __post_init__(self):
        if math.isnan(self.started):
            object.__setattr__(self, "started", self.clock())

    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def remaining_s(self) -> float | None:
        return None if self.limit_s is None else max(0.0, self.limit_s - self.elapsed_s())

    def expired(self) -> bool:
        return self.limit_s is not None and self.elapsed_s() >= self.limit_s

    def check(self) -> None:
        """Raise Expired once the limit has passed."""
        if self.expired():
            raise Expired


@contextmanager
def interrupted_at(deadline: Deadline | None) -> Iterator[None]:
    """Run work that does not look at the deadline itself (torch's schedule constructors) until
    the deadline at most: a SIGALRM then raises Expired inside it. Only in the main thread of a
    POSIX process with a real clock; elsewhere the body runs to its end."""
    remaining = None if deadline is None else deadline.remaining_s()
    if remaining is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    if remaining <= 0:
        raise Expired

    def on_alarm(signum, frame):
        raise Expired

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, remaining)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
