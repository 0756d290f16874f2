#!/usr/bin/env python3
"""How many times torch's split backward reruns a layer checkpointed whole: the Hugging Face config's
second pipeline layer (its first decoder block) under torch.utils.checkpoint (non-reentrant), then
torch's stage_backward_input (I) and stage_backward_weight (W), the block's forward calls counted by a
hook in each pass, beside W's parameter groups and their parameters (docs/framework-facts.md §73).
Small widths (a llama-family config: hidden_size, intermediate_size, heads): the count depends on the
block's structure, not its sizes.

    python scripts/split_reruns.py configs/hf/qwen2-1.5b.json [--hf-set KEY=VALUE ...] [--seq-len 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight  # noqa: E402

from planner.models import hfmodels  # noqa: E402
from planner.runtime.recompute import layer_runner  # noqa: E402

SMALL = ("hidden_size=64", "intermediate_size=128", "num_attention_heads=4", "num_key_value_heads=2",
         "num_hidden_layers=2", "vocab_size=128", "head_dim=16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--hf-set", action="append", default=[], help="KEY=VALUE over the small widths")
    parser.add_argument("--seq-len", type=int, default=16)
    a = parser.parse_args()
    config, _ = hfmodels.read_config(str(a.config))
    config = hfmodels.with_settings(config, (*SMALL, *a.hf_set))
    build_model, example_batch = hfmodels.model_file(config, seq_len=a.seq_len)
    torch.manual_seed(0)
    layers = build_model().pipeline_layers()
    (_, embed), (name, block) = layers[0], layers[1]
    x = embed(example_batch(1)[0]).detach().requires_grad_(True)
    calls = []
    handle = block.register_forward_pre_hook(lambda module, args: calls.append(1))
    output = layer_runner(block, "full")(x)
    weights = [p for p in block.parameters() if p.requires_grad]
    _, groups = stage_backward_input([output], [torch.ones_like(output)], [x], iter(weights))
    in_input = len(calls) - 1
    names = {id(p): n for n, p in block.named_parameters()}
    nodes = {torch.distributed.pipelining._backward._get_grad_fn_or_grad_acc(p): names[id(p)] for p in weights}
    grouped = [sorted(nodes[node] for node in group["params"]) for group in groups]
    stage_backward_weight(iter(weights), groups)
    handle.remove()
    print(f"{a.config} {name}: torch {torch.__version__}, {len(weights)} parameters in {len(groups)} groups")
    print(f"  reruns of the block's forward: I {in_input}, W {len(calls) - 1 - in_input}")
    for index, group in enumerate(grouped):
        print(f"  group {index}: {', '.join(group)}")


if __name__ == "__main__":
    main()
