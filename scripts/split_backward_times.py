#!/usr/bin/env python3
"""torch's split backward against its full backward on the bundled GPT's chunks (docs/framework-facts.md §56):
per chunk the CPU thread time (1 torch thread) of the forward F, the full backward B (torch's `stage_backward`),
and the zero-bubble schedules' input pass I (`stage_backward_input`) and weight pass W (`stage_backward_weight`);
on the first stage I runs nothing and W the whole backward, as torch's PipelineStage does (stage.py 1018-1021,
1085-1096). Medians of `--repeats` after 2.

    python scripts/split_backward_times.py [--repeats 7] [--micro-batch-size 4]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.pipelining._backward import (
    stage_backward,
    stage_backward_input,
    stage_backward_weight,
)

MODEL = Path(__file__).resolve().parent.parent / "configs" / "models" / "gpt.py"


def load_gpt():
    spec = importlib.util.spec_from_file_location("gpt", MODEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chunk_times(gpt, layers: dict, names: list[str], *, first: bool, last: bool, repeats: int,
                micro_batch_size: int) -> dict[str, float]:
    chunk = nn.Sequential(*[layers[name] for name in names])
    tokens, target = gpt.example_batch(micro_batch_size)
    got: dict[str, list[float]] = {"F": [], "B": [], "I": [], "W": []}
    for _ in range(repeats):
        for split in (False, True):
            x = tokens if first else torch.randn(micro_batch_size, gpt.SEQ, gpt.DIM, requires_grad=True)
            inputs = [] if first else [x]
            start = time.thread_time()
            out = chunk(x)
            got["F"].append(time.thread_time() - start)
            grad = None if last else torch.randn_like(out)
            if last:
                out = nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())
            start = time.thread_time()
            if not split or first:  # the full backward; torch's I on the first stage runs nothing, its W this
                stage_backward(out, grad, inputs)
                got["W" if split else "B"].append(time.thread_time() - start)
                if split:
                    got["I"].append(0.0)
            else:
                _, groups = stage_backward_input([out], None if grad is None else [grad], inputs, chunk.parameters())
                got["I"].append(time.thread_time() - start)
                start = time.thread_time()
                stage_backward_weight(chunk.parameters(), groups)
                got["W"].append(time.thread_time() - start)
            chunk.zero_grad(set_to_none=True)
    return {kind: statistics.median(values[2:]) * 1e3 for kind, values in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--micro-batch-size", type=int, default=4, help="[default: 4, what `ckplan profile` takes]")
    a = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gpt = load_gpt()
    layers = dict(gpt.build_model().pipeline_layers())
    names = list(layers)
    blocks = [name for name in names if name.startswith("blocks")]
    chunks = [([names[0], *blocks[:2]], True, False), (blocks[2:4], False, False), (blocks[4:6], False, False),
              ([*blocks[6:], names[-1]], False, True)]
    print(f"{'chunk':34} {'F':>7} {'B':>7} {'I':>7} {'W':>7} {'(I+W)/B':>8} {'I/(I+W)':>8}  (ms of CPU, 1 thread)")
    for chunk, first, last in chunks:
        t = chunk_times(gpt, layers, chunk, first=first, last=last, repeats=a.repeats,
                        micro_batch_size=a.micro_batch_size)
        both = t["I"] + t["W"]
        print(f"{','.join(chunk):34} {t['F']:7.2f} {t['B']:7.2f} {t['I']:7.2f} {t['W']:7.2f} {both / t['B']:8.3f} "
              f"{t['I'] / both:8.3f}")


if __name__ == "__main__":
    main()
