"""The job the MoE scripts read (scripts/moe_block_terms.py, moe_eager_terms.py, moe_host_budget.py): a Megatron-LM
flags file and a GPU name, the flags a mixture of experts."""
import sys
from pathlib import Path

from planner.errors import UserError
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler.formulas import Shape


def read(argv: list[str], script: str):
    """(job, gpu, shape) of `FLAGS.yaml GPU` at the job's microbatch, TP, SP, CP and EP; None after one sentence on
    stderr (the caller exits 2)."""
    if len(argv) != 2:
        sys.stderr.write(f"usage: {script} FLAGS.yaml GPU\n")
        return None
    try:
        job, gpu = megatron.read(Path(argv[0])), archs.gpu(argv[1])
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return None
    if not job.arch.num_experts:
        sys.stderr.write(f"{argv[0]}: no --num-experts: not a mixture of experts\n")
        return None
    return job, gpu, Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp,
                           cp=job.cp, ep=job.ep)
