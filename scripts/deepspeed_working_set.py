"""DeepSpeed ZeRO 3's coordinator on the Azure blocks (docs/published-runs.md §25.dszero3, framework-facts §105).

usage: PYTHONPATH=<checkout> python scripts/deepspeed_working_set.py [--max-reuse N] [--max-live N] [--bucket N]

For the 175B, 530B and 1T GPT blocks of §25.dsrows, all checkpointed, the coordinator simulated over the model's
blocks (planner/cost/deepspeed_zero3.simulate) at the recipes' knobs by default (run-175b.sh, run-1t.sh at
62bc4562: 3e9, 3e9, 5e7): the middle block's peak moment in its recompute and backward (the elements gathered
or in flight, the gradients held, both in 2 B: what deepspeed_terms.working_set_bytes charges), the share of the
block gathered a third time, and FSDP2's largest-layer term that the rows were charged before (8 B a parameter).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cost import deepspeed_zero3 as z3  # noqa: E402

BLOCKS = (("175B", 12288, 96), ("530B", 20480, 105), ("1T", 25600, 128))  # §25.dsrows Table 2


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-reuse", type=float, default=3e9)
    parser.add_argument("--max-live", type=float, default=3e9)
    parser.add_argument("--bucket", type=float, default=5e7)
    opts = parser.parse_args(argv)
    for name, h, layers in BLOCKS:
        block = z3.gpt_block(h, 4 * h)
        moments = z3.simulate(block, layers=layers, checkpointed=True, max_reuse_numel=int(opts.max_reuse),
                              max_live=int(opts.max_live), prefetch_bucket=int(opts.bucket))
        middle = [m for m in moments if m.layer == layers // 2 and m.phase != "forward"]
        peak = z3.peak_held(middle, weight_bytes=2, grad_bytes=2)  # both in 2 B, as the rows' fp16 run holds them
        third = z3.third_gather_share(block, middle)
        print(f"{name}: peak at the {peak.phase} of {peak.name}: {peak.gathered / 1e9:.3f}e9 gathered + "
              f"{peak.grads / 1e9:.3f}e9 gradients = {2 * (peak.gathered + peak.grads) / 2**30:.2f} GiB; "
              f"third gather {third:.3f} of the block; FSDP2's term was "
              f"{8 * sum(m.numel for m in block) / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
