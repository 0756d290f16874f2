"""Per layer variant of a profile's decoder blocks: the layers' own forward / backward, what the cost model charges
(layers.layer_costs), and the kind's mean (what it charged before variants, docs/published-runs.md §41.gemmakind);
then the range of a stage of 1-6 contiguous blocks' charge over its own time under the mean, and now.

    PYTHONPATH=$PWD python scripts/variant_costs.py PROFILE.json
"""

from __future__ import annotations

import sys
from statistics import fmean

from planner import io
from planner.cost.layers import layer_costs


def main(path: str) -> None:
    profile = io.load_profile(path)
    blocks = [(layer, cost) for layer, cost in zip(profile.layers, layer_costs(profile)) if layer.kind == "decoder_block"]
    mean_fwd, mean_bwd = fmean(x.fwd_ms for x, _ in blocks), fmean(x.bwd_ms for x, _ in blocks)
    for variant in sorted({x.variant or "" for x, _ in blocks}):
        layer, cost = next((x, c) for x, c in blocks if (x.variant or "") == variant)
        print(f"{variant or '(none)'}: own {layer.fwd_ms:.2f} / {layer.bwd_ms:.2f} ms, charged {cost.fwd_ms:.2f} / "
              f"{cost.bwd_ms:.2f}, the kind's mean {mean_fwd:.2f} / {mean_bwd:.2f}")
    own = [x.fwd_ms + x.bwd_ms for x, _ in blocks]
    charged = [c.fwd_ms + c.bwd_ms for _, c in blocks]
    spans = [(a, k) for k in range(1, 7) for a in range(len(own) - k + 1)]
    under_mean = [k * fmean(own) / sum(own[a:a + k]) for a, k in spans]
    now = [sum(charged[a:a + k]) / sum(own[a:a + k]) for a, k in spans]
    print(f"a stage of 1-6 blocks charged {min(under_mean):.3f}-{max(under_mean):.3f} of its own time under the "
          f"kind's mean, {min(now):.3f}-{max(now):.3f} now")


if __name__ == "__main__":
    main(sys.argv[1])
