"""Where the test suite's time goes: each test's wall and CPU seconds, the CPU of the test's
process and of everything it started (the ranks' fork server and its forks, ckplan run as its own
process, profile's copies), as a pytest plugin; and a table of them by file and by test.

On a shared machine a test's wall time is mostly the other processes' load; its CPU seconds
are what the suite asks of CI's two cores (docs/testing.md). Each test appends one JSON line to
$PYTEST_CPUTIME (default pytest-cputime.jsonl) as it ends, so a run stopped part way still says
where its time went:

    PYTHONPATH=$PWD:$PWD/scripts PYTEST_CPUTIME=/tmp/times.jsonl \\
        .venv/bin/python -m pytest -n logical --maxprocesses 4 --dist loadgroup -p pytest_cputime -q
    python scripts/pytest_cputime.py /tmp/times.jsonl [--top 30]

A test's CPU is read from /proc (Linux only) at its start and end: its process's and its live
descendants' user + system time, each with the time of the children it has waited for. Under
pytest-xdist the controller sees each test too; its lines (worker "-", whose CPU would be both
workers' at once) are left out of the table where workers' lines exist.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks of the process and of its waited-for children)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), sum(int(value) for value in fields[11:15])


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its live descendants."""
    stats = {int(pid): found for pid in os.listdir("/proc") if pid.isdigit() and (found := _stat(pid))}
    children = collections.defaultdict(list)
    for pid, (parent, _) in stats.items():
        children[parent].append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats[pid][1] if pid in stats else 0
        todo.extend(children[pid])
    return total / TICKS


_started: dict[str, tuple[float, float]] = {}


def pytest_runtest_logstart(nodeid, location):
    _started[nodeid] = (time.monotonic(), tree_cpu_s(os.getpid()))


def pytest_runtest_logfinish(nodeid, location):
    if nodeid not in _started:
        return
    wall0, cpu0 = _started.pop(nodeid)
    line = {"id": nodeid, "wall": round(time.monotonic() - wall0, 2), "cpu": round(tree_cpu_s(os.getpid()) - cpu0, 2),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "-"), "at": time.strftime("%H:%M:%S"),
            "load": _load()}
    with open(os.environ.get("PYTEST_CPUTIME", "pytest-cputime.jsonl"), "a") as out:
        out.write(json.dumps(line) + "\n")


def _load() -> float | None:
    try:
        with open("/proc/loadavg") as loadavg:
            return float(loadavg.read().split()[0])
    except OSError:
        return None


def table(path: str, top: int) -> str:
    lines = [json.loads(text) for text in open(path) if text.strip()]
    if any(line["worker"] != "-" for line in lines):
        lines = [line for line in lines if line["worker"] != "-"]
    files = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for line in lines:
        entry = files[line["id"].split("::")[0]]
        entry[0] += line["cpu"]
        entry[1] += line["wall"]
        entry[2] += 1
    rows = [f"{len(lines)} tests: {sum(line['cpu'] for line in lines):.0f} CPU-s, "
            f"{sum(line['wall'] for line in lines):.0f} s of wall summed over the tests", "",
            "| CPU-s | wall s | tests | file |", "|---:|---:|---:|---|"]
    rows += [f"| {cpu:.1f} | {wall:.1f} | {count} | {name} |"
             for name, (cpu, wall, count) in sorted(files.items(), key=lambda item: -item[1][0])[:top]]
    rows += ["", "| CPU-s | wall s | test |", "|---:|---:|---|"]
    rows += [f"| {line['cpu']:.1f} | {line['wall']:.1f} | {line['id']} |"
             for line in sorted(lines, key=lambda line: -line["cpu"])[:top]]
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="the JSON lines the plugin wrote")
    parser.add_argument("--top", type=int, default=30, help="rows of each table")
    args = parser.parse_args()
    print(table(args.log, args.top))
