"""What is alive at each layer's backward peak in a fake profile, by the op that made it: the transient as the fake
profile counts it (autograd's fresh weight gradients in it) and in place (without them: planner/profiler/
fake_wgrad.py), each with the storages made in the backward that are alive at its peak and the fresh gradients.

    PYTHONPATH=$PWD python scripts/fake_transient_trace.py CONFIG_FOLDER [--seq-len 4096] [--micro-batch-size 1]
        [--json OUT.json]

CONFIG_FOLDER holds a Hugging Face config.json (`ckplan profile --hf-config` reads it); cut its depth to one or two
layers first. Needs `transformers` (the fake route)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

from planner.cli import cli
from planner.profiler import fake_wgrad

MIB = 1 << 20


class _Named(fake_wgrad._Logged):
    """fake_wgrad's log, each creation named by its op and pass."""

    def __init__(self) -> None:
        super().__init__()
        self.op, self.phase, self.what = None, "forward", {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.op = func.overloadpacket.__name__
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _track(self, storage, device, arg_keys) -> None:
        made = len(self.events)
        super()._track(storage, device, arg_keys)
        if len(self.events) > made:
            self.what[made] = (self.phase, self.op, self.events[made][1])


def trace(layer, x, grad) -> dict:
    """fake_wgrad.transient_parts of one layer, with what is alive at each of its two peaks."""
    memory = _Named()
    run = fake_wgrad.logged_run(layer, x, grad, memory, on_backward=lambda memory: setattr(memory, "phase", "backward"))
    kept, start, incoming, fresh, events = run.kept, run.start, run.incoming, run.fresh, run.events
    found = {"layer": type(layer).__name__, "kept": kept, "received": incoming,
             "fresh": [memory.what[born] for born in sorted(fresh)]}
    for name, skip in (("transient", set()), ("in_place", fresh)):
        alive = {}
        for born, change in events[:start]:
            if change > 0:
                alive[born] = change
            else:
                alive.pop(born, None)
        live = peak = kept
        at = dict(alive)
        for born, change in events[start:]:
            if born in skip:
                continue
            if change > 0:
                alive[born] = change
            else:
                alive.pop(born, None)
            live += change
            if live > peak:
                peak, at = live, dict(alive)
        found[name] = {"bytes": peak - kept + incoming,
                       "made_in_backward": [memory.what[born] for born in sorted(at) if born >= start]}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="a folder with a Hugging Face config.json")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found, real = [], fake_wgrad.transient_parts

    def traced(layer, x, grad):
        found.append(trace(layer, x, grad))
        return real(layer, x, grad)

    fake_wgrad.transient_parts = traced
    try:
        with tempfile.TemporaryDirectory() as work:
            result = CliRunner().invoke(cli, ["profile", "--hf-config", str(args.config), "--fake", "--seq-len",
                                              str(args.seq_len), "--micro-batch-size", str(args.micro_batch_size),
                                              "--out", str(Path(work) / "f.json")])
    finally:
        fake_wgrad.transient_parts = real
    if result.exit_code:
        print(result.output.strip().splitlines()[-1])
        return 1
    for layer in found:
        print(f"## {layer['layer']}: kept {layer['kept']:,}, received {layer['received']:,}")
        for name in ("transient", "in_place"):
            peak = layer[name]
            big = [f"{op} {size:,}" for _, op, size in peak["made_in_backward"] if size >= MIB]
            print(f"- {name} {peak['bytes']:,}: made in the backward, alive at its peak (1 MiB or more): "
                  + ", ".join(big))
        print("- fresh weight gradients (1 MiB or more): "
              + ", ".join(f"{op} {size:,}" for _, op, size in layer["fresh"] if size >= MIB))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
