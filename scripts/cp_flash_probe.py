"""torch's flash attention at the CP rows' ring shapes, cold and soaked, against the rate ckplan charges (one GPU).

What no source publishes and every reading of the CP rows C3/C4 ends at (docs/published-runs.md §33.cptime, §37.cptime):
the rate of torch's flash kernel (what `F.scaled_dot_product_attention` dispatches under torchtitan's
`sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])`, framework-facts §30) at the calls torch's load-balanced ring
makes on a rank, and at the clock a GPU settles to when those calls run back to back for a minute (a CP row's step is
80-90% flash). ckplan charges every ring call at the published causal rate of its length s / cp, held flat past
16,384 (pytorch/benchmark c0409aaf, a short benchmark: no clock published). The shapes, LLaMA 3 8B's 32 query heads
(torchtitan 9dec370 repeats K/V to them), head dim 128, bf16, batch 1, C1-C4's 32,768 tokens a rank:

- `published`: causal, 16 heads x 16,384 (c0409aaf's longest row, the rate ckplan reads at every ring length);
- `step0`: causal, 32,768 x 32,768 (a rank's own two chunks, every rank's first step);
- `q_all`: 32,768 queries x 16,384 keys, not causal (a later step i <= rank);
- `q_half`: 16,384 queries x 32,768 keys, not causal (a later step i > rank).

Each is timed forward and backward (autograd.grad of the output, as the ring's backward calls the flash backward
once a step) by CUDA events: the burst the best of the first sets after an idle, the soaked rate the trimmed median
of the last third of --soak-s of sets back to back (telemetry as scripts/gpu_soak.py). The report gives each call's
TFLOP/s (FlashAttention's count: 4 q k d h forward, halved causal, x 2.5 backward) against ckplan's, and a rank's
CP-8 pass as the ring runs it: step 0, then 7 later steps, each ended by a barrier across the group (the backward's
dK/dV all-to-all posts to every rank, framework-facts §152), so a later step costs the slower of q_all and q_half.

    python scripts/cp_flash_probe.py --gpu h200 --out $OUT/cpflash        # about 90 s
    python scripts/cp_flash_probe.py --dry-run                            # CPU, toy shapes: the plumbing

Without CUDA (and without --dry-run) it says so and exits 0 having measured nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HEAD_DIM = 128
BURST_SETS = 3  # sets timed after the idle; the best of each call is its burst
WINDOW_TAIL = 1 / 3  # the soak's settled part


@dataclass(frozen=True)
class Call:
    """One flash call: its name, heads, queries, keys (batch 1), causal or not."""

    name: str
    heads: int
    queries: int
    keys: int
    causal: bool

    def flops(self, which: str) -> float:
        """FlashAttention's count: forward 4 q k d h, halved under a causal mask; backward 2.5 x the forward."""
        forward = 4 * self.queries * self.keys * HEAD_DIM * self.heads * (0.5 if self.causal else 1.0)
        return forward * (2.5 if which == "backward" else 1.0)

    @property
    def length(self) -> int:
        """The length ckplan reads a ring call's rate at: the rank's s / cp tokens, the longer side of every call."""
        return max(self.queries, self.keys)


def calls(tokens: int, heads: int, published: int, published_heads: int) -> list[Call]:
    """The published row's call and the ring's three at `tokens` a rank (s / cp), two chunks of tokens / 2."""
    half = tokens // 2
    return [Call("published", published_heads, published, published, True), Call("step0", heads, tokens, tokens, True),
            Call("q_all", heads, tokens, half, False), Call("q_half", heads, half, tokens, False)]


def ring_pass_ms(ms: dict[str, float], cp: int) -> float:
    """A rank's pass over a CP-`cp` ring from each call's time: step 0, then cp - 1 later steps, each the slower of
    the two later shapes (every rank waits for the group at each step's exchange)."""
    return ms["step0"] + (cp - 1) * max(ms["q_all"], ms["q_half"])


def trimmed_median(values: list[float]) -> float:
    values = sorted(values)
    return statistics.median(values[1:-1] if len(values) >= 5 else values)


class Timer:
    """CUDA events on a GPU, the wall clock on the CPU (the dry run)."""

    def __init__(self, torch):
        self.torch, self.cuda = torch, torch.cuda.is_available()

    def __call__(self, fn) -> float:
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def _prepared(torch, call: Call, device: str):
    """q, k, v and the output's gradient in [batch, heads, tokens, head dim] views of [batch, tokens, heads, head dim]
    memory (torchtitan's transpose(1, 2) before SDPA), randn, bf16."""
    def make(tokens, grad):
        t = torch.randn(1, tokens, call.heads, HEAD_DIM, device=device, dtype=torch.bfloat16).transpose(1, 2)
        return t.requires_grad_(grad)
    return make(call.queries, True), make(call.keys, True), make(call.keys, True), make(call.queries, False)


def time_set(torch, timer: Timer, prepared: dict) -> dict[str, tuple[float, float]]:
    """Each call once: (forward ms, backward ms)."""
    return {name: _time_call(torch, timer, call, *tensors) for name, (call, tensors) in prepared.items()}


def _time_call(torch, timer: Timer, call: Call, q, k, v, dout) -> tuple[float, float]:
    import torch.nn.functional as F

    held = {}
    fwd = timer(lambda: held.setdefault("out", F.scaled_dot_product_attention(q, k, v, is_causal=call.causal)))
    bwd = timer(lambda: torch.autograd.grad(held["out"], (q, k, v), dout))
    return fwd, bwd


def probe(torch, shapes: list[Call], *, soak_s: float, idle_s: float, device: str, telemetry=None) -> dict:
    """The burst (best of BURST_SETS after an idle) and the soak (sets back to back for soak_s, the last third's
    trimmed median) of every call, forward and backward, and the telemetry after each soaked set."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    timer = Timer(torch)
    prepared = {call.name: (call, _prepared(torch, call, device)) for call in shapes}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        time_set(torch, timer, prepared)  # the kernels' first launches
        time.sleep(idle_s)
        burst = [time_set(torch, timer, prepared) for _ in range(BURST_SETS)]
        start, sets, seen = time.monotonic(), [], []
        while not sets or time.monotonic() - start < soak_s:
            sets.append(time_set(torch, timer, prepared))
            seen.append(telemetry() if telemetry else (None, None, None))
        kernels = _kernel_names(torch, lambda: time_set(torch, timer, {"step0": prepared["step0"]}))
    last = sets[-max(1, round(len(sets) * WINDOW_TAIL)):]
    found = {}
    for call in shapes:
        entry = {"heads": call.heads, "queries": call.queries, "keys": call.keys, "causal": call.causal}
        for index, which in enumerate(("forward", "backward")):
            cold = min(s[call.name][index] for s in burst)
            held = trimmed_median([s[call.name][index] for s in last])
            entry[which] = {"burst_ms": cold, "soaked_ms": held,
                            "burst_tflops": call.flops(which) / cold / 1e9,
                            "soaked_tflops": call.flops(which) / held / 1e9}
        found[call.name] = entry
    clocks = [c for c, _, _ in seen[-len(last):] if c is not None]
    return {"calls": found, "sets": len(sets), "kernels": kernels, "settled_clock_mhz": statistics.median(clocks) if clocks else None,
            "settled_power_w": _median([p for _, p, _ in seen[-len(last):]])}


def _kernel_names(torch, fn) -> list[str]:
    """The device kernels (CPU ops in the dry run) one call forward and backward launches, by the profiler: which
    flash implementation the device's torch runs (framework-facts §227 read FlashAttention-2's)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    return sorted({e.name for e in prof.events() if str(getattr(e, "device_type", "")).lower().endswith(kind)})


def _median(values):
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def against_ckplan(found: dict, shapes: list[Call], gpu_name: str, cp: int) -> dict:
    """ckplan's rate for each call (its GPU record's published attention rate at the call's length) beside the
    measured ones, and the CP-`cp` ring pass: measured (soaked; ring_pass_ms) against ckplan's cp causal calls."""
    from planner.models.attention_rates import attention_efficiency
    from planner.models.gpus import GPUS

    gpu = GPUS[gpu_name]
    report = {}
    for call in shapes:
        rates = attention_efficiency(gpu, call.length)
        for index, which in enumerate(("forward", "backward")):
            charged = gpu.bf16_tflops * rates[index]
            measured = found["calls"][call.name][which]
            report[f"{call.name} {which}"] = {"ckplan_tflops": charged, "soaked_over_ckplan":
                                              measured["soaked_tflops"] / charged,
                                              "burst_over_ckplan": measured["burst_tflops"] / charged}
    for index, which in enumerate(("forward", "backward")):
        soaked = {name: found["calls"][name][which]["soaked_ms"] for name in ("step0", "q_all", "q_half")}
        step0 = next(c for c in shapes if c.name == "step0")
        charged_ms = cp * step0.flops(which) / (gpu.bf16_tflops * attention_efficiency(gpu, step0.length)[index]) / 1e9
        report[f"ring pass cp {cp} {which}"] = {"measured_ms": ring_pass_ms(soaked, cp), "ckplan_ms": charged_ms,
                                                "measured_over_ckplan": ring_pass_ms(soaked, cp) / charged_ms}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200", help="ckplan's GPU record whose attention rate is held against")
    parser.add_argument("--tokens", type=int, default=32768, help="a rank's tokens, s / cp (C1-C4: 32,768)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--cp", type=int, default=8, help="the ring whose pass is reported (C4: 8)")
    parser.add_argument("--soak-s", type=float, default=60.0)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy shapes, a short soak: the plumbing only")
    parser.add_argument("--out", type=Path, default=Path("out/cp_flash_probe"))
    args = parser.parse_args(argv)
    if args.tokens <= 0 or args.tokens % 2 or args.heads <= 0 or args.cp < 2 or args.soak_s <= 0 or args.idle_s < 0:
        parser.error("--tokens must be a positive even count, --heads positive, --cp at least 2, --soak-s positive "
                     "and --idle-s not negative")
    from planner.models.gpus import GPUS

    if args.gpu not in GPUS:
        parser.error(f"no GPU record named {args.gpu!r}; one of: {', '.join(sorted(GPUS))}")
    import torch

    if args.dry_run:
        shapes, device, soak_s, idle_s = calls(256, 2, 128, 1), "cpu", min(args.soak_s, 0.5), 0.0
    elif not torch.cuda.is_available():
        print("cp_flash_probe: no CUDA device here; nothing measured (skipped).")
        return 0
    else:
        shapes, device, soak_s, idle_s = calls(args.tokens, args.heads, 16384, 16), "cuda", args.soak_s, args.idle_s
    telemetry = None
    if device == "cuda":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gpu_soak import Telemetry

        telemetry = Telemetry(torch, torch.cuda.current_device())
    found = probe(torch, shapes, soak_s=soak_s, idle_s=idle_s, device=device, telemetry=telemetry)
    found |= {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
              "torch": torch.__version__, "gpu_record": args.gpu, "cp": args.cp, "soak_s": soak_s,
              "against_ckplan": against_ckplan(found, shapes, args.gpu, args.cp)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cp_flash_probe.json").write_text(json.dumps(found, indent=1))
    print("| call | pass | burst TFLOP/s | soaked TFLOP/s | ckplan TFLOP/s | soaked / ckplan |\n|---|---|---|---|---|---|")
    for call in shapes:
        for which in ("forward", "backward"):
            got, mine = found["calls"][call.name][which], found["against_ckplan"][f"{call.name} {which}"]
            print(f"| {call.name} | {which} | {got['burst_tflops']:.1f} | {got['soaked_tflops']:.1f} | "
                  f"{mine['ckplan_tflops']:.1f} | {mine['soaked_over_ckplan']:.3f} |")
    for which in ("forward", "backward"):
        ring = found["against_ckplan"][f"ring pass cp {args.cp} {which}"]
        print(f"ring pass, CP {args.cp}, {which}: {ring['measured_ms']:.2f} ms measured (soaked) against ckplan's "
              f"{ring['ckplan_ms']:.2f} ({ring['measured_over_ckplan']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
