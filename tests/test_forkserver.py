"""Ranks forked from the fork server (planner/runtime/forkserver.py) behave as ranks started as
a new Python: the same process as the rank sees it, the same training, the same end; and no
process the server or its ranks are outlives the launcher."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import ROOT
from fixtures.processes import children, gone
from fixtures.rt_plans import make_plan

from planner.errors import UserError
from planner.runtime import run_plan
from planner.runtime.forkserver import RankServer

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not RankServer.available(), reason="the fork server is Linux only")]

PROBE = ROOT / "tests" / "fixtures" / "rt_probe.py"
TINY = ROOT / "tests" / "fixtures" / "rt_tiny.py"
STAGES = [["0", "1"], ["2", "3", "4"]]


def _probed_run(folder: Path, monkeypatch, **how) -> tuple[list[dict], object]:
    """A 2-stage run of rt_probe.py from `folder`; what each rank saw, and the report."""
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("RT_PROBE", str(folder))
    report = run_plan(make_plan(PROBE, STAGES), steps=2, warmup_steps=1, **how)
    seen = [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank in seen:
        rank["env"].pop("MASTER_PORT")  # a free port per run
        rank["env"].pop("RT_PROBE")  # the folder of each run
        rank["argv"][1] = Path(rank["argv"][1]).name  # job.json in each run's scratch folder
        rank["cwd"] = Path(rank["cwd"]).name
    return seen, report


def test_a_forked_rank_sees_what_a_spawned_one_does(tmp_path, monkeypatch):
    """Environment (the launcher's at the request, not the server's at its start), folder,
    arguments, streams, session, threads, signal handlers and CUDA state; and the run trains
    to the same losses."""
    monkeypatch.setenv("CKPLAN_FORK_TEST", "set after the server started")
    with RankServer() as server:
        (tmp_path / "tmp").mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # read by tempfile, which the server's imports ran
        forked, forked_report = _probed_run(tmp_path / "run", monkeypatch, rank_server=server)
    spawned, spawned_report = _probed_run(tmp_path / "run2", monkeypatch, spawn=True)
    for rank, (fork, spawn) in enumerate(zip(forked, spawned, strict=True)):
        spawn["cwd"] = fork["cwd"]  # two folders, one name each: compare the rest
        assert fork == spawn, rank
    assert forked[0]["env"]["CKPLAN_FORK_TEST"] == "set after the server started"
    assert forked[0]["tmp"] == str(tmp_path / "tmp")
    assert forked[1]["stdin"] == "/dev/null" and forked[1]["stdout"] == forked[1]["stderr"] == "rank1.log"
    assert forked[0]["own_session"] and forked[0]["parent_alive"] and not forked[0]["bad_fork"]
    assert forked_report.losses == spawned_report.losses
    assert forked_report.device == spawned_report.device


def test_one_server_serves_many_runs_and_ends_with_close(tmp_path, monkeypatch):
    """compare's rounds share a server: each run's ranks are forked anew and reaped; closing it
    leaves nothing running."""
    monkeypatch.chdir(tmp_path)
    plan = make_plan(TINY, STAGES)
    with RankServer() as server:
        losses = [run_plan(plan, steps=1, warmup_steps=0, rank_server=server).losses for _ in range(2)]
        ranks = children(server.pid)
        assert ranks == []  # each run's ranks ended with it
    assert losses[0] == losses[1]
    assert gone(server.pid)


def test_a_dead_server_is_one_sentence(tmp_path):
    server = RankServer()
    os.kill(server.pid, 9)
    with pytest.raises(UserError, match=r"^the rank fork server exited with code -9 before starting a rank"):
        server.start(tmp_path / "job.json", env=dict(os.environ), log_path=tmp_path / "rank0.log")
    server.close()


def test_a_run_in_its_own_process_leaves_no_process(tmp_path, monkeypatch):
    """The server a run starts for itself ends with the run (the suite's other runs borrow one
    server: conftest._one_rank_server). In this process, with launcher.RankServer the real one
    again: the run starts its server as this process's child, and none of this process's
    children is left after it that was not there before (the worker's shared server is)."""
    import planner.runtime.launcher as launcher

    monkeypatch.setattr(launcher, "RankServer", RankServer)
    monkeypatch.chdir(tmp_path)
    before = set(children(os.getpid()))
    started = []
    real_init = RankServer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self.pid)

    monkeypatch.setattr(RankServer, "__init__", init)
    report = run_plan(make_plan(TINY, STAGES), steps=1, warmup_steps=0)
    assert report.losses[-1] > 0
    assert len(started) == 1 and started[0] not in before  # a server of the run's own, not the shared one
    assert set(children(os.getpid())) - before == set() and gone(started[0])
