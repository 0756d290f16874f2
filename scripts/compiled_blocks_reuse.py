"""Does torch.compile run every one of torchtitan's blocks compiled? torchtitan 9dec370 wraps each
TransformerBlock in checkpoint_wrapper (here with the op-level SAC policy) and then compiles each one
alone (`torch.compile(block, fullgraph=True)`, parallelize_llama.py apply_ac / apply_compile); dynamo's
cache holds 8 entries a code object, so a graph compiled per block would leave blocks past the 8th
eager. This runs N small such blocks forward and backward for two steps on CPU and prints dynamo's
counters: one unique graph and no recompile means every block reuses the one compiled graph.

    PYTHONPATH=. python scripts/compiled_blocks_reuse.py [N] [--fsdp2]     (docs/framework-facts.md §23)

--fsdp2 adds what 9dec370 applies after compiling (apply_fsdp): `fully_shard` on each compiled block (the last
not resharded after forward) and on the root, one CPU process over gloo.
"""
import sys

import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from planner.profiler.compiled import llama_block
from planner.profiler.compiled_time import _op_sac_context

HIDDEN, HEADS, KV_HEADS, FFN, SEQ = 64, 4, 2, 128, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        kv = KV_HEADS * HIDDEN // HEADS
        self.attention_norm, self.ffn_norm = nn.Parameter(torch.ones(HIDDEN)), nn.Parameter(torch.ones(HIDDEN))
        self.wq, self.wk, self.wv, self.wo = (nn.Parameter(torch.randn(n, HIDDEN) * .02) for n in (HIDDEN, kv, kv, HIDDEN))
        self.w1, self.w3 = (nn.Parameter(torch.randn(FFN, HIDDEN) * .02) for _ in range(2))
        self.w2 = nn.Parameter(torch.randn(HIDDEN, FFN) * .02)

    def forward(self, x, freqs):
        return llama_block(x, freqs, self.attention_norm, self.wq, self.wk, self.wv, self.wo, self.ffn_norm,
                           self.w1, self.w2, self.w3, heads=HEADS, kv_heads=KV_HEADS)


class Root(nn.Module):
    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layers = layers

    def forward(self, h, freqs):
        for block in self.layers:
            h = block(h, freqs)
        return h


def shard(root: Root) -> None:
    """torchtitan 9dec370 apply_fsdp on a one-rank CPU mesh."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.6.0
        from torch.distributed._composable.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,))
    for index, block in enumerate(root.layers):
        fully_shard(block, mesh=mesh, reshard_after_forward=index < len(root.layers) - 1)
    fully_shard(root, mesh=mesh)


def main():
    args = [arg for arg in sys.argv[1:] if arg != "--fsdp2"]
    num_blocks = int(args[0]) if args else 10
    root = Root(nn.ModuleList(torch.compile(checkpoint_wrapper(Block(), context_fn=_op_sac_context,
                                                               preserve_rng_state=False), fullgraph=True)
                              for _ in range(num_blocks)))
    if "--fsdp2" in sys.argv:
        shard(root)
    x = torch.randn(2, SEQ, HIDDEN, requires_grad=True)
    freqs = torch.randn(1, SEQ, 1, HIDDEN // HEADS // 2, dtype=torch.complex64)
    for _ in range(2):
        root(x, freqs).sum().backward()
    recompiles = {key: dict(value) for key, value in counters.items() if "recompil" in key}
    print(f"torch {torch.__version__}{' FSDP2' if '--fsdp2' in sys.argv else ''}: {num_blocks} blocks, "
          f"stats {dict(counters['stats'])}, recompiles {recompiles}")


if __name__ == "__main__":
    main()
