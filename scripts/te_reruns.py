"""Each recompute option's rerun of a profile's blocks, as the profile records it (the eager passes) and under
--runtime megatron (on Transformer Engine's fused kernels: planner/cost/fusedkernels.py, te_rerun.py).

    PYTHONPATH=$PWD python scripts/te_reruns.py PROFILE.json [--layer layers.0 --layer layers.1] [--only a,b]

Prints one line per option: its name, the profile's rerun in ms and the rerun Megatron's kernels give it, and
the layer's full rerun and forward on those kernels for comparison. Reads the profile; writes nothing.
"""

from __future__ import annotations

import argparse

from planner import io
from planner.cost import fusedkernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--layer", action="append", help="a layer's name (default: the first block of each kind)")
    parser.add_argument("--only", help="option names separated by '/' (e.g. full/mla-up,mlp,norm-out)")
    args = parser.parse_args()
    profile = io.load_profile(args.profile)
    timed = fusedkernels.fused_profile(profile, "transformer-engine")
    blocks = fusedkernels.blocks(profile)
    names = args.layer or list({layer.kind: layer.name for layer in reversed(blocks)}.values())[::-1]
    wanted = set(args.only.split("/")) if args.only else None
    by_name = {layer.name: (layer, te) for layer, te in zip(profile.layers, timed.layers)}
    for name in names:
        if name not in by_name:
            raise SystemExit(f"no layer {name!r} in {args.profile}")
        layer, te = by_name[name]
        print(f"{name} ({layer.kind}): TE forward {te.fwd_ms:.3f} ms, full rerun {te.recompute_ms:.3f} "
              f"(eager {layer.recompute_ms:.3f})" if layer.recompute_ms is not None else f"{name} ({layer.kind})")
        for eager, fused in zip(layer.recompute_options, te.recompute_options):
            if wanted is None or eager.name in wanted:
                print(f"  {eager.name:40s} eager {eager.recompute_ms:8.3f}  megatron {fused.recompute_ms:8.3f}")


if __name__ == "__main__":
    main()
