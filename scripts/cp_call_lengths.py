"""A context-parallel rank's attention per block at the rate of its ring calls' length (s / cp, what the analytic
profile charges: analytic_cp.ring_calls, analytic_time._attention) against the rate of the whole sequence's length
(what it charged before branch cptime), forward and backward ms (docs/published-runs.md §19.cptime).

    PYTHONPATH=. python scripts/cp_call_lengths.py [--arch llama3-8b] [--gpu h100] [--tp 1] SEQ:CP ...

e.g. `scripts/cp_call_lengths.py 8192:2 8192:4 8192:8 32768:8 262144:8`.
"""
import argparse

from planner.models import archs
from planner.profiler import analytic_cp
from planner.profiler.formulas import Shape
from planner.profiler.roofline import attention_efficiency


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="llama3-8b")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("pairs", nargs="+", help="SEQ:CP")
    args = parser.parse_args()
    arch, gpu = archs.arch(args.arch), archs.gpu(args.gpu)
    print(f"{arch.name} on {gpu.name}, tp {args.tp}: per block, forward / backward ms")
    for pair in args.pairs:
        seq, cp = (int(x) for x in pair.split(":"))
        record = analytic_cp.exchange(arch, Shape(seq_len=seq, micro_batch_size=1, tp=args.tp, sp=args.tp > 1,
                                                  cp=cp), gpu, None)
        chunk, whole = attention_efficiency(gpu, seq // cp), attention_efficiency(gpu, seq)
        before = (record.attention_fwd_ms * chunk[0] / whole[0], record.attention_bwd_ms * chunk[1] / whole[1])
        calls = analytic_cp.ring_calls(seq, cp, cp - 1)
        print(f"s {seq:>7} cp {cp}: {len(calls)} calls of {calls[0].pairs:,} pairs (a causal call over {seq // cp:,}"
              f" tokens); at the whole sequence's rate {before[0]:.3f} / {before[1]:.3f}, at the calls' "
              f"{record.attention_fwd_ms:.3f} / {record.attention_bwd_ms:.3f} "
              f"(x{record.attention_fwd_ms / before[0]:.3f} / x{record.attention_bwd_ms / before[1]:.3f})")


if __name__ == "__main__":
    main()
