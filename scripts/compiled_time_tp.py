"""torchtitan's LLaMA block under tensor and sequence parallelism (its apply_tp plan at 9dec370:
SequenceParallel norms, colwise Q/K/V/w1/w3, rowwise wo/w2 to Shard(1)), compiled by inductor on CPU
in one process over torch's fake process group: each policy's forward and backward memory-bound
bytes as inductor counts them (planner/profiler/compiled_time.py), and with --kernels every
scheduler node. Not used by the profiles: docs/published-runs.md §9.ctime says what it found.

    PYTHONPATH=. .venv/bin/python scripts/compiled_time_tp.py --tp 4 --shape 2 16 256 16 8 384 [--kernels]
"""
import argparse
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.profiler import compiled_time
from planner.profiler.compiled import rms_norm, rotary

BF16 = torch.bfloat16


class Norm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden, dtype=BF16))

    def forward(self, x):
        return rms_norm(x, self.weight)


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.head_dim = hidden // heads
        self.wq = nn.Linear(hidden, hidden, bias=False, dtype=BF16)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False, dtype=BF16)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False, dtype=BF16)
        self.wo = nn.Linear(hidden, hidden, bias=False, dtype=BF16)

    def forward(self, x, freqs):
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, freqs), rotary(k, freqs)
        rep = q.shape[2] // k.shape[2]
        k, v = (t[:, :, :, None, :].expand(batch, seq, t.shape[2], rep, self.head_dim).reshape(batch, seq, -1,
                                                                                                 self.head_dim)
                for t in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False, dtype=BF16)
        self.w2 = nn.Linear(ffn, hidden, bias=False, dtype=BF16)
        self.w3 = nn.Linear(hidden, ffn, bias=False, dtype=BF16)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn):
        super().__init__()
        self.attention_norm, self.ffn_norm = Norm(hidden), Norm(hidden)
        self.attention, self.feed_forward = Attention(hidden, heads, kv_heads), FeedForward(hidden, ffn)

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


def parallelized(block, tp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan = {  # torchtitan 9dec370 parallelize_llama.py apply_tp
        "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return parallelize_module(block, init_device_mesh("cpu", (tp,)), plan)


def main():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.checkpoint import checkpoint

    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--shape", type=int, nargs=6, default=(2, 16, 256, 16, 8, 384),
                        metavar=("B", "S", "H", "HEADS", "KV", "FFN"))
    parser.add_argument("--policies", default="none,op-sac")
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    batch, seq, hidden, heads, kv_heads, ffn = args.shape
    dist.init_process_group("fake", rank=0, world_size=args.tp, store=FakeStore())
    block = parallelized(Block(hidden, heads, kv_heads, ffn), args.tp)
    x = torch.randn(batch, seq // args.tp, hidden, dtype=BF16, requires_grad=True)  # this rank's sequence shard
    freqs = torch.randn(1, seq, 1, hidden // heads // 2, dtype=torch.complex64)
    for policy in args.policies.split(","):
        context = {"op-sac": {"context_fn": compiled_time._op_sac_context}, "full": {}}.get(policy)
        fn = block if context is None else functools.partial(checkpoint, block, use_reentrant=False, **context)
        graphs = compiled_time.compile_and_read(fn, [x, freqs])
        print(f"tp {args.tp}, shape {args.shape}, {policy}: forward, backward "
              f"{[compiled_time.memory_bound_bytes(kernels) for kernels in graphs]} B", flush=True)
        for kernels in graphs if args.kernels else ():
            for kernel in kernels:
                if kernel.memory_bound or "_c10d" in kernel.op or "mm" in kernel.op:
                    print(f"    {kernel.kind[:14]:14s} {kernel.op[:40]:40s} {kernel.reads} {kernel.writes}")


if __name__ == "__main__":
    main()
