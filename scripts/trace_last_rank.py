"""The device trace that settles §35.c7sizes: torch's own request sizes on a last pipeline rank's step, read off the
caching allocator's history (`torch.cuda.memory._record_memory_history`), to set beside
scripts/large_requests.py's list of the same shape. Skips (exit 0, one line) without CUDA.

One GPU, no process group: a LLaMA-style stage as torchtitan 9dec370's model code makes it (torchtitan/models/
llama/model.py: RMSNorm in eager fp32, rotary in complex64, repeat_kv's expand-reshape copies, SDPA's flash kernel,
SwiGLU), each block under torch.utils.checkpoint, then the final norm, the output linear and the loss
(`cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`, train.py), forward and backward, STEPS times.
The sizes are the model's and the loss's at the shape given; FSDP2's, TP's and CP's buffers need a process group
and are not made here (their sizes are products read from torch's code: the section's table).

usage: [TOKENS=4096] [HIDDEN=2048] [FFN=6656] [HEADS=16] [KV_HEADS=1] [VOCAB=16032] [BLOCKS=2] [STEPS=2]
       [BIG_MIB=16] [SNAPSHOT=out.pickle] python scripts/trace_last_rank.py
prints each distinct request of BIG_MIB or more (bytes as requested and as the allocator's block), how many a
step, and the frame that made it; SNAPSHOT writes the allocator's snapshot (torch.cuda.memory._snapshot) for
pytorch.org/memory_viz."""

from __future__ import annotations

import collections
import os
import pickle
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

ENV = {
    name: int(os.environ.get(name, default))
    for name, default in dict(
        TOKENS=4096,
        HIDDEN=2048,
        FFN=6656,
        HEADS=16,
        KV_HEADS=1,
        VOCAB=16032,
        BLOCKS=2,
        STEPS=2,
        BIG_MIB=16,
    ).items()
}


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """torchtitan 9dec370 norms.py RMSNorm: `self._norm(x.float()).type_as(x) * self.weight`."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * weight


def rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """torchtitan 9dec370 model.py apply_rotary_emb: the fp32 view as complex64, times the table, back."""
    pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(3).type_as(t)


class Block(torch.nn.Module):
    def __init__(self, h: int, f: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.wq, self.wk, self.wv, self.wo = (
            linear(h, h),
            linear(h, kv_heads * self.hd),
            linear(h, kv_heads * self.hd),
            linear(h, h),
        )
        self.w1, self.w2, self.w3 = linear(h, f), linear(f, h), linear(h, f)
        self.n1, self.n2 = torch.nn.Parameter(torch.ones(h)), torch.nn.Parameter(torch.ones(h))

    def attention(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, self.heads, self.hd)
        xk = self.wk(x).view(b, s, self.kv_heads, self.hd)
        xv = self.wv(x).view(b, s, self.kv_heads, self.hd)
        xq, xk = rotary(xq, freqs), rotary(xk, freqs)
        rep = self.heads // self.kv_heads
        keys = (
            xk[:, :, :, None, :]
            .expand(b, s, self.kv_heads, rep, self.hd)
            .reshape(b, s, self.heads, self.hd)
        )
        values = (
            xv[:, :, :, None, :]
            .expand(b, s, self.kv_heads, rep, self.hd)
            .reshape(b, s, self.heads, self.hd)
        )
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(rms_norm(x, self.n1), freqs)
        y = rms_norm(h, self.n2)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


def main() -> int:
    if not torch.cuda.is_available():
        print("trace_last_rank: no CUDA device here; skipped (run it on a GPU)")
        return 0
    e, dev = ENV, torch.device("cuda")
    torch.manual_seed(0)
    blocks = [
        Block(e["HIDDEN"], e["FFN"], e["HEADS"], e["KV_HEADS"]).to(dev, torch.bfloat16)
        for _ in range(e["BLOCKS"])
    ]
    norm = torch.nn.Parameter(torch.ones(e["HIDDEN"], device=dev, dtype=torch.bfloat16))
    output = torch.nn.Linear(e["HIDDEN"], e["VOCAB"], bias=False).to(dev, torch.bfloat16)
    hd = e["HIDDEN"] // e["HEADS"]
    angles = torch.outer(
        torch.arange(e["TOKENS"], device=dev).float(),
        1.0 / 500000 ** (torch.arange(0, hd, 2, device=dev).float() / hd),
    )
    freqs = torch.polar(torch.ones_like(angles), angles).view(1, e["TOKENS"], 1, hd // 2)
    x0 = torch.randn(
        1, e["TOKENS"], e["HIDDEN"], device=dev, dtype=torch.bfloat16, requires_grad=True
    )
    labels = torch.randint(0, e["VOCAB"], (1, e["TOKENS"]), device=dev)
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    for _ in range(e["STEPS"]):
        h = x0
        for block in blocks:
            h = checkpoint(block, h, freqs, use_reentrant=False)
        pred = output(rms_norm(h, norm))
        loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
        loss.backward()
        del pred, loss, h
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if os.environ.get("SNAPSHOT"):
        with open(os.environ["SNAPSHOT"], "wb") as f:
            pickle.dump(snapshot, f)
    big, seen = e["BIG_MIB"] * 2**20, collections.Counter()
    where: dict[tuple[int, int], str] = {}
    for trace in snapshot["device_traces"]:
        for event in trace:
            if event["action"] == "alloc" and event["size"] >= big:
                frames = [
                    f"{fr['filename'].rsplit('/', 1)[-1]}:{fr['line']} {fr['name']}"
                    for fr in event.get("frames", [])
                    if "torch/" not in fr["filename"] or "checkpoint" in fr["filename"]
                ]
                key = (event.get("requested_size", event["size"]), event["size"])
                seen[key] += 1
                where.setdefault(key, frames[0] if frames else "?")
    for (requested, block), count in sorted(seen.items()):
        print(
            f"{requested:>14,d} B requested {block:>14,d} B block  x{count / e['STEPS']:.1f} a step  {where[(requested, block)]}"
        )
    print(
        f"max_memory_allocated {torch.cuda.max_memory_allocated():,d} B, max_memory_reserved {torch.cuda.max_memory_reserved():,d} B"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
