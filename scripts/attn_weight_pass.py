"""The split backward's W under `attn` (the attention module checkpointed whole), analytic against fake, with
the fake's reruns in W charged at the rates their ops have in I (docs/framework-facts.md §87).

The fake profile's counters class the rerun's rotary bytes `attention` in I and `elementwise` in W (W's
reruns run with no module of the block entered); the analytic W charges them as in I. Adding back
groups x (the rerun's attention-class bytes at the attention rate - at the elementwise rate) to the fake's W
puts both on the same classes. Reads what scripts/analytic_vs_fake.py wrote with --json:

    PYTHONPATH=$PWD python scripts/analytic_vs_fake.py CONFIG.json --seq-len 1024 --gpu h100-sxm --json out.json
    PYTHONPATH=$PWD python scripts/attn_weight_pass.py out.json CONFIG.json --seq-len 1024 --gpu h100-sxm [--set K=V ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.models.archconfig import from_hf_config
from planner.models.gpus import gpu as gpu_named
from planner.profiler import analytic_split, analytic_time
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms


def corrected(found: dict, config: dict, *, name: str, seq_len: int, micro_batch_size: int, gpu_name: str) -> list[str]:
    """A line per option with `attn` among its parts: W analytic / fake, as recorded and with the fake's
    reruns' attention-class bytes at the attention rate."""
    arch = from_hf_config(config, where=name, name=name)
    gpu = gpu_named(gpu_name)
    rerun = analytic_time.rerun_work(arch, Shape(seq_len=seq_len, micro_batch_size=micro_batch_size), "attn")
    moved = dict(rerun.classed).get("attention", 0)
    per_rerun = membound_ms(moved, gpu, "eager", "attention") - membound_ms(moved, gpu, "eager", "elementwise")
    added = analytic_split.attention_groups(arch) * per_rerun
    first = next(option["layer"] for option in found["options"])
    lines = []
    for option in found["options"]:
        if option["layer"] != first or "attn" not in option["option"].split(","):
            continue
        weight = option["weight_grad_ms"]
        if weight["analytic"] is None or weight["fake"] is None:
            continue
        lines.append(f"| {name} | {option['option']} | {weight['analytic']:.4f} / {weight['fake']:.4f} "
                     f"({weight['analytic'] / weight['fake']:.3f}) | {weight['analytic'] / (weight['fake'] + added):.3f} "
                     f"(+{added:.4f} ms) |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("found", type=Path, help="scripts/analytic_vs_fake.py's --json output")
    parser.add_argument("configs", nargs="+", type=Path, help="the Hugging Face config.json files it compared")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    found = json.loads(args.found.read_text())
    print("| model | option | W ms a / f (ratio) | with the fake's W reruns at I's classes |\n|---|---|---|---|")
    for path in args.configs:
        config = json.loads(path.read_text())
        for setting in args.set:
            key, _, value = setting.partition("=")
            try:
                config[key] = json.loads(value)
            except json.JSONDecodeError:
                config[key] = value
        if "options" not in found.get(path.stem, {}):
            continue
        print("\n".join(corrected(found[path.stem], config, name=path.stem, seq_len=args.seq_len,
                                  micro_batch_size=args.micro_batch_size, gpu_name=args.gpu)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
