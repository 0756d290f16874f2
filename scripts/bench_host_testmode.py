"""The host's time for Megatron-core's --test-mode check in each attention forward, as multiples of one torch Linear
forward (the unit of scripts/bench_host.py, anchored by the cost model to GPU.host_call_us).

The replica is `SelfAttention.run_realtime_tests` (megatron/core/transformer/attention.py 1753-1822, Megatron-LM
d98e8a64 and 93ebf8d7), without its two collectives (their issue: the runtime record's "all-gather", bench_host_comm.py):

  inputs = torch.stack([q_w, q_b, k_w, k_b])                    once ("fixed")
  for each rank of the group (DP, then TP):                      ("a rank")
      torch.empty_like(inputs)                                   (the gather list, its own rank's entry replaced)
      torch.unbind(entry); _compare: 4 x assert torch.all(src == tgt)   (bool() reads the result: .item())

CPU tensors of the norms' width (head_dim 64), so each op's time is its dispatch. On a GPU each `assert` copies the
result to the host and waits for it (aten::_local_scalar_dense: cudaMemcpyAsync and a stream synchronize): that wait is
not in this measurement (charged apart: planner/cost/realtime_tests.py). Prints the least of the repeats' medians over
the Linear's least, and the per-repeat ratios' median and range. Run:
    PYTHONPATH=$PWD python scripts/bench_host_testmode.py [--repeats 9] [--calls 400]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

HEAD_DIM = 64
H = 32  # the unit Linear's width: scripts/bench_host.py's


def _norms():
    torch.manual_seed(0)
    return [torch.randn(HEAD_DIM) for _ in range(4)]  # q_layernorm weight, bias; k_layernorm weight, bias


def fixed(norms) -> float:
    t0 = time.perf_counter()
    torch.stack(norms)
    return time.perf_counter() - t0


def one_rank(norms, inputs, gathered) -> float:
    """One rank's share: its list entry (torch.empty_like), the unbind and the four asserted comparisons, on the
    entry NCCL filled (`gathered`: equal values, made before the timing; the fill is the collective's own)."""
    t0 = time.perf_counter()
    torch.empty_like(inputs)
    for src, tgt in zip(torch.unbind(gathered), norms):
        assert torch.all(src == tgt)
    return time.perf_counter() - t0


def linear(lin, x) -> float:
    t0 = time.perf_counter()
    lin(x)
    return time.perf_counter() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    norms = _norms()
    inputs = torch.stack(norms)
    lin, x = nn.Linear(H, H), torch.randn(8, 2, H, requires_grad=True)
    parts = {"torch Linear (the unit)": lambda: linear(lin, x), "fixed (stack)": lambda: fixed(norms),
             "a rank (empty_like, unbind, 4 asserts)": lambda: one_rank(norms, inputs, inputs.clone())}
    for fn in parts.values():
        for _ in range(50):
            fn()
    samples = {name: [] for name in parts}
    for _ in range(args.repeats):  # interleaved: a shared machine's drift spreads over every part
        for name, fn in parts.items():
            samples[name].append(statistics.median(fn() for _ in range(args.calls)) * 1e6)
    unit = samples["torch Linear (the unit)"]
    print(f"torch {torch.__version__}, {args.repeats} repeats x {args.calls} calls, head_dim {HEAD_DIM}")
    print("| part | µs, least (median) | / Linear fwd | per-repeat ratio: median (min-max) |")
    print("|---|---|---|---|")
    for name, values in samples.items():
        ratios = [v / u for v, u in zip(values, unit)]
        print(f"| {name} | {min(values):.2f} ({statistics.median(values):.2f}) | {min(values) / min(unit):.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
