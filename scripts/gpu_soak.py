"""The matmul rate a GPU holds under a training step's power (MSMF) against its cold burst (MAMF), on one GPU.

planner/models/matmul_ceilings.py reads the sustained MSMF where one is published (H100's chip, B200), Azure's soaked
cuBLASLt figures or one derived from them for the GB200 and A100 (docs/framework-facts.md §190), and the burst MAMF
elsewhere (GH200): no MSMF is published for those (§163). This check measures one, after the protocol of
stas00/ml-engineering 082816f (branch fast-mamf, mamf-finder.py `--search auto`, benchmarks/README.md): a burst of a low-power shape after an idle (the boost clock), then a
thermal soak on a fat shape with the clock, power and temperature read after each window, the sustained rate the
trimmed median of the windows once the clock has settled (the last third of the soak). Operands are randn, as there
(input entropy moves the power, hence the clock). Run it alone on the node: a busy sibling pulls the clock down.

    python scripts/gpu_soak.py --gpu gb200                      # bf16, 60 s soak, the shapes below
    python scripts/gpu_soak.py --gpu gb200 --dtype fp8 --soak-s 90 --out out/gpu_soak

Without CUDA it says so and exits 0 having measured nothing. The report (json, and one markdown row) goes to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The soak shape: the H200's MSMF winner (082816f's table, 8192x8448x20480; the B200's 9472x8192x20480 is the same
# class): large enough on every side that the tensor cores saturate the power, as a training step's GEMMs do
# (LLaMA 3 8B at 16,384 tokens: 16384x4096x14336). The burst shape: the B200's MAMF winner (1536x9472x14336), a
# shape that draws well below the power limit and so holds the boost clock.
SOAK_SHAPE = (8192, 8448, 20480)
BURST_SHAPE = (1536, 9472, 14336)
BURST_WINDOWS = 20  # single matmuls timed one by one after the idle; the best is the burst (MAMF takes the best)
WINDOW_S = (
    0.5  # each soak window's length: long against a kernel, short against the clock's settling
)


@dataclass(frozen=True)
class Window:
    """One timed stretch of back-to-back matmuls and the telemetry read right after it."""

    t_s: float  # seconds since the soak began, at the window's end
    ms_per_matmul: float
    tflops: float
    clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None


def parse_shape(text: str) -> tuple[int, int, int]:
    """'MxNxK' as three positive integers."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"a shape is MxNxK with three positive integers (e.g. 8192x8448x20480), not {text!r}"
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def matmul_tflops(shape: tuple[int, int, int], ms: float) -> float:
    """TFLOP/s of one MxNxK matmul taking `ms` milliseconds: 2MNK FLOP."""
    m, n, k = shape
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def trimmed_median(values: list[float]) -> float:
    """The median with the single lowest and highest dropped once there are 5 or more (mamf-finder's, 082816f)."""
    values = sorted(values)
    return statistics.median(values[1:-1] if len(values) >= 5 else values)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def settled(windows: list[Window], tail: float = 1 / 3) -> dict:
    """The soak's settled state: its last `tail` of windows (each about WINDOW_S long), their rate's trimmed median,
    the medians of their clock, power and temperature, and how far the clock still moved across them."""
    last = windows[-max(1, round(len(windows) * tail)) :]
    clocks = [w.clock_mhz for w in last if w.clock_mhz is not None]
    return {
        "windows": len(last),
        "tflops": trimmed_median([w.tflops for w in last]),
        "clock_mhz": _median(clocks),
        "power_w": _median([w.power_w for w in last]),
        "temperature_c": _median([w.temperature_c for w in last]),
        "clock_spread_mhz": (max(clocks) - min(clocks)) if clocks else None,
    }


def summary(
    burst: list[Window], windows: list[Window], *, peak_tflops: float | None = None
) -> dict:
    """The burst (the best window of the cold burst, as MAMF takes the best) against the settled soak (MSMF)."""
    best = max(burst, key=lambda w: w.tflops)
    held = settled(windows)
    found = {
        "burst": asdict(best),
        "sustained": held,
        "sustained_over_burst": held["tflops"] / best.tflops,
    }
    if peak_tflops:
        found |= {
            "peak_tflops": peak_tflops,
            "burst_of_peak": best.tflops / peak_tflops,
            "sustained_of_peak": held["tflops"] / peak_tflops,
        }
    return found


def soak(
    run_window, telemetry, soak_s: float, *, count: int = 0, now=time.monotonic
) -> list[Window]:
    """Windows until `soak_s` has passed (or `count` windows where given): `run_window()` times one window (its
    shape, ms per matmul), then the telemetry is read. `now` keeps the soak's time (a fake clock in the tests)."""
    start, windows = now(), []
    while (len(windows) < count) if count else (not windows or windows[-1].t_s < soak_s):
        shape, ms = run_window()
        windows.append(Window(now() - start, ms, matmul_tflops(shape, ms), *telemetry()))
    return windows


class Telemetry:
    """SM clock (MHz), power (W) and temperature (°C) of one CUDA device through torch.cuda (pynvml underneath);
    None where the machine has no pynvml."""

    def __init__(self, torch, device: int):
        self.torch, self.device = torch, device

    def _read(self, name: str, scale: float = 1.0) -> float | None:
        try:
            return getattr(self.torch.cuda, name)(self.device) * scale
        except Exception:  # no pynvml, or a driver without the query: the soak still times
            return None

    def __call__(self) -> tuple[float | None, float | None, float | None]:
        return self._read("clock_rate"), self._read("power_draw", 1e-3), self._read("temperature")

    def power_limit_w(self) -> float | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.device)
            return pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
        except Exception:
            return None


def _matmul(torch, shape: tuple[int, int, int], dtype: str):
    """A closure running one MxNxK matmul into a preallocated output (randn operands, B column-major)."""
    m, n, k = shape
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda").to(torch.bfloat16).t()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if dtype == "bf16":
        return lambda: torch.mm(a, b, out=out)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    return lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, out=out)


def _timed(torch, op, shape, iters: int):
    """(shape, ms per matmul) of `iters` back-to-back matmuls, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        op()
    end.record()
    end.synchronize()
    return shape, start.elapsed_time(end) / iters


def measure(torch, args, telemetry) -> tuple[list[Window], list[Window]]:
    """The cold burst (after an idle, one matmul a window) and the soak (windows of about WINDOW_S)."""
    burst_op, soak_op = (
        _matmul(torch, args.burst_shape, args.dtype),
        _matmul(torch, args.shape, args.dtype),
    )
    # the first calls pick cuBLAS's kernels and allocate its workspace; then the idle restores the boost clock
    _timed(torch, burst_op, args.burst_shape, 3)
    _, first_ms = _timed(torch, soak_op, args.shape, 2)
    torch.cuda.synchronize()
    time.sleep(args.idle_s)
    burst = soak(
        lambda: _timed(torch, burst_op, args.burst_shape, 1), telemetry, 0.0, count=BURST_WINDOWS
    )
    per_window = max(1, round(WINDOW_S * 1e3 / first_ms))
    return burst, soak(
        lambda: _timed(torch, soak_op, args.shape, per_window), telemetry, args.soak_s
    )


def _row(gpu: str, found: dict) -> str:
    b, s = found["burst"], found["sustained"]
    return (
        f"| {gpu} | {b['tflops']:.1f} @ {b['clock_mhz']} MHz, {b['power_w']} W | {s['tflops']:.1f} @ "
        f"{s['clock_mhz']} MHz, {s['power_w']} W | {found['sustained_over_burst']:.3f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gpu", default="", help="ckplan's GPU record name, for the datasheet peak (optional)"
    )
    parser.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16")
    parser.add_argument("--shape", default="x".join(map(str, SOAK_SHAPE)), help="the soak's MxNxK")
    parser.add_argument(
        "--burst-shape", default="x".join(map(str, BURST_SHAPE)), help="the cold burst's MxNxK"
    )
    parser.add_argument("--soak-s", type=float, default=60.0)
    parser.add_argument(
        "--idle-s", type=float, default=5.0, help="idle before the burst, for the boost clock"
    )
    parser.add_argument("--out", type=Path, default=Path("out/gpu_soak"))
    args = parser.parse_args(argv)
    try:
        args.shape, args.burst_shape = parse_shape(args.shape), parse_shape(args.burst_shape)
    except ValueError as err:
        parser.error(str(err))
    if args.soak_s <= 0 or args.idle_s < 0:
        parser.error("--soak-s must be positive and --idle-s not negative")
    peak = None
    if args.gpu:
        from planner.models.gpus import GPUS

        if args.gpu not in GPUS:
            parser.error(f"no GPU record named {args.gpu!r}; one of: {', '.join(sorted(GPUS))}")
        record = GPUS[args.gpu]
        peak = record.bf16_tflops if args.dtype == "bf16" else record.fp8_tflops
    import torch

    if not torch.cuda.is_available():
        print("gpu_soak: no CUDA device here; nothing measured (skipped).")
        return 0
    telemetry = Telemetry(torch, torch.cuda.current_device())
    burst, windows = measure(torch, args, telemetry)
    found = summary(burst, windows, peak_tflops=peak)
    found |= {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "shape": args.shape,
        "burst_shape": args.burst_shape,
        "soak_s": args.soak_s,
        "power_limit_w": telemetry.power_limit_w(),
        "soak_windows": [asdict(w) for w in windows],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_soak_{args.gpu or 'gpu'}_{args.dtype}.json").write_text(
        json.dumps(found, indent=1)
    )
    print("| GPU | burst TFLOP/s | sustained TFLOP/s | sustained / burst |\n|---|---|---|---|")
    print(_row(args.gpu or found["device"], found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
