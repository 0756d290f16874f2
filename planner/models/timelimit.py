"""A time limit on the user's code (a model file's import, build_model(), ...), so a file
that loops forever ends in a sentence naming the line it was running, not a hang.

It is a SIGALRM timer, so it interrupts pure-Python loops, sleeps and blocking waits.
Its limits: it works only in the main thread of a POSIX process (elsewhere the code runs
unbounded); a single C call that never returns to the interpreter (a stuck native kernel)
is interrupted only when it returns; code that catches BaseException and carries on is
interrupted again every second until it lets go.
"""

from __future__ import annotations

import linecache
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from planner.errors import UserError

_REPEAT_S = 1.0  # re-fire while the user's code swallows the interruption


class _TimedOut(BaseException):
    """A BaseException, so the user's `except Exception:` cannot swallow it."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float | None, what: str, path: Path, option: str = "--timeout") -> Iterator[None]:
    """Run the body for at most `seconds` (None or 0: no limit); past it raise a UserError
    saying `what` did not finish and which line of `path` it was running."""
    if not seconds or not _can_alarm():
        yield
        return
    state = {"armed": True}

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        if state["armed"]:
            raise _TimedOut(_where(frame, path))

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, _REPEAT_S)
    try:
        yield
    except _TimedOut as exc:
        state["armed"] = False
        raise UserError(
            f"{what} did not finish within {seconds:g} s ({option}){exc.where}; it may loop forever or wait "
            f"for something that never comes: fix it, or raise {option} if it is only slow"
        ) from None
    finally:
        state["armed"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _where(frame: FrameType | None, path: Path) -> str:
    """' while running line N of FILE: CODE' for the innermost frame in the user's file."""
    wanted = str(path)
    while frame is not None and frame.f_code.co_filename != wanted:
        frame = frame.f_back
    if frame is None:
        return ""
    code = linecache.getline(wanted, frame.f_lineno).strip()
    return f" while running line {frame.f_lineno} of {path.name}: `{code}`"
