"""No process outlives ckplan: `profile` (its copies of the model on the other cores),
`launch`, `compare` and `calibrate` (their ranks, calibrate's send benchmark), each killed by
SIGTERM and by SIGKILL at each of its phases, leave nothing running.

Every process ckplan starts inherits a marker in its environment, so the processes it left
are found in /proc after it died (an orphan is re-parented away from it, and no longer its
descendant): none may be alive a few seconds later."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import ROOT
from fixtures.cli import run_ok

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

FIXTURES = ROOT / "tests" / "fixtures"
MARK = "CKPLAN_ORPHAN_TEST"
GRACE_S = 10.0  # how long a child may take to notice its parent died (it is told at once: SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class Seen:
    """What marked() read of each process's environment, kept between the scans of one kill_at: a
    scan reads /proc/PID/environ of the processes it has not seen (a few) and the state of the
    marked ones, not the environment of every process on the machine (2.0-2.9 ms of CPU a scan at
    100-160 processes here, 0.25 with this; 20 scans a second while a test waits). A process's
    environment is fixed at its exec, and every process ckplan starts is marked from its fork on.
    A pid gone from /proc is forgotten, and all are after a pause between scans, so a pid reused by
    another process is read again (reused only after pid_max, 32,768 here, others)."""

    PAUSE_S = 1.0

    def __init__(self):
        self.marks: dict[int, bool] = {}
        self.last = time.monotonic()

    def fresh(self, pids: set[int]) -> dict[int, bool]:
        now = time.monotonic()
        if now - self.last > self.PAUSE_S:
            self.marks.clear()
        self.last = now
        self.marks = {pid: value for pid, value in self.marks.items() if pid in pids}
        return self.marks


def _carries(pid: int, mark: str) -> bool:
    """Whether the process's environment holds `mark`; False for a kernel thread (no environment:
    ESRCH) and a process not ours (EACCES), which are no process ckplan started."""
    try:
        return f"{MARK}={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.EACCES):
            return False
        raise


def marked(mark: str, seen: Seen | None = None) -> dict[int, str]:
    """Live processes (not zombies) carrying `mark` in their environment, with their command lines.
    `seen`: the environments read by the previous scans (kill_at's)."""
    found = {}
    pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    marks = seen.fresh(pids) if seen is not None else {}
    for pid in pids:
        try:
            if pid not in marks:
                marks[pid] = _carries(pid, mark)
            if not marks[pid]:
                continue
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found[pid] = _cmdline(pid)
    return found


def _after(seconds: float, children: str | None = None, ready: str | None = None) -> tuple:
    """A phase: `seconds` after the first child whose command line holds `children` appeared
    (after ckplan started where `children` is None; "a|b": either), and once a file matching `ready` exists in
    ckplan's temporary folder."""
    return seconds, children, ready


def _reached(phase: tuple, tmp: Path):
    seconds, children, ready = phase
    first: list[float] = []

    def reached(elapsed: float, kids: dict[int, str]) -> bool:
        if ready is not None and not list(tmp.glob(ready)):
            return False
        if children is None:
            return elapsed >= seconds
        if not first and any(child in line for line in kids.values() for child in children.split("|")):
            first.append(elapsed)
        return bool(first) and elapsed - first[0] >= seconds

    return reached


def kill_at(args: list[str], *, phase, sig: int, cwd: Path, env: dict | None = None, limit_s: float = 300.0):
    """Start `ckplan ARGS`, kill it by `sig` when it reaches `phase` (_after), and return the
    processes it started that are still alive GRACE_S later (they are killed after). `limit_s`
    guards a ckplan that never gets there, not its speed: on a loaded machine (load 22 on 2
    cores) calibrate took over 120 s to start its send benchmark."""
    mark = uuid.uuid4().hex
    tmp = cwd / f"tmp-{mark}"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", *args], cwd=cwd,
                            env={**os.environ, **(env or {}), MARK: mark, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    start = time.monotonic()
    reached, seen = _reached(phase, tmp), Seen()
    try:
        while True:
            kids = {pid: line for pid, line in marked(mark, seen).items() if pid != proc.pid}
            if proc.poll() is not None:
                pytest.fail(f"ckplan {args[0]} ended before the phase: {proc.stderr.read().decode()[-2000:]}")
            if reached(time.monotonic() - start, kids):
                break
            if time.monotonic() - start > limit_s:
                pytest.fail(f"ckplan {args[0]} never reached the phase; children {kids}")
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + GRACE_S
        while (left := marked(mark, seen)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left
    finally:
        for pid in marked(mark, seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """rt_tiny.py profiled (measured) and solved into two stages: a plan launch, compare and
    calibrate run. A second or so in this process, so the tests that read it are not held on
    one xdist worker (an xdist_group): a worker that runs some of them makes its own."""
    tmp = tmp_path_factory.mktemp("orphans")
    model = tmp / "rt_tiny.py"
    model.write_text((FIXTURES / "rt_tiny.py").read_text())
    run_ok("profile", model, "--threads", "1", "--repeats", "1", "--warmup", "0", "--out", tmp / "p.json")
    run_ok("solve", "--profile", tmp / "p.json", "--mem", "1GB", "--stages", "2", "--microbatches", "2",
           "--out", tmp / "plan.yaml")
    return tmp


# a step of about a second at one thread: the copy is still running when it is killed
SLOW_MODEL = """
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024))


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size * 256, 1024), torch.randn(micro_batch_size * 256, 1024)
"""
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGKILL, id="SIGKILL")]
# a rank's command line: a spawned one's (launcher.RANK_BOOTSTRAP), or the fork server's that forked
# it (forkserver.SERVER_BOOTSTRAP: a fork keeps the command line of the process it was forked from)
RANK = "planner.runtime.worker|planner.runtime.forkserver"
# a rank has written its heartbeat (a forked rank does at once; the ranks' processes, or the fork
# server's, may be there seconds before, importing torch)
TRAINING = _after(2.0, RANK, ready="ckplan-run-*/rank1.beat")
SENDS = "planner.profiler.commbench|multiprocessing.spawn"  # calibrate's send benchmark (its ranks were spawned)


@pytest.mark.copies
@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("phase", [
    pytest.param(_after(0.5, None), id="importing"),
    pytest.param(_after(0.0, "run_copy"), id="copy-starting"),
    pytest.param(_after(0.0, "run_copy", ready="ckplan-copies-*/ready0"), id="copy-running"),
])
def test_profile_leaves_no_copy_of_the_model_running(tmp_path, sig, phase):
    """The copy waited for a stop file and never checked its parent: it ran at 100% forever.
    --threads 1: profile times the whole model at 1 thread only before it starts the copies (at
    every core's count as well otherwise: 6 more steps of a second here, and nothing of the copies)."""
    (tmp_path / "m.py").write_text(SLOW_MODEL)
    left = kill_at(["profile", "m.py", "--repeats", "1", "--warmup", "0", "--threads", "1", "--out", "p.json"],
                   phase=phase, sig=sig, cwd=tmp_path)
    assert left == {}


HANG = {"RT_FAULT": "hang"}  # the ranks stay in their forward until killed: every phase is reachable


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("phase", [
    pytest.param(_after(0.5, None), id="checking"),
    pytest.param(_after(0.0, RANK), id="ranks-starting"),
    pytest.param(TRAINING, id="ranks-training"),
])
def test_launch_leaves_no_rank_running(plan, sig, phase):
    left = kill_at(["launch", "plan.yaml", "--steps", "2", "--warmup-steps", "0"], phase=phase, sig=sig, cwd=plan,
                   env=HANG)
    assert left == {}


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("phase", [
    pytest.param(_after(0.5, None), id="checking"),
    pytest.param(_after(0.0, RANK), id="ranks-starting"),
    pytest.param(TRAINING, id="ranks-training"),
])
def test_compare_leaves_no_rank_running(plan, sig, phase):
    left = kill_at(["compare", "plan.yaml", "--steps", "1", "--warmup-steps", "0", "--rounds", "2", "--out",
                    "c.json"], phase=phase, sig=sig, cwd=plan, env=HANG)
    assert left == {}


@pytest.mark.parametrize("sig", SIGNALS)
@pytest.mark.parametrize("phase", [
    pytest.param(_after(0.5, None), id="checking"),
    pytest.param(_after(0.0, SENDS), id="sends-starting"),
    pytest.param(_after(3.0, SENDS), id="sends-timed"),
])
def test_calibrate_leaves_no_process_running(plan, sig, phase):
    """calibrate's own processes: its send benchmark's two ranks (commbench.measure_sends). They
    have ended before its pipeline run starts, and that run is launch's run_plan with a fork
    server of its own: calibrate killed while its ranks train is launch killed while its ranks
    train (test_launch_leaves_no_rank_running[ranks-training-*])."""
    left = kill_at(["calibrate", "plan.yaml", "--steps", "1", "--warmup-steps", "0", "--out", "cal.json"],
                   phase=phase, sig=sig, cwd=plan, env=HANG)
    assert left == {}


def test_what_a_rank_started_ends_with_the_run(monkeypatch):
    """Each rank leads its own process group, killed whole when the run ends: a process the
    model file started in a rank does not outlive the failed run."""
    from fixtures.rt_plans import make_plan

    from planner.errors import UserError
    from planner.runtime import run_plan
    from planner.runtime.forkserver import RankServer

    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    plan = make_plan(FIXTURES / "spawns_child.py", [["0", "1"], ["2", "3", "4"]])
    with pytest.raises(UserError, match="rank 1 was told to fail"), RankServer() as server:  # a server of its own,
        run_plan(plan, steps=1, warmup_steps=0, rank_server=server)  # as a run has (not the suite's shared one)
    deadline = time.monotonic() + GRACE_S
    while (left := {pid: line for pid, line in marked(mark).items() if pid != os.getpid()}) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == {}


def test_a_scan_reads_each_process_once_and_still_finds_a_new_one():
    """kill_at's scans (Seen): a marked process started after a scan is found by the next, an
    unmarked one is not, and a process gone is forgotten (its pid read again if reused)."""
    mark, seen = uuid.uuid4().hex, Seen()
    assert marked(mark, seen) == {}
    first = len(seen.marks)
    ours = subprocess.Popen(["sleep", "60"], env={**os.environ, MARK: mark})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, MARK: "another"})
    try:
        assert list(marked(mark, seen)) == [ours.pid] and first > 0 and seen.marks[other.pid] is False
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
    assert marked(mark, seen) == {} and ours.pid not in seen.marks and other.pid not in seen.marks
