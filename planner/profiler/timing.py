"""Forward and backward wall time of one piece of the model, repeated after warm-up."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TimeStats:
    median_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> TimeStats:
        return cls(statistics.median(samples_ms), min(samples_ms), max(samples_ms))


class Stopwatch:
    """Marks on the device's own clock: CUDA events on a GPU (kernels run
    asynchronously, so the host clock would time the launch), else perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def laps_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (waits for the device to finish)."""
        if self.cuda:
            self._marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in itertools.pairwise(self._marks)]
        return [(b - a) * 1000.0 for a, b in itertools.pairwise(self._marks)]


def time_fwd_bwd(
    forward: Callable[[], torch.Tensor],
    backward: Callable[[torch.Tensor], None],
    *,
    device: torch.device,
    warmup: int,
    repeats: int,
    before_step: Callable[[], None] = lambda: None,
) -> tuple[TimeStats, TimeStats]:
    """Time `output = forward()` and `backward(output)` separately, `repeats` times
    after `warmup` untimed steps. `before_step` resets state between steps (e.g. the
    input's grad, so each step allocates it as a pipeline does)."""
    job = FwdBwdJob([forward], backward, device=device, before_step=before_step)
    time_interleaved([job], warmup=warmup, repeats=repeats)
    return job.stats()[0]


@dataclass
class FwdBwdJob:
    """Variants of one forward + backward step, timed in turns with other jobs."""

    forwards: Sequence[Callable[[], torch.Tensor]]
    backward: Callable[[torch.Tensor], None]
    device: torch.device
    before_step: Callable[[], None] = lambda: None
    around: Callable[[], AbstractContextManager] = nullcontext  # e.g. who to blame for an error
    fwd_ms: list[list[float]] = field(default_factory=list)
    bwd_ms: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.fwd_ms = [[] for _ in self.forwards]
        self.bwd_ms = [[] for _ in self.forwards]

    def run_once(self, *, keep: bool) -> None:
        with self.around():
            for index, forward in enumerate(self.forwards):
                self.before_step()
                watch = Stopwatch(self.device)
                watch.mark()
                output = forward()
                watch.mark()
                self.backward(output)
                watch.mark()
                del output  # free this step's graph before the next one starts
                fwd, bwd = watch.laps_ms()
                if keep:
                    self.fwd_ms[index].append(fwd)
                    self.bwd_ms[index].append(bwd)

    def stats(self) -> list[tuple[TimeStats, TimeStats]]:
        return [(TimeStats.of(f), TimeStats.of(b)) for f, b in zip(self.fwd_ms, self.bwd_ms)]


def time_interleaved(jobs: Sequence[FwdBwdJob], *, warmup: int, repeats: int,
                     on_round: Callable[[int, int], None] = lambda step, steps: None) -> None:
    """Every repeat runs every job once, in turn: a spell of load on a shared machine then
    lands on one repeat of many layers, which the median drops, instead of on all the
    repeats of one layer, which it cannot. on_round(step, steps) after each round."""
    for step in range(warmup + repeats):
        for job in jobs:
            job.run_once(keep=step >= warmup)
        on_round(step + 1, warmup + repeats)


def time_call(call: Callable[[], object], *, device: torch.device, warmup: int, repeats: int) -> TimeStats:
    """Time `call()` alone, `repeats` times after `warmup` untimed calls."""
    samples = []
    for step in range(warmup + repeats):
        watch = Stopwatch(device)
        watch.mark()
        call()
        watch.mark()
        if step >= warmup:
            samples.append(watch.laps_ms()[0])
    return TimeStats.of(samples)
