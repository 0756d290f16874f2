"""Print one MoE decoder block's analytic time, term by term, for a Megatron-LM flags file (docs/published-runs.md
§23.moerows): the matmuls by size and count, attention, and the memory-bound bytes by op class, forward and backward,
as the analytic profile times them at the job's microbatch, TP, SP, CP and EP on the GPU.

usage: PYTHONPATH=<checkout> python scripts/moe_block_terms.py configs/megatron-bridge/FILE.yaml GPU
"""
import sys
from collections import Counter
from pathlib import Path

from planner.profiler import analytic_time, te_fused
from planner.profiler.membound import achieved_tbps
from planner.profiler.roofline import kernel_ms, roofline_ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_job  # noqa: E402


def main(argv: list[str]) -> int:
    found = moe_job.read(argv, "moe_block_terms.py")
    if found is None:
        return 2
    job, gpu, shape = found
    fwd, bwd, _rerun = analytic_time.block_work(job.arch, shape, moe=True)
    print(f"{argv[0]} on {gpu.name}: {shape.tokens} tokens a microbatch, tp {shape.tp}, ep {shape.ep}")
    for name, done in (("forward", fwd), ("backward", bwd)):
        print(f"{name}: {roofline_ms(done, gpu):.2f} ms")
        counts = Counter()
        for kernel, n in done.kernels:
            counts[kernel] += n
        for kernel, n in sorted(counts.items(), key=lambda item: -item[0].flops * item[1]):
            print(f"  {kernel.kind} {kernel.flops:.3g} FLOPs x {n}: {n * kernel_ms(kernel, gpu):.3f} ms")
        for op_class, num in done.classed:
            print(f"  {op_class} {num / 1e9:.2f} GB at {achieved_tbps(gpu, 'eager', op_class):.2f} TB/s")
    timed = te_fused.te_time(job.arch, shape, gpu, (fwd, bwd, _rerun), moe=True)
    if timed is not None:  # the block on Megatron's fused kernels (te_fused.py, te_moe.py): --runtime megatron's
        print(f"on Megatron's fused kernels (te_time): forward {timed.fwd_ms:.2f} ms, backward {timed.bwd_ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
