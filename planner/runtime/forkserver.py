"""Rank processes forked from a server that imported the worker once.

A rank started as a new Python spends 4-6 CPU seconds importing torch and ckplan's runtime
before it does anything (measured on the 2-core CI machine; a run starts one per stage and
data-parallel rank, the test suite hundreds). `RankServer` starts one Python that imports
planner.runtime.worker and then only forks: no torch op runs in it (no intra-op thread pool,
no CUDA context, nothing a fork could copy half-made) and no thread of ckplan's. The one other
thread the imports leave, the OpenBLAS pool numpy's import starts, OpenBLAS ends itself before
a fork (measured with torch 2.13.0+cpu: 2 threads after the imports, 1 in a fork and in the
server after it; a fork's numpy and torch matmuls work). Each fork becomes what a spawned
rank is before it runs the worker: its own session (the launcher kills its process group),
the launcher's environment and folder at the moment of the request, its output in the rank's
log, stdin on /dev/null, `python -c BOOTSTRAP JOB`'s sys.argv.

Lifetimes: the server dies with whoever started it (PR_SET_PDEATHSIG, and its stdin closing),
and each rank with the server (PR_SET_PDEATHSIG, and a thread watching its parent's pid, as a
spawned rank's CHILD_GUARD does), so no process outlives ckplan however ckplan ends.

Protocol (lines): the launcher writes one JSON request per rank on the server's stdin; the
server answers `pid N` for each, in order, and `exit N CODE` (a Popen returncode: negative
for a signal) when a rank it forked ends.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from planner.errors import UserError
from planner.runtime.children import (
    child_env,
    die_with_parent,
    exit_forked,
    guarded,
    redirect_stdio,
)

PRELOAD = "planner.runtime.worker"  # what every rank imports first: torch, torch.distributed, ckplan's runtime
SERVER_BOOTSTRAP = guarded("from planner.runtime.forkserver import serve\nserve()\n", watch=False)


class ForkedRank:
    """A rank the server forked, watched as a subprocess.Popen is: pid, poll(), wait(), kill()."""

    def __init__(self, server: RankServer, pid: int):
        self._server, self.pid = server, pid

    @property
    def returncode(self) -> int | None:
        return self._server._exits.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server._read(timeout_s=0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
            self._server._read(timeout_s=left)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class RankServer:
    """One fork server: `start` ranks through it as many times as wanted (one launch, or every
    round of compare), `close` it after. Linux only (`available()`)."""

    def __init__(self, *, env: dict[str, str] | None = None, start_timeout_s: float = 120.0):
        """env: what the server imports torch under (default: this process's), best the ranks'
        own: a fork keeps what an import read from it (TORCH_LOGS, say); each rank then runs
        under the environment its request gives."""
        self._start_timeout_s = start_timeout_s
        self._errors = tempfile.TemporaryFile()  # the server's own stderr: read if it dies
        env = child_env(dict(os.environ if env is None else env))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                          os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen([sys.executable, "-c", SERVER_BOOTSTRAP], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._errors,
                                      start_new_session=True)  # Ctrl-C reaches ckplan alone, as with spawned ranks
        self._buffer = b""
        self._forked: set[int] = set()
        self._pids: list[int] = []  # answers to requests not yet taken
        self._exits: dict[int, int] = {}  # pid: its returncode, once the server reported it

    @staticmethod
    def available() -> bool:
        return sys.platform.startswith("linux") and hasattr(os, "fork")

    def start(self, job_path: str | Path, *, env: dict[str, str], log_path: str | Path) -> ForkedRank:
        """Fork a rank running `python -c RANK_BOOTSTRAP job_path` with `env`, in this process's
        folder, its output into log_path (created here first, as a spawned rank's is)."""
        Path(log_path).touch()
        request = {"job": str(job_path), "env": env, "cwd": os.getcwd(), "log": str(log_path)}
        try:
            self._proc.stdin.write(json.dumps(request).encode() + b"\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise UserError(self._died()) from None
        deadline = time.monotonic() + self._start_timeout_s
        while not self._pids:
            left = deadline - time.monotonic()
            if left <= 0:
                raise UserError(f"the rank fork server did not start a rank within {self._start_timeout_s:.0f} s "
                                "(importing torch and ckplan's runtime); raise --start-timeout")
            if not self._read(timeout_s=left):
                raise UserError(self._died())
        return ForkedRank(self, self._pids.pop(0))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def running(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        """End the server; a rank it forked still running dies with it."""
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._errors.close()
        self._ended()

    def __enter__(self) -> RankServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, timeout_s: float | None) -> bool:
        """Take the server's answers that came within timeout_s; False once it has ended (each
        rank it had not reported then ends with it: SIGKILL)."""
        out = self._proc.stdout
        if out.closed:
            return False
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            return True
        data = os.read(out.fileno(), 65536)
        if not data:
            out.close()
            self._ended()
            return False
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, *values = line.decode().split()
            if kind == "pid":
                self._pids.append(int(values[0]))
                self._forked.add(int(values[0]))
            elif kind == "exit":
                self._exits[int(values[0])] = int(values[1])
        return True

    def _ended(self) -> None:
        """The server has ended: each rank it had not reported ended with it (PR_SET_PDEATHSIG)."""
        for pid in self._forked - self._exits.keys():
            self._exits[pid] = -signal.SIGKILL

    def _died(self) -> str:
        self._proc.wait()
        self._errors.seek(0)
        lines = [line for line in self._errors.read().decode(errors="replace").splitlines() if line.strip()]
        last = f": {lines[-1].strip()[:300]}" if lines else ""
        return f"the rank fork server exited with code {self._proc.returncode} before starting a rank{last}"


# ---------------------------------------------------------------- the server's side


def serve() -> None:
    """(the server, SERVER_BOOTSTRAP) Import the worker, then fork a rank per request until
    stdin closes; report each rank's pid and, when it ends, its exit status."""
    import importlib

    importlib.import_module(PRELOAD)
    server_pid = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    buffer = b""
    while True:
        try:
            ready, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            ready = []
        if wake_r in ready:
            os.read(wake_r, 4096)
        _report_ended()
        if 0 in ready:
            data = os.read(0, 65536)
            if not data:  # whoever started us is done (or dead): the ranks left die with us
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_rank(json.loads(line), server_pid=server_pid)  # never returns
                _say(f"pid {pid}")


def _report_ended() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")


def _say(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def _become_rank(request: dict, *, server_pid: int) -> NoReturn:
    """(a fork of the server) What a spawned rank is, then the worker; exits, never returns."""
    exit_forked(lambda: _rank(request, server_pid=server_pid))


def _rank(request: dict, *, server_pid: int) -> int:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()  # its own process group: what it starts ends with it (launcher._end)
    die_with_parent(server_pid, watch=True)
    os.environ.clear()
    os.environ.update(request["env"])  # CKPLAN_PARENT_PID: the launcher's, as a spawned rank's
    tempfile.tempdir = None  # the imports found the server's temporary folder: find the rank's (TMPDIR)
    os.chdir(request["cwd"])
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    redirect_stdio(log, log)
    os.close(log)
    sys.argv = ["-c", request["job"]]  # sys.path[0] is "" as in any `python -c`: this folder
    from planner.runtime.worker import main

    main()  # ends the process itself (os._exit)
    return 1
