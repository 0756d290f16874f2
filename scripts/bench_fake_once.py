"""Wall and CPU seconds of `ckplan profile --fake` on LLaMA 3 8B's full-width config (32 decoder
layers by default), repeated, for one source tree: the figure the fake profile's run-each-kind-once
(planner/profiler/fake_same.py) changes. Each repeat is a new Python (`python -m planner.cli`, as a
user runs it), its CPU the child's user + sys (resource.getrusage), its imports included.

    .venv/bin/python scripts/bench_fake_once.py --tree /work/main --repeats 3 --out /tmp/before.json
    .venv/bin/python scripts/bench_fake_once.py --tree . --repeats 3 --out /tmp/after.json
    .venv/bin/python scripts/bench_fake_once.py --table /tmp/before.json /tmp/after.json

`--keep DIR` also keeps each run's profile, so two trees' profiles can be compared
(`--same A.json B.json`: equal but for IGNORED).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "max_position_embeddings": 8192}  # meta-llama/Meta-Llama-3-8B's config.json, shape-setting fields
# what two profiles of one model may differ in: when each was made, the host step's rate, timed on this
# host at each run (planner/commands/profile_arch.py's _with_host_step), not by the fake run, and the model
# file written beside each (its first line names the config's temporary folder, so its path and hash differ)
IGNORED = {"created_at", "host_step_ns_per_param", "model"}


def one_run(tree: Path, config_dir: Path, out: Path, seq_len: int) -> tuple[float, float]:
    """(wall s, CPU s) of one `ckplan profile --fake` run from `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "planner.cli", "profile", "--hf-config", str(config_dir), "--fake",
                             "--seq-len", str(seq_len), "--micro-batch-size", "1", "--out", str(out)],
                            cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"ckplan profile --fake failed in {tree}:\n{result.stdout}{result.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(args) -> None:
    tree = Path(args.tree).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        config_dir = Path(tmp) / "llama3-8b"
        config_dir.mkdir()
        (config_dir / "config.json").write_text(json.dumps({**LLAMA3_8B, "num_hidden_layers": args.layers}))
        runs = []
        for repeat in range(args.repeats):
            out = Path(args.keep or tmp) / f"profile-{repeat}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            wall, cpu = one_run(tree, config_dir, out, args.seq_len)
            load = os.getloadavg()[0]
            runs.append({"wall_s": wall, "cpu_s": cpu, "load_1min": load})
            print(f"repeat {repeat + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s, load {load:.1f}", flush=True)
    record = {"tree": str(tree), "layers": args.layers, "seq_len": args.seq_len, "runs": runs}
    Path(args.out).write_text(json.dumps(record, indent=1))


def summary(values: list[float]) -> str:
    spread = f" (min {min(values):.1f}, max {max(values):.1f})" if len(values) > 1 else ""
    return f"{statistics.median(values):.1f}{spread}"


def table(before_path: str, after_path: str) -> None:
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    print(f"LLaMA 3 8B, {before['layers']} layers, seq {before['seq_len']}: median of "
          f"{len(before['runs'])} / {len(after['runs'])} runs (min, max)")
    print("| figure | before | after | after / before |")
    print("|---|---:|---:|---:|")
    for key in ("wall_s", "cpu_s"):
        old, new = ([run[key] for run in record["runs"]] for record in (before, after))
        print(f"| {key} | {summary(old)} | {summary(new)} | {statistics.median(new) / statistics.median(old):.3f} |")
    loads = [run["load_1min"] for record in (before, after) for run in record["runs"]]
    print(f"load (1 min) at the runs' ends: {min(loads):.1f} to {max(loads):.1f}")


def same(a_path: str, b_path: str) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    differing = [key for key in sorted(set(a) | set(b)) if key not in IGNORED and a.get(key) != b.get(key)]
    print("the same profile" if not differing else f"differing: {differing}")
    if differing:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=".", help="the source tree to run ckplan from")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="where the runs' figures go (JSON)")
    parser.add_argument("--keep", help="a folder to keep each run's profile in")
    parser.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--same", nargs=2, metavar=("A", "B"), help="two profiles: equal but for IGNORED?")
    args = parser.parse_args()
    if args.table:
        table(*args.table)
    elif args.same:
        same(*args.same)
    elif args.out:
        measure(args)
    else:
        parser.error("give --out (measure), --table or --same")


if __name__ == "__main__":
    main()
