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
