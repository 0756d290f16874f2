"""Print one MoE decoder block's analytic time, term by term, for a Megatron-LM flags file (docs/published-runs.md
§23.moerows): the matmuls by size and count, attention, and the memory-bound bytes by op class, forward and backward,
as the analytic profile times them at the job's microbatch, TP, SP, CP and EP on the GPU; then the same block on
Megatron's fused kernels (te_fused.moe_passes, the record `--runtime megatron` reads), part by part, the parts adding
up to the record's forward and backward (`fused_parts`). The shape carries no sliding window: a full-attention block.

usage: PYTHONPATH=<checkout> python scripts/moe_block_terms.py configs/megatron-bridge/FILE.yaml GPU
"""
import sys
from collections import Counter
from pathlib import Path

from planner.models.attention_rates import te_attention_gpu
from planner.profiler import analytic_time, te_fused
from planner.profiler.membound import achieved_tbps, membound_ms
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
        for name, parts in zip(("forward", "backward"), fused_parts(job.arch, shape, gpu, (fwd, bwd, _rerun))):
            print(f"  {name}: " + "; ".join(f"{part} {ms:.3f}" for part, ms in parts))
    return 0


def fused_parts(arch, shape, gpu, passes) -> tuple[list, list]:
    """The fused record's forward and backward (te_fused.moe_passes, less the eager weight-gradient accumulation
    Megatron's fused wgrad does not run) as (part, ms) lists that add up to roofline_ms of each pass at the record's
    GPU (te_attention_gpu): each kernel by kind and FLOPs, FLOPs beyond them at the plateau, eager bytes by class and
    unclassed, the fused kernels' bytes."""
    fwd, bwd, _ = te_fused.moe_passes(arch, shape, passes)
    bwd, _ = te_fused.fused_accumulation(bwd, arch, shape, moe=True)
    kernels_gpu = te_attention_gpu(gpu)
    return _parts(fwd, kernels_gpu), _parts(bwd, kernels_gpu)


def _parts(done, gpu) -> list:
    counts = Counter()
    for kernel, n in done.kernels:
        counts[kernel] += n
    parts = [(f"{kernel.kind} {kernel.flops:.3g} FLOPs x {n}", n * kernel_ms(kernel, gpu))
             for kernel, n in sorted(counts.items(), key=lambda item: -item[1] * kernel_ms(item[0], gpu))]
    rest = max(done.flops - sum(kernel.flops * n for kernel, n in done.kernels), 0)
    parts.append(("FLOPs beyond the kernels", rest / (gpu.bf16_tflops * 1e12 * gpu.matmul_efficiency) * 1e3))
    parts += [(f"{op_class} bytes", membound_ms(num, gpu, "eager", op_class)) for op_class, num in done.classed]
    parts.append(("unclassed eager bytes", membound_ms(done.unclassed_bytes, gpu, "eager")))
    parts.append(("fused kernels' bytes", membound_ms(done.fused_bytes, gpu, "fused")))
    return parts


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
