"""The plans a few bench cases make, as JSON, and a comparison of two such records: run it on two
versions of ckplan (e.g. before and after a refactor) and compare, so a change that moves a plan
shows (same layers, options and peaks; iteration time to 1e-9).

    .venv/bin/python scripts/bench_plans.py > after.json
    .venv/bin/python scripts/bench_plans.py --compare before.json after.json

Cases: synthetic profiles (uniform blocks, heterogeneous layers) under 1F1B and GPipe with the DP
and the MILP, ZeRO 1 over 4 ranks, and interleaved-1F1B and ZBV with 2 chunks; the cap 40% of the
way from what full checkpointing needs to what none needs (chunked: 4 GiB). Each record holds the
plan, its iteration and peaks, the solver's status and objective, and every baseline."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.cost import costmodel  # noqa: E402
from planner.models import synthetic  # noqa: E402
from planner.schema import TrainSetup  # noqa: E402
from planner.solve import baselines, search  # noqa: E402


def case(profile, stages, *, schedule="1F1B", chunks=1, microbatches=None, solver="auto", **extra) -> dict:
    roomy = TrainSetup(stages=stages, microbatches=microbatches or 2 * stages, micro_batch_size=1, schedule=schedule,
                       chunks=chunks, mem_caps_bytes=[2**50] * stages, **extra)
    if chunks == 1:
        full = costmodel.evaluate(baselines.full_checkpointing(profile, roomy), profile, roomy)
        none = costmodel.evaluate(baselines.no_checkpointing(profile, roomy), profile, roomy)
        lo, hi = max(full.peak_bytes_per_stage), max(none.peak_bytes_per_stage)
        cap = int(lo + 0.4 * (hi - lo))
    else:
        cap = 2**32
    setup = roomy.model_copy(update={"mem_caps_bytes": [cap] * stages})
    result = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
    if not isinstance(result, search.PlanResult):
        return {"nofit": result.status}
    return {"iteration_ms": result.cost.iteration_ms, "peaks": result.cost.peak_bytes_per_stage,
            "stages": [[s.layers, s.checkpointed, s.recompute] for s in result.stages],
            "status": result.solve.status, "objective": result.solve.objective,
            "baselines": {b.name: [b.feasible, b.iteration_ms, b.peak_bytes_per_stage]
                          for b in baselines.all_baselines(profile, setup)}}


def record() -> dict:
    out = {}
    for solver in ("dp", "milp"):
        out[f"uniform64x8-{solver}"] = case(synthetic.uniform_blocks(62), 8, solver=solver)
        out[f"het32x4-{solver}"] = case(synthetic.heterogeneous(32, seed=2), 4, solver=solver)
        out[f"het24x4-gpipe-{solver}"] = case(synthetic.heterogeneous(24, seed=5), 4, schedule="GPipe", solver=solver)
        out[f"het24x4-dp-zero1-{solver}"] = case(synthetic.heterogeneous(24, seed=7), 4, solver=solver, dp=4, zero=1)
    out["het16x2-interleaved"] = case(synthetic.heterogeneous(16, seed=3), 2, schedule="interleaved-1F1B", chunks=2,
                                      microbatches=4)
    out["het16x2-zbv"] = case(synthetic.heterogeneous(16, seed=4), 2, schedule="ZBV", chunks=2, microbatches=4)
    return out


def compare(before: dict, after: dict) -> list[str]:
    rows = []
    for name, old in before.items():
        new = after.get(name, {})
        if "nofit" in old or "nofit" in new:
            rows.append(f"{name}: {old.get('nofit', 'plan')} -> {new.get('nofit', 'plan')}")
            continue
        rel = abs(new["iteration_ms"] - old["iteration_ms"]) / old["iteration_ms"]
        moved = [n for n, b in old.get("baselines", {}).items()
                 if n in new["baselines"] and (b[0], b[2]) != (new["baselines"][n][0], new["baselines"][n][2])]
        rows.append(f"{name}: plan {'same' if old['stages'] == new['stages'] else 'CHANGED'}, peaks "
                    f"{'same' if old['peaks'] == new['peaks'] else 'CHANGED'}, iteration rel. diff {rel:.1e}, "
                    f"status {old['status']} -> {new['status']}, baselines {len(old.get('baselines', {}))} -> "
                    f"{len(new['baselines'])}{', moved: ' + ', '.join(moved) if moved else ''}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        print("\n".join(compare(before, after)))
    else:
        json.dump(record(), sys.stdout, indent=1)


if __name__ == "__main__":
    main()
