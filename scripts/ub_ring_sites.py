"""What each of a dense block's ring-exchange sites adds under TE's userbuffers (docs/published-runs.md §39.ringgemm):
the GEMM whole and in its tp chunks (FP8), a chunk's copy, and its pipeline's extra over the whole
(planner/profiler/analytic_ubring.py, planner/cost/ub_ring.py).

    python scripts/ub_ring_sites.py llama3.1-405b h100-sxm --seq-len 8192 --tp 8 --cp 2 \
        --config userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192 --copy-gb-per-s 371.6
"""

from __future__ import annotations

import argparse

from planner.cost import ub_ring, ub_sms
from planner.models.archs import ARCHS, GPUS
from planner.models.gpu_sms import sm_count
from planner.profiler import analytic_ubring
from planner.profiler.formulas import Shape

KINDS = ("all-gather", "reduce-scatter", "all-gather", "reduce-scatter", "all-gather", "all-gather")
GEMMS = ("qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop", "proj_dgrad", "fc2_dgrad")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arch", choices=sorted(ARCHS))
    parser.add_argument("gpu", choices=sorted(GPUS))
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--config", default=None, help="a Megatron-Bridge userbuffers config (None: TE's defaults)")
    parser.add_argument("--copy-gb-per-s", type=float, required=True)
    args = parser.parse_args()
    arch, gpu = ARCHS[args.arch], GPUS[args.gpu]
    shape = Shape(args.seq_len, 1, tp=args.tp, sp=True, cp=args.cp)
    ring, table, sms = analytic_ubring.block_ring(arch, shape, gpu, fp8=True), ub_sms.overlaps(args.config), sm_count(gpu)
    tensor = shape.tokens * arch.hidden_size * 2
    totals = {"forward": 0.0, "backward": 0.0}
    for site, kind, gemm in zip(analytic_ubring.RING_SITES, KINDS, GEMMS, strict=True):
        record = ring[site]
        if table[gemm].method != "ring_exchange":
            print(f"{gemm:11s} {table[gemm].method}: not a ring exchange")
            continue
        extra, _ = ub_ring.site_extra_ms(kind, tensor, tuple(record.model_dump().values()), table[gemm],
                                         ranks=args.tp, copy_gb_per_s=args.copy_gb_per_s, sms=sms or 0, float8=True,
                                         gathered_float8=True)
        copy = tensor / args.tp / (2 if kind == "all-gather" else 1) / (args.copy_gb_per_s * 1e9) * 1e6
        print(f"{gemm:11s} FP8 whole {record.fp8_whole_ms * 1e3:7.1f} us, {args.tp} chunks of "
              f"{record.fp8_chunk_ms * 1e3:6.1f} us, a copy {copy:5.1f} us: +{extra * 1e3:6.1f} us")
        totals["backward" if gemm.endswith("dgrad") else "forward"] += extra
    print(", ".join(f"{name} +{ms * 1e3:.1f} us" for name, ms in totals.items()))


if __name__ == "__main__":
    main()
