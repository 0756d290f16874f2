"""CPU seconds of a `--fake` profile's passes, two source trees in one run: fake_measure as a whole, the
split backward's counts (planner/profiler/fake_split.py `split_work`) and the recompute options' counts
(planner/profiler/fake.py `_run_options`), each timed by wrapping the function (time.process_time: this
process's CPU, so other processes' load inflates it less than wall). Each repeat is a new Python per
tree, the trees alternating (A, B, A, B, ...), so a spell of a shared machine's load lands on both;
the table gives each figure's median and min over the repeats and B / A of the medians and of the
mins (their disagreement is the noise). The profiles each tree wrote are compared too (equal but for
scripts/bench_fake_once.py's IGNORED): a change that speeds the passes must not move a byte.

    .venv/bin/python scripts/bench_fake_passes.py --a /path/to/before-tree --b . --repeats 3

The model: tests/test_fake_same.py's Qwen3 (sliding and full attention layers alternating), or
`--model llama3` (LLaMA 3 8B's full width, `--layers` decoder layers, seq 1024).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "head_dim": 16, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
         "use_sliding_window": True, "sliding_window": 64,
         "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}
MODELS = {"qwen3": (QWEN3, ["--seq-len", "32", "--micro-batch-size", "1", "--device", "cpu", "--dtype", "float32"]),
          "llama3": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 2,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                      "max_position_embeddings": 8192}, ["--seq-len", "1024", "--micro-batch-size", "1"])}
TIMED = {"fake_measure": ("planner.profiler.fake", "fake_measure"),
         "split_work": ("planner.profiler.fake_split", "split_work"),
         "_run_options": ("planner.profiler.fake", "_run_options")}

# what the child runs: the CLI in-process with the passes wrapped in timers
CHILD = r"""
import importlib, json, sys, time
timed = {}
def wrap(key, module, name):
    module = importlib.import_module(module)
    inner = getattr(module, name)
    timed[key] = 0.0
    def timer(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            timed[key] += time.process_time() - start
    setattr(module, name, timer)
for key, (module, name) in json.loads(sys.argv[1]).items():
    wrap(key, module, name)
from click.testing import CliRunner
import planner.cli as cli
result = CliRunner().invoke(cli.cli, json.loads(sys.argv[2]))
if result.exit_code != 0:
    raise SystemExit(result.output)
print(json.dumps(timed))
"""


def one_run(tree: Path, args: list[str]) -> dict[str, float]:
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(TIMED), json.dumps(args)], cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the profile failed in {tree}:\n{result.stdout}{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="the tree before (A)")
    parser.add_argument("--b", default=".", help="the tree after (B)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3")
    args = parser.parse_args()
    trees = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    config, options = MODELS[args.model]
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / args.model
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        for repeat in range(args.repeats):
            for label, tree in trees.items():
                out = Path(tmp) / f"{label}.json"
                runs[label].append(one_run(tree, ["profile", "--fake", "--hf-config", str(folder), *options,
                                                  "--out", str(out)]))
                print(f"repeat {repeat + 1} {label}: " + ", ".join(f"{k} {v:.1f} s" for k, v in runs[label][-1].items())
                      + f" (load {os.getloadavg()[0]:.1f})", flush=True)
        profiles = [json.loads((Path(tmp) / f"{label}.json").read_text()) for label in trees]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_fake_once import IGNORED

    differing = [key for key in sorted(set(profiles[0]) | set(profiles[1]))
                 if key not in IGNORED and profiles[0].get(key) != profiles[1].get(key)]
    print(f"\n{args.model}, {args.repeats} repeats a tree, alternating; CPU s of this process (median, min)")
    print("| pass | A median | A min | B median | B min | B/A medians | B/A mins |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for key in TIMED:
        a, b = ([run[key] for run in runs[label]] for label in trees)
        print(f"| {key} | {statistics.median(a):.2f} | {min(a):.2f} | {statistics.median(b):.2f} | {min(b):.2f} | "
              f"{statistics.median(b) / statistics.median(a):.3f} | {min(b) / min(a):.3f} |")
    print("profiles: the same" if not differing else f"profiles differ in: {differing}")
    if differing:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
