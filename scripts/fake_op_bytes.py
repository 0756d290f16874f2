"""The bytes each aten op moves in one decoder layer of a Hugging Face config under `ckplan profile --fake`,
forward and backward, as the fake profile's OpBytes counts them (planner/profiler/fake.py `_moved_bytes`,
views and allocations moving nothing; matmuls and attention kernels shown beside, timed by their FLOPs):
where a fake block's memory-bound time differs from the analytic count, op by op.

    PYTHONPATH=$PWD python scripts/fake_op_bytes.py CONFIG.json [--seq-len 4096] [--layer 0] [--gpu h100] [--top 25]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planner.models import archs
from planner.profiler import device_attention, fake, fake_mode
from planner.profiler.storages import counted_as


class _PerOp(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.moved: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        made = fake._tensors(out)
        packet = func.overloadpacket
        if made and packet not in fake.NO_TRAFFIC and not fake._aliases(func):
            self.moved[str(packet)] += fake._moved_bytes(packet, args, kwargs, made)
        return out


def op_bytes(config: dict, *, seq_len: int, layer: int, gpu: str) -> tuple[Counter, Counter]:
    """(forward, backward) bytes by aten op of layers.`layer`."""
    model, layers, batch, mode = fake_mode.hf_model_on_meta(config, seq_len=seq_len)
    with mode, counted_as("cuda"), device_attention.device_attention("cuda", archs.gpu(gpu), layers):
        fake_mode.fake_module(model, mode)
        x = fake_mode.fake_tensor(batch(1)[0], mode)
        for _, module in layers[:layer + 1]:
            x = module(x).detach()
        x = x.requires_grad_(True)
        with _PerOp() as forward:
            out = layers[layer + 1][1](x)
        with _PerOp() as backward:
            out.backward(torch.zeros_like(out))
    return forward.moved, backward.moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    forward, backward = op_bytes(json.loads(args.config.read_text()), seq_len=args.seq_len, layer=args.layer,
                                 gpu=args.gpu)
    for name, moved in (("forward", forward), ("backward", backward)):
        print(f"{name}: {sum(moved.values()):,} B")
        for op, n in moved.most_common(args.top):
            print(f"  {n:>14,}  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
