"""Print a Megatron-Bridge recipe's MoE block on Transformer Engine's kernels (planner/profiler/te_fused.py
moe_passes): each pass's eager rest by op class, its time at each class's measured rate (what the record charges)
and at the eager mean (what it charged before §33.teclasses), and the block's record (forward, backward, reruns, ms).

usage: PYTHONPATH=<checkout> python scripts/te_moe_terms.py <recipe name under configs/megatron-bridge> <gpu>
e.g.   PYTHONPATH=$PWD python scripts/te_moe_terms.py h100_gptoss_120b_bf16 h100
"""
import sys
from pathlib import Path

from planner.models import archs
from planner.models.attention_rates import te_attention_gpu
from planner.models.configs import megatron
from planner.profiler import analytic_time, te_fused, te_mla
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    name, gpu = argv[0], archs.gpu(argv[1])
    job = megatron.read(Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge" / f"{name}.yaml")
    shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                  ep=job.ep)
    arch = job.arch
    passes = analytic_time.block_work(arch, shape, moe=True)
    record = te_fused.te_time(arch, shape, gpu, passes, moe=True)
    if record is None:
        print(f"{name}: no MoE record on Transformer Engine's kernels (te_moe.counts_moe)", file=sys.stderr)
        return 1
    kernels_gpu = te_mla.attention_gpu(gpu) if arch.mla else te_attention_gpu(gpu)
    for label, done in zip(("forward", "backward"), te_fused.moe_passes(arch, shape, passes)):
        total = sum(num for _, num in done.classed)
        by_class = {op_class: f"{num / 1e6:,.0f} MB {membound_ms(num, kernels_gpu, 'eager', op_class):.3f} ms"
                    for op_class, num in done.classed}
        print(f"{label}: eager rest {total / 1e6:,.0f} MB, at its classes' rates "
              f"{sum(membound_ms(num, kernels_gpu, 'eager', c) for c, num in done.classed):.3f} ms, at the eager mean "
              f"{membound_ms(total, kernels_gpu, 'eager'):.3f} ms (unclassed {done.unclassed_bytes} B); {by_class}")
    reruns = {part: round(ms, 3) for part, ms in record.recompute_ms.items()}
    print(f"record: forward {record.fwd_ms:.3f} ms, backward {record.bwd_ms:.3f} ms, reruns {reruns} "
          f"(EP {shape.ep}, {shape.tokens} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
