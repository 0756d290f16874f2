"""What Megatron-LM's --deterministic-mode costs the host on scripts/bench_host.py's dense block replica.

--deterministic-mode (Megatron-LM d98e8a64, megatron/training/determinism.py `apply_determinism_to_args`) sets
NCCL_ALGO=Ring, NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 and CUBLAS_WORKSPACE_CONFIG=:4096:8 and calls
`torch.use_deterministic_algorithms(True)`; under that flag torch fills every tensor an `empty` op returns
(`torch.utils.deterministic.fill_uninitialized_memory`, on by default): one more fill an empty. This measures, in
one process with the two settings interleaved repeat by repeat (drift on a shared machine spreads over both):
- each part's forward and backward with the flag off and on, as multiples of the torch Linear forward (bench_host's
  unit and method: CPU tensors, tiny shapes, the least of the repeats' medians);
- one `torch.empty` of the block's activation shape off and on (the fill's own host time);
- the `empty` ops a pass of each part dispatches (TorchDispatchMode), each of which the flag fills.
docs/framework-facts.md §761. Run:
    PYTHONPATH=$PWD python scripts/bench_host_determinism.py [--repeats 5] [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_host  # noqa: E402

PARTS = ("torch Linear (the unit)", "dense block (TE spec replica)", "dense block, unfused attention")


class _Empties(TorchDispatchMode):
    """Counts the aten `empty` ops (empty, empty_like, empty_strided, new_empty) dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if "empty" in name.split(".")[-1]:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def empties(fwd, make) -> tuple[int, int]:
    """The `empty` ops one forward and its backward dispatch (eager)."""
    inp = make()
    with _Empties() as c:
        out = fwd(inp)
    with _Empties() as d:
        out.backward(torch.ones_like(out))
    return sum(c.ops.values()), sum(d.ops.values())


def _empty_us(calls: int) -> float:
    def one():
        t0 = time.perf_counter()
        torch.empty(bench_host.S, bench_host.B, bench_host.H)
        return time.perf_counter() - t0

    return bench_host._time(one, calls)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for r in bench_host.parts() if r[0] in PARTS]
    counts = {name: empties(fwd, make) for name, fwd, make in rows}
    for name in list(bench_host.FUSED):
        bench_host.FUSED[name] = torch.compile(bench_host.FUSED[name])
    samples: dict[bool, dict[str, list]] = {False: {}, True: {}}
    for _ in range(args.repeats):
        for det in (False, True):
            torch.use_deterministic_algorithms(det)
            for name, fwd, make in rows:
                samples[det].setdefault(name, []).append(bench_host.measure(fwd, make, args.calls))
            samples[det].setdefault("empty", []).append((_empty_us(args.calls * 4), 0.0))
    torch.use_deterministic_algorithms(False)
    unit = {det: min(f for f, _ in samples[det][PARTS[0]]) for det in (False, True)}
    print(f"torch {torch.__version__}, {args.repeats} repeats x {args.calls} calls, the two settings interleaved")
    print("| part | empty ops fwd / bwd | fwd / Linear fwd, off -> on | bwd / Linear fwd, off -> on |")
    print("|---|---|---|---|")
    for name, _, _ in rows:
        f = [min(x for x, _ in samples[d][name]) / unit[d] for d in (False, True)]
        b = [min(x for _, x in samples[d][name]) / unit[d] for d in (False, True)]
        print(f"| {name} | {counts[name][0]} / {counts[name][1]} | {f[0]:.2f} -> {f[1]:.2f} | "
              f"{b[0]:.2f} -> {b[1]:.2f} |")
    e = [min(x for x, _ in samples[d]["empty"]) for d in (False, True)]
    print(f"one torch.empty: {e[0]:.3f} -> {e[1]:.3f} µs, the fill {e[1] - e[0]:.3f} µs = "
          f"{(e[1] - e[0]) / statistics.mean(unit.values()):.3f} Linear forwards")


if __name__ == "__main__":
    main()
