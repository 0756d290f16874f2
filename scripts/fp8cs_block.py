"""A dense block's FP8 current-scaling passes over HBM as Transformer Engine v2.9 runs them, term by term, with
what ckplan charges for each (docs/published-runs.md §44.fp8cs): each linear's input and output-gradient quantize
(amax, cast, Hopper's transpose; planner/profiler/float8.py te_input_bytes, te_grad_bytes, te_gathered_input_bytes)
and, under --tp-comm-overlap, the userbuffers' copies (planner/cost/ub_sms.py buffer_copy_bytes), in MB and µs at
the rates ckplan charges them.

usage: PYTHONPATH=<checkout> python scripts/fp8cs_block.py --arch llama3.1-405b --gpu h100-sxm --seq 8192 --cp 2 --tp 8
"""
import argparse

from planner.models.archs import arch as get_arch
from planner.models.gpus import gpu as get_gpu
from planner.models.membound_rate import achieved_tbps
from planner.profiler import float8
from planner.profiler.formulas import Shape


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--cp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    arch, gpu = get_arch(args.arch), get_gpu(args.gpu)
    shape = Shape(seq_len=args.seq // args.cp, micro_batch_size=1, tp=args.tp, sp=args.tp > 1)
    fused = gpu.hbm_tbps * gpu.membound_fused_efficiency  # TB/s: TE's casts (the fused class)
    copy = achieved_tbps(gpu, "eager", "elementwise")  # TB/s: the userbuffers' copies (the reduce kernel's)
    total = {"fwd": 0, "bwd": 0}
    print(f"{'pass':4} {'linear':12} {'what':52} {'MB':>8} {'µs':>7}")
    for linear in float8.converted(float8.te_linears(arch, shape, "layers.0")):
        name = linear.fqn.split(".")[-1]
        rows = [("fwd", "input quantize (norm amax / amax, cast, transpose)", float8.te_input_bytes(linear, gpu)),
                ("bwd", "grad-output quantize (amax, cast, transpose)", float8.te_grad_bytes(linear, gpu)),
                ("bwd", "gathered input's transpose (SP, Hopper)", float8.te_gathered_input_bytes(linear, gpu))]
        for which, what, num in rows:
            if num:
                total[which] += num
                print(f"{which:4} {name:12} {what:52} {num / 1e6:8.1f} {num / fused / 1e6:7.1f}")
    whole = shape.tokens * arch.hidden_size * 2  # a gathered (or scattered) hidden-width tensor, bf16
    if args.tp > 1:
        shard8 = whole // 2 // args.tp  # its FP8 shard
        copies = [("fwd", "qkv_fprop, fc1_fprop shards into the buffer", 2 * 2 * shard8),
                  ("bwd", "proj_dgrad, fc2_dgrad shards into the buffer", 2 * 2 * shard8),
                  ("bwd", "qkv_wgrad, fc1_wgrad (bulk) chunks cloned out (bf16)", 2 * 2 * whole // args.tp),
                  ("bwd", "qkv_dgrad, fc1_dgrad (bulk) shards into the buffer", 2 * 2 * shard8)]
        for which, what, num in copies:
            hidden = "bulk) shards" in what  # on the communication stream beside the dgrad GEMM: not charged
            print(f"{which:4} {'userbuffers':12} {what:52} {num / 1e6:8.1f} {num / copy / 1e6:7.1f}   "
                  f"{'(hidden, not charged)' if hidden else '(new)'}")
    for which, num in total.items():
        print(f"{which} quantize total {num / 1e6:.1f} MB, {num / fused / 1e6:.1f} µs at {fused:.3f} TB/s")


if __name__ == "__main__":
    main()
