"""How the whole model's forward + backward scales with torch's CPU threads.

A profile times each layer with the threads `profile` ran with (torch's default: every
core). A launch on the same machine gives each rank the cores shared among the ranks,
usually fewer threads, and small matmuls do not slow down in proportion. So profile
also times the whole chain (every layer, the loss, the backward) at 1, 2, 4, ... up to
its own threads, in turns (one repeat of each count per round, so a spell of load lands
on one repeat of every count, which the minimum drops), and the cost model scales the
profiled times by the ratio at the threads a launch gives (calibrate.thread_scale).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from planner.profiler.timing import Stopwatch


def thread_counts(threads: int) -> list[int]:
    """1, 2, 4, ... below `threads`, and `threads` itself."""
    counts, count = [], 1
    while count < threads:
        counts.append(count)
        count *= 2
    return [*counts, threads]


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


def thread_ms(step: Callable[[], None], counts: list[int], *, warmup: int, repeats: int) -> dict[int, float]:
    """The least ms of `step()` at each torch thread count (what the machine does unhindered:
    load only ever adds, and it adds more to the counts that use more cores); torch's
    threads are restored after."""
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
    return {count: min(values) for count, values in samples.items()}
