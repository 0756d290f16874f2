"""Each recompute option of a profile's blocks under --runtime megatron, in bf16 and under --float8 (Transformer
Engine's current scaling): its rerun in ms and its kept bytes a microbatch, as the cost model charges them
(planner/cost/float8.py float8_profile; the FP8 reruns: planner/profiler/te_rerun.py float8_parts; the kept
bytes: planner/cost/te_float8_kept.py).

    PYTHONPATH=$PWD python scripts/te_float8_options.py PROFILE.json [--only none/mlp/core-attn,mlp]

Prints, for the first block of each kind, one line per option. Reads the profile; writes nothing.
"""

from __future__ import annotations

import argparse

from planner import io
from planner.cost.float8 import float8_profile
from planner.schema import TrainSetup


def _setup(profile, float8: bool) -> TrainSetup:
    mbs = profile.assumptions.get("micro_batch_size", 1)
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=mbs, mem_caps_bytes=[2**50],
                      precision="bf16-mixed", runtime="megatron", float8=float8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--only", help="option names separated by '/' (e.g. none/mlp/core-attn,mlp)")
    args = parser.parse_args()
    profile = io.load_profile(args.profile)
    bf16, fp8 = float8_profile(profile, _setup(profile, False)), float8_profile(profile, _setup(profile, True))
    wanted = set(args.only.split("/")) if args.only else None
    seen = set()
    for plain, eight in zip(bf16.layers, fp8.layers):
        if plain.kind not in ("decoder_block", "moe_block") or plain.kind in seen:
            continue
        seen.add(plain.kind)
        print(f"{plain.name} ({plain.kind}): forward {plain.fwd_ms:.3f} -> {eight.fwd_ms:.3f} ms under FP8, "
              f"backward {plain.bwd_ms:.3f} -> {eight.bwd_ms:.3f}")
        for one, other in zip(plain.recompute_options, eight.recompute_options):
            if wanted is None or one.name in wanted:
                print(f"  {one.name:28s} rerun {one.recompute_ms:7.3f} -> {other.recompute_ms:7.3f} ms   kept "
                      f"{one.kept_bytes / 2**20:9.2f} -> {other.kept_bytes / 2**20:9.2f} MiB")


if __name__ == "__main__":
    main()
