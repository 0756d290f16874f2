"""The Python processes the test suite starts, by file and by test: how many, how many ended by a
signal (no end line), and their own CPU seconds, from the lines scripts/proc_census/sitecustomize.py
writes (docs/testing.md, session 55):

    PYTHONPATH=$PWD/scripts/proc_census:$PWD:$PWD/scripts PROC_CENSUS=/tmp/procs.jsonl \\
        .venv/bin/python -m pytest tests -n 2 --dist loadgroup -p pytest_cputime -q
    python scripts/proc_census.py /tmp/procs.jsonl [--top 20] [--tests]

A "start" is a new Python (exec: ckplan as its own process, torchrun and its ranks, spawned and
forkserver children, profile's copies, `python -c` checks); a "fork" a fork of one that ended
through os._exit (multiprocessing's forked ranks, the rank server's forks). The pytest processes
themselves (started before any test) are left out. A fork server started by one test and used by
later ones counts its forks to the test that started it.
"""

from __future__ import annotations

import argparse
import collections
import json


def load(path: str) -> list[dict]:
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def census(records: list[dict], by_test: bool = False) -> list[tuple[str, int, int, int, float]]:
    """(key, starts, forks, killed: starts without an end, CPU s) by file (or test), most CPU first."""
    starts = {r["pid"]: r for r in records if r["kind"] == "start" and r["test"]}
    ends = {r["pid"]: r for r in records if r["kind"] == "end"}
    rows: dict[str, list] = collections.defaultdict(lambda: [0, 0, 0, 0.0])

    def key(test: str) -> str:
        name = test.rsplit(" (", 1)[0]
        return name if by_test else name.split("::", 1)[0]

    for pid, start in starts.items():
        row = rows[key(start["test"])]
        row[0] += 1
        if pid in ends:
            row[3] += ends[pid]["cpu"]
        else:
            row[2] += 1
    for fork in (r for r in records if r["kind"] == "fork_end" and r["test"]):
        row = rows[key(fork["test"])]
        row[1] += 1
        row[3] += fork["cpu"]
    return sorted(((name, *values) for name, values in rows.items()), key=lambda row: -row[4])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("census", help="the PROC_CENSUS file")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--tests", action="store_true", help="by test rather than by file")
    args = parser.parse_args(argv)
    rows = census(load(args.census), by_test=args.tests)
    total = [sum(row[i] for row in rows) for i in range(1, 5)]
    print(f"{total[0]} Python starts, {total[1]} forks, {total[2]} ended by a signal, {total[3]:.1f} CPU-s in all")
    print("| CPU-s | starts | forks | killed | " + ("test" if args.tests else "file") + " |")
    print("|---:|---:|---:|---:|---|")
    for name, started, forks, killed, cpu in rows[: args.top]:
        print(f"| {cpu:.1f} | {started} | {forks} | {killed} | {name} |")


if __name__ == "__main__":
    main()
