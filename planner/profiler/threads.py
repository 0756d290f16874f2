"""How the whole model's forward + backward scales with torch's CPU threads.

A profile times each layer with the threads `profile` ran with (torch's default: every
core). A launch on the same machine gives each rank the cores shared among the ranks,
usually fewer threads, and small matmuls do not slow down in proportion. So profile
also times the whole chain (every layer, the loss, the backward) at 1, 2, 4, ... up to
its own threads, in turns (one repeat of each count per round, so a spell of load lands
on one repeat of every count, which the minimum drops), and the cost model scales the
profiled times by the ratio at the threads a launch gives (calibrate.thread_scale).

Ranks that fill the cores also slow each other down (shared caches and memory bandwidth),
which one process timed alone never sees. So profile times the chain once more at 1
thread while other processes run the same chain alongside, one per core (up to
MAX_COPIES): calibrate.sharing_scale charges the ratio to launches whose ranks compute at
once.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from planner.profiler.timing import Stopwatch
from planner.runtime.children import child_env, guarded  # noqa: F401  profile starts its copies through them


def thread_counts(threads: int) -> list[int]:
    """1, 2, 4, ... below `threads`, and `threads` itself."""
    counts, count = [], 1
    while count < threads:
        counts.append(count)
        count *= 2
    return [*counts, threads]


def at_fewer_threads(timed: Callable[[], dict[str, float]]) -> dict[int, dict[str, float]]:
    """`timed()` at each count thread_counts gives below torch's present threads (1, 2, 4, ...), torch's threads
    restored after: a layer's optimizer step as a launch's ranks run it with fewer threads than the profile
    (placement.placement_threads), which the cost model reads at the launch's count (LayerCost.step_at). On a
    loaded 2-core host Adam on a 512 x 64 table took 19.7-63.7 ms at 2 threads and 0.1 ms at 1 (§42.runtrial)."""
    before = torch.get_num_threads()
    timings = {}
    try:
        for count in thread_counts(before)[:-1]:
            torch.set_num_threads(count)
            timings[count] = timed()
    finally:
        torch.set_num_threads(before)
    return timings


def whole_step(layers, inputs: torch.Tensor, targets: torch.Tensor, loss_fn) -> Callable[[], None]:
    """One forward + backward of the whole chain on the batch, as one process trains it;
    parameter gradients accumulate (the timed work is the same either way)."""

    def step() -> None:
        x = inputs
        for _, layer in layers:
            x = layer(x)
        loss = loss_fn(x, targets)
        if loss.requires_grad:
            loss.backward()

    return step


MAX_COPIES = 4  # processes timed side by side: the cores a launch fills, bounded (each holds a model)
COPY_START_S = 300.0  # a copy loads and checks the model file as profile did


def thread_ms(step: Callable[[], None], counts: list[int], *, warmup: int, repeats: int) -> dict[int, float]:
    """The least ms of `step()` at each torch thread count (what the machine does unhindered:
    load only ever adds, and it adds more to the counts that use more cores)."""
    return {count: min(values) for count, values in thread_samples(step, counts, warmup=warmup,
                                                                   repeats=repeats).items()}


def thread_samples(step: Callable[[], None], counts: list[int], *, warmup: int,
                   repeats: int) -> dict[int, list[float]]:
    """The ms of `step()` at each torch thread count, `repeats` of each taken in turns after
    `warmup` rounds; torch's threads are restored after."""
    before = torch.get_num_threads()
    samples: dict[int, list[float]] = {count: [] for count in counts}
    try:
        for round_ in range(warmup + repeats):
            for count in counts:
                torch.set_num_threads(count)
                watch = Stopwatch(torch.device("cpu"))
                watch.mark()
                step()
                watch.mark()
                if round_ >= warmup:
                    samples[count].append(watch.laps_ms()[0])
    finally:
        torch.set_num_threads(before)
    return samples


def alongside_ms(step: Callable[[], None], *, copies: int, start_copy: Callable[[Path, Path], subprocess.Popen],
                 warmup: int, repeats: int) -> float | None:
    """The median ms of `step()` at 1 torch thread while `copies - 1` other processes run the
    same step alongside; None when one did not start within COPY_START_S, or died.
    `start_copy(ready, stop)` starts one: it creates `ready` once it runs the step in a loop,
    and exits once `stop` exists."""
    with tempfile.TemporaryDirectory(prefix="ckplan-copies-") as tmp:
        stop = Path(tmp) / "stop"
        readies = [Path(tmp) / f"ready{index}" for index in range(copies - 1)]
        procs = [start_copy(ready, stop) for ready in readies]
        try:
            deadline = time.monotonic() + COPY_START_S
            while not all(ready.exists() for ready in readies):
                if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
            samples = thread_samples(step, [1], warmup=warmup, repeats=repeats)[1]
        finally:
            stop.touch()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return statistics.median(samples)
