"""`ckplan search`'s wall time before and after a change, in one run: the eleven jobs of docs/published-runs.md
§35.searchcheck (their model, GPUs, batch, runtime and settings; the published degrees scored beside with
--hand-recompute plan), each searched by two trees in turn (A, B, A, B, ... so a shared machine's load falls on
both), with the configurations each considered, solved and set aside, and its best.

    PYTHONPATH=$PWD python scripts/bench_search.py --before /tmp/base --after . [--jobs M11,T22] [--repeats 2]

--before / --after: checkouts whose planner/ and configs/ run (e.g. `git archive main | tar -x -C /tmp/base`; each
search runs in its tree, as `python -m` puts the working directory first on the path). Per job and tree: the
median wall time of the repeats (the command's, imports included) and the spread (slowest - fastest), which is
the noise to read the ratio against; the ratio after / before of the medians. Runs one search at a time.

    PYTHONPATH=$PWD python scripts/bench_search.py --before /tmp/base --after . --bounds --jobs E2,B4 --repeats 5

--bounds: the search's per-configuration bounds alone (planner/solve/bounds.py, what a search at 16-1024 GPUs
spends its limit on: docs/published-runs.md §43.searchfast). The --before tree runs each job's search for
--capture-limit seconds and keeps every (profile, setup, layers) it bounds; then each tree, in turn (A, B, A, B,
...), bounds those same setups in a fresh process, timed; per tree the median ms a setup and its range, the ratio
before / after of the medians (and its range over the pairs), and whether the two trees' bounds are equal to the
bit (they must be: a speed-up that moves a bound is a defect)."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TT = "--runtime torchtitan"
MEG = "--runtime megatron --float8 --te-cross-entropy --nccl-nvls-off"
BRIDGE = ("--runtime megatron --runtime-version 92c8482e --float8 --fp8-current-scaling --fp8-all-gather "
          "--te-cross-entropy --nccl-nvls-off --grad-reduce-in-bf16")
# §35.searchcheck's commands (/tmp/searchcheck/drive.sh there), --time-limit apart
JOBS = {
    "M11": f"--arch llama3-8b --gpus 8 --gpu h100-96g --global-batch 8 --seq-len 8192 {TT} --runtime-version 9dec370 "
           "--compile --op-level-sac --mem 96GB --tp 1 --pp 1 --dp 8 --zero 3 --micro-batch-size 1",
    "M8": f"--arch llama3-8b --gpus 8 --gpu h100-96g --global-batch 16 --seq-len 8192 {TT} --runtime-version 9dec370 "
          "--op-level-sac --mem 96GB --no-expandable-segments --tp 1 --pp 1 --dp 8 --zero 3 --micro-batch-size 2",
    "C1": f"--arch llama3-8b --gpus 8 --gpu h100-96g --global-batch 8 --seq-len 32768 {TT} --runtime-version 9dec370 "
          "--compile --float8 --fp8-all-gather --mem 96GB --no-expandable-segments --tp 1 --pp 1 --dp 8 --zero 3 "
          "--micro-batch-size 1",
    "M13": f"--arch llama3-8b --gpus 32 --gpu h200 --global-batch 64 --seq-len 8192 {TT} --compile --float8 "
           "--fp8-all-gather --op-level-sac --mem 141GB --tp 1 --pp 1 --dp 32 --zero 3 --micro-batch-size 2",
    "X2": f"--arch llama3-8b --gpus 128 --gpu h100-96g --global-batch 256 --seq-len 8192 {TT} --runtime-version 9dec370 "
          "--compile --op-level-sac --mem 96GB --tp 1 --pp 1 --dp 128 --zero 3 --micro-batch-size 2",
    "T22": f"--arch llama3-8b --gpus 8 --gpu b200 --global-batch 128 --seq-len 8192 {MEG} --mem 180GB --tp 1 --pp 1 "
           "--dp 8 --zero 1 --micro-batch-size 2",
    "BT22": f"--arch llama3-8b --gpus 8 --gpu b200 --global-batch 128 --seq-len 8192 {MEG} "
            "--from-megatron configs/megatron-bridge/b200_8b_fp8cs.yaml",
    "M19": "--arch llama2-7b --gpus 32 --gpu a100-80g --global-batch 512 --seq-len 4096 --runtime colossalai "
           "--runtime-version hf-4.3x --mem 80GB --tp 1 --pp 1 --dp 32 --zero 3 --micro-batch-size 16",
    "T11": f"--arch llama3-8b --gpus 64 --gpu h100-96g --global-batch 96 --seq-len 8192 {TT} --compile --op-level-sac "
           "--mem 96GB --tp 8 --sp --pp 1 --dp 8 --zero 3 --micro-batch-size 12",
    "M15": f"--arch llama3-70b --gpus 256 --gpu h100-96g --global-batch 512 --seq-len 8192 {TT} --runtime-version 9dec370 "
           "--compile --float8 --fp8-all-gather --mem 96GB --tp 8 --sp --pp 1 --dp 32 --zero 3 --micro-batch-size 16",
    "DS1": "--arch-config configs/published/ds_azure_gpt175b.json --gpus 256 --gpu a100-80g --global-batch 8192 "
           "--seq-len 512 --runtime deepspeed --tp 1 --pp 1 --dp 256 --zero 3 --micro-batch-size 32",
    # §37.searchspace's 8B job (ckplan's runtime) and §37.mismatch's 8B Megatron job: no published degrees beside
    "S8B": "--arch llama3-8b --gpus 16 --global-batch 32 --seq-len 4096",
    "MM8B": "--arch llama3-8b --gpus 16 --global-batch 32 --seq-len 4096 --runtime megatron",
    "S8Ball": "--arch llama3-8b --gpus 16 --global-batch 32 --seq-len 4096 --schedules 1F1B,interleaved-1F1B",
    "MM70B": "--arch llama3-70b --gpus 64 --gpu h100 --global-batch 128 --seq-len 8192 --runtime megatron",
    # §42.searchscale's E2 and B4 (Bridge's Qwen3-30B-A3B on 16 H100, LLaMA 3.1 405B on 1024), its fix 4's
    # --grad-reduce-in-bf16 given
    "E2": f"--arch qwen3-30b-a3b --gpus 16 --gpu h100 --global-batch 512 --seq-len 4096 {BRIDGE} --te-grouped-gemm "
          "--from-megatron configs/megatron-bridge/h100_qwen3_30b_fp8cs.yaml",
    "B4": f"--arch llama3.1-405b --gpus 1024 --gpu h100 --global-batch 512 --seq-len 8192 {BRIDGE} --tp-overlap "
          "tp-comm-overlap --compare --from-megatron configs/megatron-bridge/h100_405b_fp8cs.yaml",
}
HAND = "--hand-recompute plan"  # with --tp ...: the published degrees' own plan beside (not for BT22's file)


def one(tree: Path, job: str, time_limit: float, folder: Path) -> dict:
    """One search by `tree`'s planner on this repository's configs: its wall time and what its JSON says."""
    args = JOBS[job].split() + (HAND.split() if "--tp" in JOBS[job].split() else [])
    out = folder / f"{job}.yaml"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "planner.cli", "search", *args, "--time-limit", str(time_limit),
                           "--out", str(out), "--json"], capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(tree)}, cwd=tree)  # `-m` puts the cwd first on the path
    wall = time.perf_counter() - started
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"wall_s": wall, "rc": done.returncode, "error": done.stderr.strip().splitlines()[-1:]}
    best = data["ranked"][0] if data["ranked"] else None
    hand = next((row for row in data["compared"] if row["iteration_ms"] is not None), None)
    return {"wall_s": wall, "rc": done.returncode, "counts": data["counts"],
            "best": best and (best["degrees"], best["iteration_ms"]), "beside_ms": hand and hand["iteration_ms"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--json", type=Path, default=None, help="Every run's figures, written here.")
    parser.add_argument("--bounds", action="store_true", help="Time the per-configuration bounds alone (above).")
    parser.add_argument("--capture-limit", type=float, default=60.0)
    args = parser.parse_args()
    if args.bounds:
        _bounds_bench(args)
        return
    runs: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        for job in args.jobs.split(","):
            for _ in range(args.repeats):
                for tag, tree in (("before", args.before), ("after", args.after)):
                    runs.setdefault(job, {}).setdefault(tag, []).append(
                        one(tree.resolve(), job, args.time_limit, Path(scratch)))
            _row(job, runs[job])
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1, default=str))


def _row(job: str, tags: dict) -> None:
    cells = [job]
    for tag in ("before", "after"):
        walls = [r["wall_s"] for r in tags[tag]]
        last = tags[tag][-1]
        counts = last.get("counts") or {}
        best = last.get("best")
        cells.append(f"{statistics.median(walls):.1f} s (spread {max(walls) - min(walls):.1f}), "
                     f"{counts.get('considered', '-')} considered / {counts.get('solved', '-')} solved / "
                     f"{counts.get('chunked_set_aside', 0)} set aside, best "
                     f"{best[1]:.1f} ms" if best else f"{statistics.median(walls):.1f} s, no plan ({last.get('rc')})")
    ratio = statistics.median(r["wall_s"] for r in tags["after"]) / statistics.median(r["wall_s"] for r in tags["before"])
    beside = tags["after"][-1].get("beside_ms")
    cells += [f"{ratio:.2f}", f"{beside:.1f} ms" if beside else "-"]
    print(" | ".join(cells), flush=True)


def _in_tree(tree: Path, *args: str) -> None:
    """This script's `args` step (_capture, _time) run by `tree`'s planner, in `tree`."""
    subprocess.run([sys.executable, __file__, *args], check=True, cwd=tree,
                   env=os.environ | {"PYTHONPATH": str(tree)})


def _capture(job: str, time_limit: str, out: str) -> None:
    """Run `job`'s search in-process for `time_limit` s, keeping every (profile, setup, layers) it bounds."""
    from click.testing import CliRunner

    from planner.cli import cli
    from planner.solve import jobsearch

    seen, real = [], jobsearch.bounds_mod.setup_bounds

    def keep(profile, setup, layers=None, **keywords):
        if keywords.get("timed", True):  # a tree whose search asks a memory bound alone first: the timed ones
            seen.append((profile, setup, layers))
        return real(profile, setup, layers, **keywords)

    jobsearch.bounds_mod.setup_bounds = keep
    with tempfile.TemporaryDirectory() as scratch:
        CliRunner().invoke(cli, ["search", *JOBS[job].split(), "--time-limit", time_limit, "--json",
                                 "--out", str(Path(scratch) / "best.yaml")])
    Path(out).write_bytes(pickle.dumps(seen))


def _time(setups: str, out: str) -> None:
    """Bound every captured setup once (after one warm-up setup): the seconds, and each bound exactly."""
    from planner.solve import bounds

    seen = pickle.loads(Path(setups).read_bytes())
    bounds.setup_bounds(*seen[0])
    started = time.perf_counter()
    found = [bounds.setup_bounds(*one_setup) for one_setup in seen]
    wall = time.perf_counter() - started
    Path(out).write_text(json.dumps({"wall_s": wall, "bounds": [[b.time_ms, b.static_bytes, b.limit_bytes]
                                                                for b in found]}))


def _bounds_bench(args) -> None:
    print("job | setups | before: ms a setup, median (range) | after | before / after, median (range) | bounds")
    with tempfile.TemporaryDirectory() as scratch:
        for job in args.jobs.split(","):
            setups = Path(scratch) / f"{job}.pickle"
            _in_tree(args.before.resolve(), "_capture", job, str(args.capture_limit), str(setups))
            count = len(pickle.loads(setups.read_bytes()))
            runs: dict = {"before": [], "after": []}
            for repeat in range(args.repeats):
                for tag, tree in (("before", args.before), ("after", args.after)):
                    out = Path(scratch) / f"{job}.{tag}.{repeat}.json"
                    _in_tree(tree.resolve(), "_time", str(setups), str(out))
                    runs[tag].append(json.loads(out.read_text()))
            ms = {tag: [r["wall_s"] / count * 1e3 for r in runs[tag]] for tag in runs}
            ratios = [b / a for b, a in zip(ms["before"], ms["after"])]
            equal = all(r["bounds"] == runs["before"][0]["bounds"] for tag in runs for r in runs[tag])
            cells = [job, str(count)] + [f"{statistics.median(ms[tag]):.2f} ({min(ms[tag]):.2f}-{max(ms[tag]):.2f})"
                                         for tag in ("before", "after")]
            cells += [f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                      "equal" if equal else "DIFFER"]
            print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_capture":
        _capture(*sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "_time":
        _time(*sys.argv[2:])
    else:
        main()
