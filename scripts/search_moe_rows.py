"""`ckplan search` on the MoE models of docs/published-runs.md §23.epprofile (Mixtral 8x7B and Qwen3-30B-A3B,
configs/hf/, over 16 and 64 H100s, Megatron-LM's runtime), each run's chosen degrees, predicted step and wall time.

    PYTHONPATH=$PWD python scripts/search_moe_rows.py run --out DIR [--tree TREE]   # the searches, JSON into DIR
    python scripts/search_moe_rows.py table DIR [DIR2]                              # before (DIR) -> after (DIR2)

--tree runs another checkout's planner/ (e.g. `git worktree add /tmp/old 22eb00b` for the commit before the
per-EP profiles) on this repository's configs. The searches run one at a time (CPU-bound)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("mixtral-8x7b", "qwen3-30b-a3b")
GPUS = (16, 64)
# one micro-batch size and a time limit keep a run to minutes on a shared 2-core machine; the rest is search's
ARGS = ("--gpu", "h100", "--global-batch", "512", "--seq-len", "4096", "--runtime", "megatron",
        "--micro-batch-sizes", "1", "--top", "3", "--time-limit", "240", "--json")


def run(out: Path, tree: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": str(tree)}
    for model in MODELS:
        for gpus in GPUS:
            name = f"{model}-{gpus}"
            command = [sys.executable, "-m", "planner.cli", "search", "--arch-config",
                       str(ROOT / "configs" / "hf" / f"{model}.json"), "--gpus", str(gpus), *ARGS,
                       "--out", str(out / f"{name}.yaml")]
            started = time.perf_counter()
            done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
            wall = time.perf_counter() - started
            (out / f"{name}.json").write_text(done.stdout)
            (out / f"{name}.err").write_text(done.stderr)
            (out / f"{name}.wall").write_text(f"{wall:.1f}\n")
            print(f"{name}: exit {done.returncode}, {wall:.1f} s", flush=True)


def _row(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    if not path.exists() or not path.read_text().strip():
        return None
    found = json.loads(path.read_text())
    best = found["ranked"][0] if found["ranked"] else None
    wall = folder / f"{name}.wall"
    return {"best": best, "counts": found["counts"],
            "wall": float(wall.read_text()) if wall.exists() else None}


def _label(best: dict | None) -> str:
    if best is None:
        return "nothing fits"
    d = best["degrees"]
    zero = f"z{d['zero']}" + (f"/{d['shard_group']}" if d["shard_group"] else "")
    return (f"tp{d['tp']}{'sp' if d['sp'] else ''} pp{d['pp']} dp{d['dp']} ep{d['ep']} {zero} "
            f"mbs{d['micro_batch_size']}x{d['microbatches']}: {best['iteration_ms'] / 1e3:.2f} s "
            f"({best['tokens_per_s_per_gpu']:,.0f} tok/s/GPU)")


def _search(row: dict) -> str:
    counts = row["counts"]
    done = "complete" if counts["complete"] else "deadline"
    wall = f"{row['wall']:.0f} s wall, " if row["wall"] is not None else ""
    return f"{wall}search {counts['wall_s']:.0f} s, {counts['profiles']} profiles, {counts['solved']} solved, {done}"


def table(folders: list[Path]) -> None:
    heads = ["model", "GPUs"] + [f"{f.name}: best" for f in folders] + [f"{f.name}: search" for f in folders]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for model in MODELS:
        for gpus in GPUS:
            rows = [_row(f, f"{model}-{gpus}") for f in folders]
            cells = [_label(r["best"]) if r else "not run" for r in rows] + \
                    [_search(r) if r else "not run" for r in rows]
            print(f"| {model} | {gpus} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    ran = sub.add_parser("run")
    ran.add_argument("--out", type=Path, required=True)
    ran.add_argument("--tree", type=Path, default=ROOT)
    shown = sub.add_parser("table")
    shown.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args()
    if args.what == "run":
        run(args.out, args.tree.resolve())
    else:
        table(args.folders)


if __name__ == "__main__":
    main()
