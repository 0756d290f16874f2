"""The test session's temporary files stay under pytest's folder (conftest.temporary_folder):
a failed launch's kept log, which a user finds in the real temporary folder, lands there in a
test, and nothing of it in the real one."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT
from fixtures.rt_plans import make_plan

from planner.errors import UserError
from planner.runtime import run_plan

FAULTS = ROOT / "tests" / "fixtures" / "stage_faults.py"


@pytest.mark.slow
def test_a_failed_launch_keeps_its_log_under_the_sessions_folder(monkeypatch, temporary_folder):
    folder, real = temporary_folder
    assert tempfile.gettempdir() == str(folder) != str(real)
    monkeypatch.setenv("FAULT", "exit0")
    before = set(folder.glob("ckplan-run-*"))  # other tests' runs share the session's folder
    with pytest.raises(UserError) as info:
        run_plan(make_plan(FAULTS, [["0", "1"], ["2", "3"]]), steps=2, warmup_steps=1)
    kept = Path(re.search(r"\(log of stage 1: (\S+)\)$", str(info.value)).group(1))
    assert kept.is_file() and kept.name == "rank1.log"
    assert kept.parent.parent == folder and kept.parent.name.startswith("ckplan-failed-")
    assert not (real / kept.parent.name).exists()
    assert set(folder.glob("ckplan-run-*")) <= before  # this run's scratch folder, removed as for a user
