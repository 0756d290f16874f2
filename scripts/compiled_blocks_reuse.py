"""Does torch.compile run every one of torchtitan's blocks compiled? torchtitan 9dec370 wraps each
TransformerBlock in checkpoint_wrapper (here with the op-level SAC policy) and then compiles each one
alone (`torch.compile(block, fullgraph=True)`, parallelize_llama.py apply_ac / apply_compile); dynamo's
cache holds 8 entries a code object, so a graph compiled per block would leave blocks past the 8th
eager. This runs N small such blocks forward and backward for two steps on CPU and prints dynamo's
counters: one unique graph and no recompile means every block reuses the one compiled graph.

    PYTHONPATH=. python scripts/compiled_blocks_reuse.py [N]     (docs/framework-facts.md §22)

FSDP2's hooks, which 9dec370 adds after compiling, are not part of it.
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


def main():
    num_blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    blocks = [torch.compile(checkpoint_wrapper(Block(), context_fn=_op_sac_context, preserve_rng_state=False),
                            fullgraph=True) for _ in range(num_blocks)]
    x = torch.randn(2, SEQ, HIDDEN, requires_grad=True)
    freqs = torch.randn(1, SEQ, 1, HIDDEN // HEADS // 2, dtype=torch.complex64)
    for _ in range(2):
        h = x
        for block in blocks:
            h = block(h, freqs)
        h.sum().backward()
    recompiles = {key: dict(value) for key, value in counters.items() if "recompil" in key}
    print(f"torch {torch.__version__}: {num_blocks} blocks, stats {dict(counters['stats'])}, recompiles {recompiles}")


if __name__ == "__main__":
    main()
