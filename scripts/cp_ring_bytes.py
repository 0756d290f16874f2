"""The memory-bound bytes torch's context-parallel ring adds to torchtitan 9dec370's compiled block, read off
inductor's own kernels (issue 35, cpring; planner/cost/contextparallel.py ring_bytes).

The block, wrapping and train context are scripts/cp_ring_order.py's (9dec370's checkpoint_wrapper, then
torch.compile(block, fullgraph=True) by inductor, sdpa_kernel([FLASH, EFFICIENT]) and context_parallel with the
allgather rotater, K/V repeated to the query heads), LLaMA 3 8B's head proportions (32 query heads over 8 K/V
heads). Each generated graph's scheduler nodes after fusion are read with planner.profiler.compiled_time's
inductor_kernels (inductor's own per-buffer byte estimate, get_read_write_buffers_sizes in torch 2.6.0), and the
memory-bound ones summed (not the flash calls, matmuls, collectives or views). Run once with --no-cp on one
process (the block without CP at the same tokens a rank) and once per CP degree; the difference is what the ring
adds per graph: forward, and backward (which under full AC reruns the forward's ring before its own). Printed
beside contextparallel.ring_bytes (compiled) at the same shape, per rank, in bytes. Written for the torch 2.6.0
wheel (the release nearest the runs' torch 1963fc8):

    PYTHONPATH=. torchrun --nproc-per-node 1 scripts/cp_ring_bytes.py --no-cp [--tokens T]
    PYTHONPATH=. torchrun --nproc-per-node N scripts/cp_ring_bytes.py [--tokens T]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cp_compile_ring as block_def  # noqa: E402  (registers CPU kernels for the CUDA flash ops, patches F.sdpa)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402

from planner.cost import contextparallel  # noqa: E402
from planner.cost.layers import ExchangeCost  # noqa: E402
from planner.profiler.compiled_time import inductor_kernels, memory_bound_bytes  # noqa: E402


def ring_formula(cp: int, tokens: int) -> tuple[float, float]:
    """contextparallel.ring_bytes (compiled) at this block's shape: (forward, backward with the rerun's ring)."""
    q_bytes = tokens * block_def.HEADS * block_def.HEAD_DIM * 2
    moved = ExchangeCost(ranks=cp, q_bytes=q_bytes, kv_bytes=2 * q_bytes, attention_fwd_ms=0.0, attention_bwd_ms=0.0)
    forward = contextparallel.ring_bytes(moved, "forward", True)
    return forward, forward + contextparallel.ring_bytes(moved, "backward", True)


ORIGINS = []


def record_origins():
    """Beside inductor_kernels: per graph, each scheduler node's name, bytes and the aten ops fused into it."""
    from torch._inductor.graph import GraphLowering
    original = GraphLowering.codegen

    def codegen(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        listed = []
        for node in self.scheduler.nodes:
            parts = node.get_nodes() if hasattr(node, "get_nodes") else [node]
            ops = sorted({str(o.target).split(".")[-2] if "." in str(o.target) else str(o.target)
                          for part in parts for o in getattr(part.node, "origins", ()) if o.op == "call_function"})
            listed.append((node.get_name(), node.get_read_write_buffers_sizes(), ops))
        ORIGINS.append(listed)
        return out

    GraphLowering.codegen = codegen


def memory_bound_names(graphs, kind):
    return {k.name for k in graphs[0 if kind == "forward" else 1] if k.memory_bound}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cp", action="store_true", help="the block without context_parallel")
    parser.add_argument("--tokens", type=int, default=256, help="tokens a rank")
    parser.add_argument("--head-dim", type=int, default=64, help="head dim (32 query heads, 8 K/V heads)")
    parser.add_argument("--kernels", action="store_true", help="also list every memory-bound kernel of the last rank")
    args = parser.parse_args()
    block_def.HEADS, block_def.KV_HEADS, block_def.LAYERS = 32, 8, 1
    block_def.HEAD_DIM, block_def.DIM = args.head_dim, 32 * args.head_dim
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    rank, world, mesh, model = block_def.ring_ranks(args.tokens)
    seq = args.tokens * world
    set_rotate_method("allgather")
    x, labels = (torch.randn(1, seq, block_def.DIM, dtype=torch.bfloat16) for _ in range(2))
    if args.kernels:
        record_origins()
    with inductor_kernels() as graphs:
        for name, block in list(model.layers.named_children()):  # 9dec370's apply_ac, then apply_compile
            model.layers.register_module(name, torch.compile(checkpoint_wrapper(block, preserve_rng_state=False),
                                                             fullgraph=True))
        block_def.train_step(model, mesh, x, labels, cp=not args.no_cp)
    measured = [memory_bound_bytes(kernels) for kernels in graphs]
    kernels = [sum(k.memory_bound for k in g) for g in graphs]
    for r in range(world):
        if r == rank:
            print(json.dumps({"cp": 1 if args.no_cp else world, "rank": rank, "tokens": args.tokens, "head_dim": args.head_dim,
                              "torch": torch.version.git_version[:8], "forward_bytes": measured[0],
                              "backward_bytes": measured[1], "forward_kernels": kernels[0],
                              "backward_kernels": kernels[1],
                              "formula": None if args.no_cp else ring_formula(world, args.tokens)}))
            if args.kernels and rank == world - 1:
                for kind, listed in zip(("forward", "backward"), ORIGINS):
                    print(kind, [entry for entry in listed if entry[0] in memory_bound_names(graphs, kind)])
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
