"""How a rank tells the launcher that it is alive and what it is doing, and how the
launcher tells a stage that stopped making progress from one that waits for it.

A rank keeps a `Heartbeat`: the main thread names its current phase (cheap: two
attributes), and a daemon thread rewrites `rank<r>.beat` every BEAT_S seconds with the
time, the phase, when the phase began and whether the rank is working in it (building,
a forward, a backward, the loss, the optimizer step) or waiting for a neighbour (in
the process group's rendezvous, a receive, a barrier). The launcher reads the files
(`read_beat`) and `find_stall` names the stage that stopped:

- a beat older than the progress timeout: the whole process stopped running (SIGSTOP,
  or native code that holds the GIL);
- a working phase older than the progress timeout: stuck in its own compute;
- still starting after the start timeout: hung before training (importing the model
  file, build_model, joining the group);
- every stage waiting longer than the progress timeout: the one that began first.

A waiting rank is never blamed while another rank works or starts: it is waiting for it.
That holds inside a phase too: a rank inside a collective (the experts' all-to-all in the
middle of its MoE forward) says so (`collective`), so the partner it waits for, still in its
own compute, is the one named, and the one whose log is kept.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BEAT_S = 0.5
WAITING = "a wait for a neighbour"  # the phase of a training rank outside its own work


@dataclass(frozen=True)
class Beat:
    """What a rank last said about itself."""

    time: float  # when the beat thread last ran (time.time())
    phase: str  # e.g. "build_model() of model.py", "a forward", WAITING
    since: float  # when the phase began
    working: bool  # in its own compute (not waiting for another rank)
    started: bool  # past start-up: training
    steps: tuple[int, int] = (0, 0)  # training steps done, of all it will run (warm-up, timed, memory)


class Heartbeat:
    """`with Heartbeat(path) as beat: ... with beat.phase("a forward", working=True): ...`"""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self._phase = ("starting", time.time(), True)
        self._started = False
        self._steps = (0, 0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._writing = threading.Lock()  # the thread and start-up phases both write

    def __enter__(self) -> Heartbeat:
        if self.path is not None:
            self._write()
            self._thread = threading.Thread(target=self._run, name="ckplan-heartbeat", daemon=True)
            self._thread.start()
        _RANK.append(self)
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self in _RANK:
            _RANK.remove(self)

    def set(self, phase: str, *, working: bool) -> None:
        self._phase = (phase, time.time(), working)
        if not self._started and self.path is not None:
            self._write()  # start-up phases are few: say each at once

    def training(self) -> None:
        """Start-up is over (said at once; from here on the thread writes every BEAT_S)."""
        self._started = True
        self.set(WAITING, working=False)
        if self.path is not None:
            self._write()

    def stepped(self, done: int, total: int) -> None:
        """`done` training steps of `total` are over (said at once: one write a step, and a
        short run may end before the next beat)."""
        self._steps = (done, total)
        if self.path is not None:
            self._write()

    @contextmanager
    def phase(self, phase: str, *, working: bool) -> Iterator[None]:
        """Name what the rank does inside the block; afterwards it waits for a neighbour
        (training) or goes on starting."""
        before = self._phase
        self.set(phase, working=working)
        try:
            yield
        finally:
            if self._started:
                self.set(WAITING, working=False)
            else:
                self.set(before[0], working=before[2])

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Inside a phase, a wait for other ranks (a collective): the rank is not working while
        it lasts; afterwards the enclosing phase goes on, its clock restarted (the collective
        finishing is progress)."""
        before = self._phase
        self.set(what, working=False)
        try:
            yield
        finally:
            self.set(before[0], working=before[2])

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            self._write()

    def _write(self) -> None:
        phase, since, working = self._phase
        record = {"time": time.time(), "phase": phase, "since": since, "working": working, "started": self._started,
                  "steps": self._steps}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with self._writing:
            try:
                tmp.write_text(json.dumps(record))
                os.replace(tmp, self.path)
            except OSError:
                pass  # the launcher's folder is gone: it is shutting down


NO_HEARTBEAT = Heartbeat(None)
# The heartbeat of this process's rank (one per rank process, set while its `with Heartbeat`
# lasts): the collectives deep inside a model's forward (planner/runtime/experts.py) say they
# wait through it without a heartbeat threaded through every module.
_RANK: list[Heartbeat] = []


@contextmanager
def collective(what: str) -> Iterator[None]:
    """Mark the rank as waiting for the other ranks in `what` (a collective) while it lasts."""
    if not _RANK:
        yield
        return
    with _RANK[-1].waiting(what):
        yield


def read_beat(path: Path) -> Beat | None:
    """The rank's last beat; None before its first (or if the file is being replaced)."""
    try:
        record = json.loads(path.read_text())
        return Beat(**{**record, "steps": tuple(record.get("steps", (0, 0)))})
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def find_stall(beats: Mapping[int, Beat | None], *, now: float, launched: float, start_timeout_s: float,
               progress_timeout_s: float, dp: int = 1) -> tuple[int, str] | None:
    """(a stage that stopped making progress, one sentence naming it), or None while the
    job moves. `beats`: the ranks still running (rank -> last beat, None before the first)."""
    for rank, beat in sorted(beats.items()):
        if beat is not None and now - beat.time > progress_timeout_s:
            return rank, (f"{stage_name(rank, dp)} stopped making progress: its process has not run for "
                          f"{now - beat.time:.0f} s (frozen or stopped, e.g. SIGSTOP), last in {beat.phase}")
    stuck = {rank: beat for rank, beat in beats.items()
             if beat is not None and beat.started and beat.working and now - beat.since > progress_timeout_s}
    if stuck:  # the first to stop: the others may be stuck in a collective waiting for it
        rank = min(stuck, key=lambda r: (stuck[r].since, r))
        beat = stuck[rank]
        return rank, (f"{stage_name(rank, dp)} stopped making progress: {now - beat.since:.0f} s in {beat.phase} "
                      f"without finishing (limit {progress_timeout_s:g} s, --progress-timeout)")
    if now - launched > start_timeout_s:
        stall = _start_stall(beats, start_timeout_s, dp)
        if stall:
            return stall
    waiting = {rank: beat for rank, beat in beats.items() if beat is not None and beat.started and not beat.working}
    if beats and len(waiting) == len(beats) and all(now - beat.since > progress_timeout_s for beat in waiting.values()):
        rank = min(waiting, key=lambda r: (waiting[r].since, r))
        return rank, (f"{stage_name(rank, dp)} stopped making progress: no stage has for {progress_timeout_s:g} s, "
                      f"and {stage_name(rank, dp)} stopped first, {now - waiting[rank].since:.0f} s ago ({waiting[rank].phase})")
    return None


def _start_stall(beats: Mapping[int, Beat | None], start_timeout_s: float, dp: int) -> tuple[int, str] | None:
    """Past the start timeout: the stages still starting, those working (e.g. in
    build_model) named before those that wait for them."""
    starting = {rank: beat for rank, beat in beats.items() if beat is None or not beat.started}
    if not starting:
        return None
    working = {rank: beat for rank, beat in starting.items() if beat is None or beat.working}
    stuck = working or starting
    by_phase: dict[str, list[int]] = {}
    for rank, beat in sorted(stuck.items()):
        by_phase.setdefault(beat.phase if beat else "importing torch and ckplan", []).append(rank)
    if len(by_phase) == 1:
        where = f"hung in {next(iter(by_phase))}"
    else:
        where = "; ".join(f"{_stages(ranks, dp)} in {phase}" for phase, ranks in by_phase.items())
    ranks = sorted(stuck)
    return ranks[0], f"{_stages(ranks, dp)} did not start within {start_timeout_s:g} s (--start-timeout): {where}"


def stage_name(rank: int, dp: int = 1) -> str:
    """'stage 2'; with data parallelism (rank = stage · dp + replica) 'stage 2 (rank 5)'."""
    return f"stage {rank}" if dp == 1 else f"stage {rank // dp} (rank {rank})"


def _stages(ranks: list[int], dp: int) -> str:
    if len(ranks) == 1:
        return stage_name(ranks[0], dp)
    if dp == 1:
        return "stages " + ", ".join(str(rank) for rank in ranks)
    return ", ".join(stage_name(rank, dp) for rank in ranks)


def working_rank(beats: Mapping[int, Beat | None], *, now: float) -> tuple[int, str] | None:
    """When the other ranks timed out waiting: a rank still busy in its own work (or
    frozen), the one they waited for, with what it was doing."""
    for rank, beat in sorted(beats.items()):
        if beat is not None and (beat.working or now - beat.time > 2 * BEAT_S + 1):
            return rank, f"{beat.phase} for {now - beat.since:.0f} s"
    return None
