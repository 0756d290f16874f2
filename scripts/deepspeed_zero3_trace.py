"""DeepSpeed ZeRO 3's gathers on a §25.dsrows row (docs/published-runs.md §25.dsrows, framework-facts §103).

usage: PYTHONPATH=<checkout> python scripts/deepspeed_zero3_trace.py RESULTS_DIR [--max-reuse N] [--link-gb-s R]

For each DeepSpeed row (group "deepspeed" of scripts/published_rows.toml) whose result is in RESULTS_DIR
(`scripts/published_rows.py run --out RESULTS_DIR`): which submodules of a checkpointed GPT block keep their
parameters gathered from recompute to backward at the run's stage3_max_reuse_distance
(planner/cost/deepspeed_zero3.py), the elements gathered a microbatch against FSDP2's two gathers, and what a
third gather would expose on the row: one gather of the model is G = 2 B x params x (K-1)/K over the link,
the reduce-scatter as much; the forward hides its gather behind the forward (a quarter of the row's compute:
forward, recompute and twice the forward in backward), the backward hides (1 + f) G + G behind the other
three quarters, f the share gathered a third time. §25.dsrows' estimate beside the row; the cost model now charges
the third gather itself (planner/cost/deepspeed_terms.py, §25.dszero3).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_rows import load_table  # noqa: E402

from planner.cost import deepspeed_zero3  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE_MAX_REUSE = 3_000_000_000  # Megatron-DeepSpeed examples/azure/run-175b.sh, run-1t.sh (62bc4562)


def _arch(profile_args: list[str]) -> dict:
    words = profile_args
    return json.loads((ROOT / words[words.index("--arch-config") + 1]).read_text())


def _dp(args: list[str]) -> int:
    words = args
    return int(words[words.index("--dp") + 1])


def row_estimate(row, profile_args: list[str], result: dict, *, max_reuse: int, link_gb_s: float) -> dict:
    arch = _arch(profile_args)
    h, layers = arch["n_embd"], arch["n_layer"]
    block = deepspeed_zero3.gpt_block(h, 4 * h)
    gathered, third = deepspeed_zero3.gathered_numel(block, max_reuse_numel=max_reuse)
    kept = deepspeed_zero3.kept_to_backward(block, max_reuse_numel=max_reuse)
    k = _dp(row.args)
    params = layers * sum(m.numel for m in block)
    one_gather_s = 2 * params * (k - 1) / k / (link_gb_s * 1e9)
    share = third / ((gathered - third) / 2)  # of one whole gather (forward's)
    compute = sum(stage["time_ms"] for stage in result["stages"]) / 1e3  # the step (step_ms) apart
    fwd, bwd = compute / 4, 3 * compute / 4
    exposed_two = max(0.0, one_gather_s - fwd) + max(0.0, 2 * one_gather_s - bwd)
    exposed_three = max(0.0, one_gather_s - fwd) + max(0.0, (2 + share) * one_gather_s - bwd)
    return {"row": row.id, "kept_to_backward": [m.name for m, s in zip(block, kept) if s],
            "third_gather_share": round(share, 3), "one_gather_s": round(one_gather_s, 1),
            "compute_s": round(compute, 1), "exposed_two_gathers_s": round(exposed_two, 1),
            "exposed_three_gathers_s": round(exposed_three, 1),
            "iteration_s": round(result["iteration_s"], 1),
            "iteration_with_third_s": round(result["iteration_s"] - exposed_two + exposed_three, 1),
            "published_s": row.time_s}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--max-reuse", type=int, default=RECIPE_MAX_REUSE)
    parser.add_argument("--link-gb-s", type=float, default=24.0,
                        help="the shard group's reduction rate ckplan prints for the row (a100-80g: 24)")
    opts = parser.parse_args(argv)
    table = load_table()
    for row in table.rows:
        path = opts.results / f"{row.id}.json"
        if row.group != "deepspeed" or not path.exists():
            continue
        result = json.loads(path.read_text())
        print(json.dumps(row_estimate(row, table.profiles[row.profile], result, max_reuse=opts.max_reuse,
                                      link_gb_s=opts.link_gb_s)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
