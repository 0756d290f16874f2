"""Counts the Python processes the test suite starts, and their CPU (scripts/proc_census.py).

Put this folder first on PYTHONPATH and set PROC_CENSUS to a file: every Python process that
inherits both (ckplan run as its own process, torchrun and its ranks, multiprocessing's spawned
and forkserver children, profile's copies) appends one JSON line as it starts and one as it ends
(its own user + system CPU seconds), and each fork of such a process one line as it ends through
os._exit. A process killed by a signal leaves only its start line. The test that started it is
pytest's PYTEST_CURRENT_TEST, inherited through the environment (a fork server started by an
earlier test carries that test's name). Measurement only: nothing in planner/ or tests/ imports it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

_PATH = os.environ.get("PROC_CENSUS")


def _write(kind: str) -> None:
    times = os.times()
    record = {
        "kind": kind,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": list(getattr(sys, "argv", []))[:6],
        "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
        "cpu": round(times.user + times.system, 3),
        "t": round(time.time(), 3),
    }
    line = (json.dumps(record) + "\n").encode()
    try:
        fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:
        pass


if _PATH:
    _write("start")
    atexit.register(_write, "end")
    _real_exit = os._exit

    def _exit_recorded(code: int) -> None:
        _write("fork_end" if _forked[0] else "end")
        _real_exit(code)

    _forked = [False]

    def _after_fork() -> None:
        _forked[0] = True
        # os.times() of a fork restarts at zero; the fork's own line is its CPU.
        atexit.unregister(_write)

    os.register_at_fork(after_in_child=_after_fork)
    os._exit = _exit_recorded
