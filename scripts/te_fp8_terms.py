"""Print a dense block's passes under Transformer Engine's FP8 (Megatron's TE spec, current scaling), term by
term: each GEMM (bf16 / FP8) and attention kernel's ms, the eager bytes by class, the fused kernels' bytes (TE's
norms, rotary, SwiGLU and the FP8 casts), each at the rate ckplan charges (docs/published-runs.md §33.fp8slow).

usage: PYTHONPATH=<checkout> python scripts/te_fp8_terms.py --arch llama3-8b --gpu h100-sxm --seq 8192 [--mbs 1] [--tp 1]
"""
import argparse
from collections import Counter

from planner.models.archs import arch as get_arch
from planner.models.attention_rates import te_attention_gpu
from planner.models.gpus import gpu as get_gpu
from planner.profiler import analytic_time, float8, te_fused
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import kernel_ms, roofline_ms


def terms(done, gpu) -> dict:
    out = Counter()
    for kernel, count in done.kernels:
        out[f"{kernel.kind} {kernel.flops / 1e9:.0f} GFLOP x{count}"] += kernel_ms(kernel, gpu) * count
    for op_class, num in done.classed:
        out[f"eager {op_class} {num / 1e6:.0f} MB"] += membound_ms(num, gpu, "eager", op_class)
    out[f"eager unclassed {done.unclassed_bytes / 1e6:.0f} MB"] += membound_ms(done.unclassed_bytes, gpu, "eager")
    out[f"fused {done.fused_bytes / 1e6:.0f} MB"] += membound_ms(done.fused_bytes, gpu, "fused")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    arch, gpu = get_arch(args.arch), get_gpu(args.gpu)
    shape = Shape(seq_len=args.seq, micro_batch_size=args.mbs, tp=args.tp, sp=args.tp > 1)
    passes = analytic_time.block_work(arch, shape, moe=False)
    kgpu = te_attention_gpu(gpu)
    saved, fused = te_fused.fused_bytes_saved(arch, shape), te_fused.fused_kernel_bytes(arch, shape)
    replaced = te_fused.fused_classes(arch, shape)
    fwd, bwd = (te_fused._fused_gemms(te_fused._on_fused(d, c, m, r), arch, shape, t)
                for d, c, m, r, t in zip(passes[:2], saved, fused, replaced, (1, 2)))
    linears = float8.converted(float8.te_linears(arch, shape, "layers.0"))
    fwd8, _ = float8.te_forward(fwd, linears, kgpu)
    bwd8 = float8.te_backward(bwd, linears, kgpu)
    for name, done in (("forward", fwd8), ("backward", bwd8)):
        print(f"== {name}: {roofline_ms(done, kgpu):.3f} ms")
        for key, ms in sorted(terms(done, kgpu).items(), key=lambda item: -item[1]):
            print(f"  {ms:8.3f}  {key}")
    print("fused rate TB/s", gpu.hbm_tbps * gpu.membound_fused_efficiency)


if __name__ == "__main__":
    main()
