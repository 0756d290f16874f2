"""What is alive at each rank's measured peak on ckplan's runtime (gloo, CPU), run after run: a pinned 2-stage split
of a GPT fixture (as scripts/pp_zero_splits.py pins it) launched RUNS times with MemTracker recording, at its peak,
every live storage with its bytes, kind and where it was made (scripts/peak_live/sitecustomize.py). Prints per run the
stages' (measured, predicted) and, per distinct peak of a stage's worst rank, its live storages once.

    PYTHONPATH=$PWD python scripts/peak_live.py OUT FIXTURE:ZERO:CUT RUNS [STAGE]"""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pp_zero_splits import ROOT, cli, pinned  # noqa: E402


def main(out: Path, key: str, runs: int, stage: int) -> None:
    from planner import io
    from planner.runtime.launcher import run_plan

    fixture, zero, cut = key.split(":")
    out.mkdir(parents=True, exist_ok=True)
    profile_path, base = out / f"{fixture}.json", out / f"{fixture}_{zero}.yaml"
    if not profile_path.exists():
        cli("profile", ROOT / "tests" / "fixtures" / f"{fixture}_gpt.py", "--micro-batch-size", "2", "--threads",
            "1", "--repeats", "1", "--warmup", "1", "--out", profile_path)
    if not base.exists():
        cli("solve", "--profile", profile_path, "--stages", "2", "--dp", "2", "--zero", zero, "--mem", "1GiB",
            "--microbatches", "2", "--schedule", "1F1B", "--out", base)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "scripts" / "peak_live"),
                                                             os.environ.get("PYTHONPATH")]))
    seen = {}
    for run in range(runs):
        folder = out / f"run{run}"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.jsonl"):
            old.unlink()
        os.environ["PEAK_LIVE_DIR"] = str(folder)
        plan = pinned(io.load_plan(base), io.load_profile(profile_path), int(cut))
        report = run_plan(plan, plan_file=base, steps=1, warmup_steps=1)
        rows = [(s.measured.peak_bytes, s.predicted.peak_bytes) for s in report.stages]
        print(run, [(m, p, m - p) for m, p in rows], flush=True)
        for path in folder.glob("rank*.jsonl"):
            peaks = [json.loads(line) for line in path.read_text().splitlines()]
            top = max(peaks, key=lambda p: p["peak"])
            if top["peak"] == rows[stage][0] and top["peak"] not in seen:
                seen[top["peak"]] = (run, path.stem, top)
    for peak, (run, rank, top) in sorted(seen.items()):
        print(f"\n== peak {peak} (run {run}, {rank}) at {top['at']}")
        counts = collections.Counter((b, kind, where) for b, kind, where in top["live"])
        for (b, kind, where), n in sorted(counts.items(), key=lambda kv: -kv[0][0] * kv[1]):
            print(f"{b:>9} x{n} {kind:5} {where[:150]}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: peak_live.py OUT FIXTURE:ZERO:CUT RUNS [STAGE]")
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) == 5 else 1)
