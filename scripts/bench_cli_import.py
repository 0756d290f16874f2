"""What starting `ckplan` costs before a command runs: the CPU seconds (user + sys, the child's) of a
new Python importing planner.cli, `ckplan --help`, `ckplan launch --help`, against every command's
module imported (what planner.cli did before session 55 made them lazy) and torch, each repeated
in alternation; medians with min and max, and each case's ratio to the eager import. The test
suite starts ckplan as its own process some dozens of times (test_no_orphans, test_faults,
test_forkserver, the GPU check's dry run), and each then imports torch (about 2.5 CPU-s here),
so this says what lazy command loading in planner/cli.py takes off each start (docs/testing.md,
sessions 54 and 55).

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
_HELP = "import sys; from planner.cli import main; sys.argv = ['ckplan', {}'--help']; main()"
EAGER = "every command's module"
CASES = {
    "python alone": "pass",
    EAGER: "from planner.cli import cli; [cli.commands[name] for name in list(cli.commands)]",
    "import planner.cli (lazy)": "import planner.cli",
    "ckplan --help": _HELP.format(""),
    "ckplan launch --help": _HELP.format("'launch', "),
    "launch's module, io, console": "import click, planner.commands.launch, planner.io, planner.console",
    "profile's module, io, console": "import click, planner.commands.profile, planner.io, planner.console",
    "torch": "import torch",
}


def cpu_s(code: str) -> float:
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL)
    after = os.times()
    return after.children_user + after.children_system - before.children_user - before.children_system


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    load = os.getloadavg()[0]
    for _ in range(args.repeats):
        for name, code in CASES.items():
            samples[name].append(cpu_s(code))
    base = statistics.median(samples[EAGER])
    print(f"load {load:.1f} -> {os.getloadavg()[0]:.1f}; CPU s of a new Python, median (min, max) of {args.repeats}:")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"  {name:30s} {median:6.2f} ({min(values):.2f}, {max(values):.2f})  / eager {median / base:.2f}")


if __name__ == "__main__":
    main()
