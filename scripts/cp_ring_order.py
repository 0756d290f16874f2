"""Where inductor puts torch's context-parallel exchanges and their waits in torchtitan 9dec370's compiled block
(issue 35, cp8; docs/framework-facts.md §37).

The same block, wrapping and train context as scripts/cp_compile_ring.py (9dec370's checkpoint_wrapper, then
torch.compile(block, fullgraph=True), inside sdpa_kernel([FLASH, EFFICIENT]) and a fresh context_parallel each
step, rotate method allgather), here with LLaMA 3 8B's head proportions (32 query heads, 8 K/V heads repeated to
32, heads x head dim = dim) and compiled by inductor itself (the default backend torchtitan runs), one CPU process
per CP rank over gloo. It prints, per rank and per compiled graph, the order in which inductor's generated code
calls the ring's pieces:

    F   a flash attention call (a ring step's forward; the rerun's under full AC)
    FB  a flash attention backward call
    AG  _c10d_functional.all_gather_into_tensor (K/V, once a pass)
    A2A _c10d_functional.all_to_all_single (the fp32 dK/dV passed to the next rank)
    W   _c10d_functional.wait_tensor (the compute stream waits for the collective)
    mm  a matmul; .  one or more fused pointwise kernels

An exchange overlaps compute only where a call sits between its collective and its W. Written for the torch 2.6.0
wheel (the release nearest the runs' torch 1963fc8):

    torchrun --nproc-per-node N scripts/cp_ring_order.py [--tokens T] 2>/dev/null   (stderr: inductor's code log)
"""
import argparse
import logging
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cp_compile_ring as block_def  # noqa: E402  (registers CPU kernels for the CUDA flash ops, patches F.sdpa)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402

CODES = []


class _Capture(logging.Handler):
    def emit(self, record):
        CODES.append(record.getMessage())


def calls(code: str) -> str:
    """The order of the ring's calls in one generated module's `call` function."""
    body = code.split("def call(args):", 1)[1] if "def call(args):" in code else ""
    body = re.split(r"\n(?:def |class |async_compile\.wait)", body, maxsplit=1)[0]
    out = []
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "del ", "assert")):
            continue
        for key, name in (("all_gather_into_tensor", "AG"), ("all_to_all_single", "A2A"), ("wait_tensor", "W"),
                          ("flash_attention_backward.default(", "FB"), ("_scaled_dot_product_flash_attention.default", "F")):
            if key in line:
                out.append(name)
                break
        else:
            if re.search(r"extern_kernels\.(mm|bmm|addmm)", line):
                out.append("mm")
            elif re.match(r"cpp_fused_\w+\(", line) or ".run(" in line:
                out.append(".")
    return re.sub(r"(\. )+", ". ", " ".join(out) + " ").strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128, help="tokens a rank")
    args = parser.parse_args()
    block_def.HEADS, block_def.KV_HEADS, block_def.HEAD_DIM, block_def.DIM, block_def.LAYERS = 32, 8, 8, 256, 1
    torch._logging.set_logs(output_code=True)
    import torch._inductor.graph as inductor_graph
    inductor_graph.output_code_log.addHandler(_Capture())  # torch._inductor.codecache.__output_code in 2.6.0
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    rank, world, mesh, model = block_def.ring_ranks(args.tokens)
    seq = args.tokens * world
    for name, block in list(model.layers.named_children()):  # 9dec370's apply_ac, then apply_compile
        model.layers.register_module(name, torch.compile(checkpoint_wrapper(block, preserve_rng_state=False),
                                                         fullgraph=True))
    set_rotate_method("allgather")
    x, labels = (torch.randn(1, seq, block_def.DIM, dtype=torch.bfloat16) for _ in range(2))
    block_def.train_step(model, mesh, x, labels)
    graphs = [calls(code) for code in CODES if "def call(args):" in code]
    for r in range(world):
        if r == rank:
            print(f"rank {rank} of {world}, torch {torch.__version__} ({torch.version.git_version[:8]}), "
                  f"{args.tokens} tokens a rank")
            for kind, order in zip(("forward", "backward"), graphs):
                print(f"  {kind}: {order}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
