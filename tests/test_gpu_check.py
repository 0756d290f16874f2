"""scripts/gpu_check.py --dry-run: the GPU check's plumbing on CPU at toy shapes, so the script
cannot rot between the sessions that have a GPU (issue 31)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_the_dry_run_runs_every_section_and_writes_its_report(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    errors = {name: result["error"] for name, result in report["sections"].items() if "error" in result}
    assert done.returncode == 0 and not errors, (errors, done.stdout[-2000:])
    assert list(report["sections"]) == ["profiles", "stage_memory", "caps", "offload", "time"]
    profiles = {(row["layer"], row["field"]): row for row in report["sections"]["profiles"]["rows"]}
    block = profiles[("layers.0", "act_bytes")]
    assert block["measured"] > 0 and block["fake"] > 0 and block["analytic"] > 0
    replays = [row for row in report["sections"]["stage_memory"]["rows"] if "peak_bytes" in row]
    assert {row["plan"] for row in replays} >= {"none", "full"} and all(row["peak_bytes"] > 0 for row in replays)
    assert report["sections"]["caps"]["fits"]["peak_bytes"] <= report["sections"]["caps"]["fits"]["cap_bytes"]
    assert "cap" in report["sections"]["caps"]["over"]["message"]
    assert report["sections"]["time"]["one_rank"]["iteration_ms"] > 0
    assert (tmp_path / "gpu_check.md").read_text().startswith("# GPU check")


FORK_OR_SPAWN = """
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import gpu_check
work = Path(sys.argv[2])
(work / "script.py").write_text(
    "import os, sys\\nprint(sys.argv[1:], os.getcwd(), os.environ['MARK'], sys.path[0])\\n"
    "print('to stderr', file=sys.stderr)\\nsys.exit(int(sys.argv[1]))\\n")
env = dict(os.environ, MARK="marked", PYTHONPATH=sys.argv[3])
got = []
for args in (["-m", "planner.cli", "--version"], ["-m", "planner.cli", "solve", "--profile", "missing.json"],
             [str(work / "script.py"), "3"], [str(work / "script.py"), "0"]):
    forked = gpu_check._forked(args, cwd=work, env=env, timeout=60)
    spawned = subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True)
    got.append([[forked.returncode, forked.stdout, forked.stderr], [spawned.returncode, spawned.stdout, spawned.stderr]])
(work / "slow.py").write_text("import time\\ntime.sleep(60)\\n")
try:
    gpu_check._forked([str(work / "slow.py")], cwd=work, env=env, timeout=0.5)
except subprocess.TimeoutExpired:
    timed_out = True
else:
    timed_out = False
print(json.dumps({"runs": got, "timed_out": timed_out}))
"""


def test_a_forked_command_gives_what_a_new_python_gives(tmp_path):
    """The dry run forks each command (gpu_check._forked) where the GPU run starts a new Python:
    the same exit status, output and error, folder, environment and arguments; one past its
    time is killed and raises as subprocess.run does. (Compared in a process of its own: this
    one, a pytest-xdist worker, has threads of its own that a fork would copy.)"""
    done = subprocess.run([sys.executable, "-c", FORK_OR_SPAWN, str(ROOT / "scripts"), str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    for forked, spawned in report["runs"]:
        assert forked == spawned
    codes = [forked[0] for forked, _ in report["runs"]]
    assert codes[0] == 0 and codes[1] != 0 and codes[2:] == [3, 0]
    assert "marked" in report["runs"][2][0][1] and report["runs"][2][0][2] == "to stderr\n"
    assert report["timed_out"]
