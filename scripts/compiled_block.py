"""A torchtitan LLaMA block's saved tensors under torch.compile, from AOTAutograd's partition at
full size (FakeTensorMode: no memory), beside the analytic profile's compiled formula
(planner/profiler/compiled_kept.py) and its eager figures (analytic_kept.py, opsac.py).

    PYTHONPATH=. .venv/bin/python scripts/compiled_block.py [--arch llama3-8b] [--seq-len 8192] [--micro-batch-size 2]
"""
import argparse

from planner.models import archs
from planner.profiler import analytic, opsac
from planner.profiler.analytic import Shape
from planner.profiler.compiled import POLICIES, partition_llama_block
from planner.profiler.compiled_kept import compiled_kept_bytes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="llama3-8b")
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    args = parser.parse_args()
    arch = archs.ARCHS[args.arch]
    shape = Shape(seq_len=args.seq_len, micro_batch_size=args.micro_batch_size)
    tokens = shape.tokens
    formula = compiled_kept_bytes(arch, shape, moe=False)
    boundary = analytic.boundary_bytes(arch, shape)
    eager = {"none": sum(t.num_bytes for t in analytic.block_terms(arch, shape)), "full": boundary,
             "op-sac": opsac.op_sac_kept_bytes(arch, shape, boundary)}
    print(f"{arch.name}, {args.micro_batch_size} x {args.seq_len} tokens, bf16: bytes per token kept for backward")
    for policy in POLICIES:
        found = partition_llama_block(batch=args.micro_batch_size, seq=args.seq_len, hidden=arch.hidden_size,
                                      heads=arch.num_heads, kv_heads=arch.num_kv_heads, ffn=arch.intermediate_size,
                                      policy=policy)
        print(f"  {policy:7s} partition {found.saved_bytes / tokens:10,.1f}  formula {formula[policy] / tokens:10,.1f}"
              f"  eager {eager[policy] / tokens:10,.1f}  ({found.saved_bytes / 2**30:.3f} GiB per block; saved: "
              f"{', '.join(found.saved)}; the backward graph's peak beyond them before fusion "
              f"{found.backward_extra_bytes / tokens:,.0f} B per token)", flush=True)


if __name__ == "__main__":
    main()
