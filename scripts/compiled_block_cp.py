"""torchtitan 9dec370's compiled, fully checkpointed block under context parallelism, as inductor writes it (CPU).

scripts/compiled_block_backward.py's block (9dec370's TransformerBlock at the widths given, TP by 9dec370's block
plan, Float8 by torchao, AsyncTP by inductor's micro-pipeline pass, `checkpoint_wrapper` then
`torch.compile(block, fullgraph=True)`), with context parallelism as 9dec370's train context runs it: a fresh
`context_parallel(cp mesh)` around the step, which in torch 2.6.0 monkey-patches F.scaled_dot_product_attention
(`_distribute_function`, experimental/_attention.py 868-922) so the query, key and value become DTensors sharded on
the sequence and the flash op reaches the ring (`_scaled_dot_product_ring_flash_attention`, the all-gather rotater
by default, load balancing on: 58-59). dynamo traces the ring into the block's one graph (fullgraph=True; no graph
break at CP 2-8, docs/framework-facts.md §30, §456), so the ring's buffers are the wrappers' buffers.

One process on torch's `fake` process group of CP x TP ranks, as rank (cp - 1) x tp: the CP rank cp - 1 (the ring's
busiest, every later step `i <= rank`, planner/cost/cpring.py's) and TP rank 0. The fake group's collectives fill
nothing; the wrappers' buffers are inductor's at compile time. The ring calls the CUDA flash op, which has no CPU
kernel: scripts/cp_compile_ring.py registers CPU kernels for it and its backward and points F.sdpa at it, as imported
here. The wrappers land in TORCH_COMPILE_DEBUG_DIR (printed first); scripts/compiled_block_record.py reads them. The
run can be stopped once both wrappers are written (the backward is compiled with the forward):

    PYTHONPATH=.:<torchao eab345c> <torch 2.6.0>/python scripts/compiled_block_cp.py --cp 8 --tp 8 --float8 \\
        --async-tp --dims 2048,128,8,16,6656,4096

--dims: hidden, heads, kv heads, head dim, FFN, tokens of one CP rank (the sequence over cp)."""
import argparse
import os
import sys
import tempfile

DEBUG = tempfile.mkdtemp(prefix="compiled_block_cp_")
os.environ.setdefault("TORCH_COMPILE_DEBUG", "1")
os.environ.setdefault("TORCH_COMPILE_DEBUG_DIR", DEBUG)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compiled_block_backward as blocks  # noqa: E402
import cp_compile_ring  # noqa: E402, F401  (CPU kernels for the CUDA flash ops; F.sdpa calls the flash op)
import torch  # noqa: E402


def parallelize(block, cp: int, tp: int, float8: bool, overlap: bool):
    """9dec370's block plan on the mesh's TP dimension (compiled_block_backward.parallelize's, on a CP x TP mesh of
    the fake group at CP rank cp - 1); returns the CP dimension's mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=(cp - 1) * tp, world_size=cp * tp, store=FakeStore())
    mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
    plan = blocks.block_plan(float8)
    if tp > 1:
        block.attention.n_heads //= tp
        block.attention.n_kv_heads //= tp
        parallelize_module(block, mesh["tp"], plan)
        if overlap:
            blocks.async_tp()
    return mesh["cp"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--float8", action="store_true")
    parser.add_argument("--async-tp", action="store_true")
    parser.add_argument("--dims", default="2048,128,8,16,6656,4096")
    args = parser.parse_args()
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.tensor.experimental import context_parallel

    dim, heads, kv_heads, head_dim, hidden, tokens = (int(v) for v in args.dims.split(","))
    torch.manual_seed(0)
    block = blocks.Block(dim, heads, kv_heads, head_dim, hidden).to(torch.bfloat16)
    if args.float8:
        blocks.cpu_scaled_mm()
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(block)
    cp_mesh = parallelize(block, args.cp, args.tp, args.float8, args.async_tp)
    block = checkpoint_wrapper(block, preserve_rng_state=False)  # 9dec370's full AC
    x = torch.randn(1, tokens // args.tp, dim, dtype=torch.bfloat16, requires_grad=True)
    print(f"compile debug folder: {os.environ['TORCH_COMPILE_DEBUG_DIR']}", flush=True)
    compiled = torch.compile(block, fullgraph=True)
    with context_parallel(cp_mesh):
        compiled(x).sum().backward()
    print("done", flush=True)


if __name__ == "__main__":
    main()
