"""Processes ckplan starts: each dies with ckplan, however ckplan ends."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

# Every process ckplan starts ends when ckplan ends, however it ends (SIGTERM, SIGKILL, a
# crash): its first act, before importing anything slow, is to ask the kernel for SIGKILL when
# its parent dies (Linux PR_SET_PDEATHSIG), to leave at once if the parent is already gone, and
# to watch the parent's pid from a thread (where there is no prctl, and for a parent that dies
# between fork and prctl). CKPLAN_PARENT_PID carries the pid it must outlive no longer.
PARENT_PID_ENV = "CKPLAN_PARENT_PID"
PARENT_WATCH_S = 0.5
_PRCTL = f"""\
import ctypes, os, sys, threading, time
_parent = int(os.environ["{PARENT_PID_ENV}"])
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, 9)
if os.getppid() != _parent:
    os._exit(1)
"""
_WATCH = f"""\
def _watch_parent():
    while os.getppid() == _parent:
        time.sleep({PARENT_WATCH_S})
    os._exit(1)
threading.Thread(target=_watch_parent, name="ckplan-parent-watch", daemon=True).start()
"""
CHILD_GUARD = _PRCTL + _WATCH


def guarded(code: str, *, watch: bool = True) -> str:
    """`python -c` text that runs `code` in a process that dies with its parent (CHILD_GUARD);
    start it with PARENT_PID_ENV set to the starting process's pid (child_env). watch=False:
    no watching thread (a process that forks, such as the rank fork server, keeps no thread of
    its own; it relies on the kernel's signal and on its stdin closing)."""
    return (CHILD_GUARD if watch else _PRCTL) + code


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a guarded child of this process."""
    return {**env, PARENT_PID_ENV: str(os.getpid())}


def die_with_parent(parent_pid: int, *, watch: bool) -> None:
    """CHILD_GUARD in-process, for a fork of `parent_pid` (the rank fork server's ranks)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    if os.getppid() != parent_pid:
        os._exit(1)
    if watch:
        def watch_parent():
            while os.getppid() == parent_pid:
                time.sleep(PARENT_WATCH_S)
            os._exit(1)

        threading.Thread(target=watch_parent, name="ckplan-parent-watch", daemon=True).start()



def redirect_stdio(stdout: int, stderr: int) -> None:
    """stdin from /dev/null, stdout and stderr to these descriptors (a fork becoming a process
    of its own)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    os.close(null)


def exit_forked(body: Callable[[], int | None]) -> NoReturn:
    """In a fork: run `body`, then exit as a Python process ending so would (body's return value
    or SystemExit's code; an uncaught exception printed, 1), flushed, never returning into the
    forker's frames."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a Python process
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0)
