"""torchtitan's LLaMA block (planner/profiler/compiled.py llama_block, as 9dec370 writes it) run eagerly under
ckplan's own op counter (planner/profiler/fake.py OpBytes), against the analytic count (analytic_time.block_work,
whose per-element figures are Hugging Face's modules'): the eager memory-bound bytes of a pass, forward and
backward (without the accumulation into .grad, which a first backward does not run).

    PYTHONPATH=. python scripts/torchtitan_block_eager_bytes.py B S H HEADS KV_HEADS FFN   (e.g. 2 20 96 6 2 224)
"""
import functools
import sys

import torch

from planner.models import archs
from planner.profiler import analytic_time, formulas
from planner.profiler.analytic import Shape
from planner.profiler.compiled import llama_block, llama_block_inputs
from planner.profiler.fake import OpBytes


def main():
    batch, seq, hidden, heads, kv_heads, ffn = (int(x) for x in sys.argv[1:7])
    inputs = llama_block_inputs(batch=batch, seq=seq, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn)
    with OpBytes() as forward:
        out = functools.partial(llama_block, heads=heads, kv_heads=kv_heads)(*inputs)
    grad = torch.randn_like(out)
    with OpBytes() as backward:
        out.backward(grad)
    arch = archs.Arch(name="probe", hidden_size=hidden, intermediate_size=ffn, num_layers=1, num_heads=heads,
                      num_kv_heads=kv_heads, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=4096)
    shape = Shape(seq_len=seq, micro_batch_size=batch)
    fwd, bwd, _ = analytic_time.block_work(arch, shape)
    accumulate = analytic_time.ACCUMULATE * formulas.block_params(arch, shape, moe=False) * shape.d
    tokens = shape.tokens
    print(f"{tokens} tokens: torchtitan eager forward {forward.bytes:,} B ({forward.bytes / tokens:,.0f} a token), "
          f"backward {backward.bytes:,} ({backward.bytes / tokens:,.0f}); analytic forward {fwd.bytes:,} "
          f"({fwd.bytes / tokens:,.0f}), backward {bwd.bytes - accumulate:,} ({(bwd.bytes - accumulate) / tokens:,.0f})")


if __name__ == "__main__":
    main()
