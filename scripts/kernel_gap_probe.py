"""The device's own time between back-to-back kernels on one stream (docs/published-runs.md §35.kgap): N tiny
kernels (one `torch.add(x, y, out=z)` each, one elementwise kernel) queued on one stream while the host is ahead,
once issued one by one (eager) and once replayed from a CUDA graph captured from the same calls, each timed on the
device by CUDA events, and the kernels' own durations read from the profiler's (CUPTI's) kernel records.

What it prints, per mode: the period a kernel (events: the N kernels' span / N), the kernel's own duration (the
trace's median), the gap (period less duration, and the trace's median start-to-previous-end), and whether the host
was ahead (the host queued all N calls before the device finished the sleep kernel queued in front of them: the gap
is then the device's own, not the host's issue, which ckplan charges apart in planner/cost/hosttime.py).

Why a probe and not a term: no published figure gives the host-ahead gap of eager launches on H100 (or B200, GB200,
A100, MI300X) with its setting; the figures found are the period of tiny kernels replayed from a CUDA graph, which
holds the kernel's own time too (docs/framework-facts.md §193-§194).

Skips cleanly (one line, exit 0) without a CUDA device. Run on an idle GPU, one process:
    PYTHONPATH=$PWD python scripts/kernel_gap_probe.py                      # 500 kernels of 1,024 elements
    PYTHONPATH=$PWD python scripts/kernel_gap_probe.py --numel 1048576      # a kernel of a few µs: the gap beside a
                                                                            # kernel that fills the GPU
The arithmetic without a device (what a block-microbatch's gap would need to be, or would add):
    python scripts/kernel_gap_probe.py --missing-ms 4.53 --block-kernels 300 --gap-us 1.3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HOLD_CYCLES = 2.0e9  # cycles a second at up to 2 GHz: a sleep of at least the seconds asked on any current GPU
QUEUE_DEPTH = 1000  # eager calls a repeat, at most: past the launch queue's depth the host would wait on the device


def period_us(span_ms: float, kernels: int) -> float:
    """µs a kernel: the device's span over `kernels` back-to-back kernels."""
    return span_ms * 1e3 / kernels


def gaps_us(spans: list[tuple[float, float]]) -> list[float]:
    """Each kernel's start less the previous one's end (µs), the kernels' (start, end) in the order they ran."""
    ordered = sorted(spans)
    return [after[0] - before[1] for before, after in zip(ordered, ordered[1:])]


def host_ahead(host_ms: float, hold_ms: float) -> bool:
    """Whether the host queued every call before the device reached the first: it took less than the sleep in front."""
    return host_ms < hold_ms


def needed_gap_us(missing_ms: float, kernels: int) -> float:
    """µs each of a block-microbatch's `kernels` would have to wait for the gap to carry `missing_ms`."""
    return missing_ms * 1e3 / kernels


def added_ms(kernels: int, gap_us: float) -> float:
    """ms a block-microbatch of `kernels` back-to-back kernels gains at `gap_us` each."""
    return kernels * gap_us / 1e3


def block_share(kernels: int, gap_us: float, block_ms: float) -> float:
    """What a gap of `gap_us` after each of a block-microbatch's `kernels` adds to its `block_ms` of device time."""
    return added_ms(kernels, gap_us) / block_ms


def summary(
    mode: str, span_ms: float, kernels: int, durations: list[float], gaps: list[float], ahead: bool
) -> dict:
    period = period_us(span_ms, kernels)
    duration = statistics.median(durations) if durations else None
    return {
        "mode": mode,
        "kernels": kernels,
        "span_ms": span_ms,
        "period_us": period,
        "kernel_us": duration,
        "gap_us": None if duration is None else period - duration,
        "trace_gap_us": statistics.median(gaps) if gaps else None,
        "host_ahead": ahead,
    }


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def report(rows: list[dict]) -> list[str]:
    lines = [
        "| mode | kernels | period µs (events) | kernel µs (trace) | gap µs (period - kernel) | gap µs (trace) | host ahead |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['kernels']} | {_us(row['period_us'])} | {_us(row['kernel_us'])} | "
            f"{_us(row['gap_us'])} | {_us(row['trace_gap_us'])} | {'yes' if row['host_ahead'] else 'NO'} |"
        )
    return lines


def unavailable() -> str | None:
    """Why the probe cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (the probe times kernels on the device)"
    return None


def _timed(issue, hold_s: float) -> tuple[float, float, float]:
    """(device span ms of `issue()`'s kernels, host ms to issue them, device ms of the sleep in front)."""
    import torch

    torch.cuda.synchronize()
    before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    before.record()
    torch.cuda._sleep(int(hold_s * HOLD_CYCLES))  # the device busy while the host queues
    start.record()
    t0 = time.perf_counter()
    issue()
    host_ms = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return start.elapsed_time(end), host_ms, before.elapsed_time(start)


def _kernel_spans(issue, hold_s: float, name_hint: str) -> list[tuple[float, float]]:
    """The (start, end) µs of each kernel `issue()` ran, from the profiler's CUDA records (the sleep left out)."""
    import torch
    from torch.autograd import DeviceType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _timed(issue, hold_s)
    spans = [
        (event.time_range.start, event.time_range.end)
        for event in prof.events()
        if event.device_type == DeviceType.CUDA and name_hint in event.name
    ]
    return spans


def run(args: argparse.Namespace) -> list[dict]:
    import torch

    x, y, z = (torch.randn(args.numel, device="cuda") for _ in range(3))

    def eager():
        for _ in range(args.kernels):
            torch.add(x, y, out=z)

    eager()  # the kernel loaded, the allocator warm
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager()  # torch's rule: warm up on the capturing stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    rows = []
    for mode, issue in (("eager", eager), ("graph", graph.replay)):
        spans_ms, ahead = [], True
        for _ in range(args.repeats):
            span_ms, host_ms, hold_ms = _timed(issue, args.hold_ms / 1e3)
            spans_ms.append(span_ms)
            ahead = ahead and host_ahead(host_ms, hold_ms)
        spans = _kernel_spans(issue, args.hold_ms / 1e3, "elementwise") if args.trace else []
        durations = [end - start for start, end in spans]
        rows.append(
            summary(
                mode, statistics.median(spans_ms), args.kernels, durations, gaps_us(spans), ahead
            )
        )
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kernels", type=int, default=500, help=f"kernels a repeat (at most {QUEUE_DEPTH})"
    )
    parser.add_argument("--numel", type=int, default=1024, help="elements each kernel adds")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--hold-ms", type=float, default=50.0, help="the sleep queued in front of the kernels"
    )
    parser.add_argument(
        "--no-trace", dest="trace", action="store_false", help="events only, no profiler run"
    )
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument(
        "--missing-ms", type=float, default=None, help="arithmetic only: a block-microbatch's gap"
    )
    parser.add_argument(
        "--block-kernels", type=int, default=None, help="arithmetic only: its kernels"
    )
    parser.add_argument(
        "--gap-us", type=float, default=None, help="arithmetic only: a gap a kernel"
    )
    args = parser.parse_args(argv)
    for name in ("kernels", "numel", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.kernels > QUEUE_DEPTH:
        parser.error(
            f"--kernels {args.kernels} is past the launch queue's depth ({QUEUE_DEPTH}): the host would wait"
        )
    if args.hold_ms <= 0:
        parser.error(f"--hold-ms must be positive, got {args.hold_ms}")
    arithmetic = (args.missing_ms, args.block_kernels)
    if (args.missing_ms is None) != (args.block_kernels is None):
        parser.error("--missing-ms and --block-kernels go together")
    if args.block_kernels is not None and (args.block_kernels < 1 or args.missing_ms < 0):
        parser.error(f"--missing-ms must be >= 0 and --block-kernels positive, got {arithmetic}")
    if args.gap_us is not None and args.block_kernels is None:
        parser.error("--gap-us needs --missing-ms and --block-kernels")
    return args


def arithmetic_lines(missing_ms: float, kernels: int, gap_us: float | None) -> list[str]:
    lines = [
        f"a block-microbatch of {kernels} kernels missing {missing_ms:.3f} ms: "
        f"{needed_gap_us(missing_ms, kernels):.3f} µs a kernel would carry it"
    ]
    if gap_us is not None:
        adds = added_ms(kernels, gap_us)
        share = adds / missing_ms if missing_ms else float("inf")
        lines.append(
            f"at {gap_us:.3f} µs a kernel: {adds:.3f} ms a block-microbatch, {share:.1%} of what is missing"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.block_kernels is not None:
        print("\n".join(arithmetic_lines(args.missing_ms, args.block_kernels, args.gap_us)))
        return 0
    reason = unavailable()
    if reason:
        print(f"kernel_gap_probe: skipped: {reason}")
        return 0
    import torch

    rows = run(args)
    props = torch.cuda.get_device_properties(0)
    print(
        f"{props.name}, torch {torch.__version__}, CUDA {torch.version.cuda or torch.version.hip}, "
        f"{args.numel} elements a kernel"
    )
    print("\n".join(report(rows)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as out:
            json.dump(
                {
                    "device": props.name,
                    "torch": torch.__version__,
                    "numel": args.numel,
                    "rows": rows,
                },
                out,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
