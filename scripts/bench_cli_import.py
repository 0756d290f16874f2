"""What starting `ckplan` costs before a command runs: the CPU seconds (user + sys, the child's) of a
new Python importing planner.cli, against importing only what one command's module needs, each
repeated in alternation; medians with min and max. The test suite starts ckplan as its own process
some dozens of times (test_no_orphans, test_faults, test_forkserver, the GPU check's dry run), and
each then imports torch (about 2.5 CPU-s here), so this says what lazy command loading in
planner/cli.py could take off each start (docs/testing.md, session 54).

    python scripts/bench_cli_import.py --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "python alone": "pass",
    "planner.cli (every command)": "import planner.cli",
    "launch's module alone": "import click, planner.commands.launch, planner.io, planner.console",
    "profile's module alone": "import click, planner.commands.profile, planner.io, planner.console",
    "torch": "import torch",
}


def cpu_s(code: str) -> float:
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = os.times()
    return after.children_user + after.children_system - before.children_user - before.children_system


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, code in CASES.items():
            samples[name].append(cpu_s(code))
    base = statistics.median(samples["planner.cli (every command)"])
    print(f"load {os.getloadavg()[0]:.1f}; CPU s of a new Python, median (min, max) of {args.repeats}:")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"  {name:30s} {median:6.2f} ({min(values):.2f}, {max(values):.2f})  / planner.cli {median / base:.2f}")


if __name__ == "__main__":
    main()
