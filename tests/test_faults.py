"""Faults a launched job must end cleanly, naming the stage at fault: a frozen or hung
rank (heartbeat), a start-up that never finishes, a rank that exits 0 mid-run, and
SIGTERM to the launcher. The rules are unit-tested on made-up heartbeats; each fault
once more end to end, with short timeouts and generous bounds on the wall time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT
from fixtures.processes import children, gone, ranks_of
from fixtures.rt_plans import make_plan

import planner.runtime.launcher as launcher
from planner.errors import UserError
from planner.io import save_plan
from planner.runtime import run_plan
from planner.runtime.heartbeat import WAITING, Beat, Heartbeat, collective, find_stall, read_beat
from planner.schema import TrainSetup

FIXTURES = ROOT / "tests" / "fixtures"
FAULTS = FIXTURES / "stage_faults.py"
TINY = FIXTURES / "rt_tiny.py"
NOW = 1000.0


def _beat(phase=WAITING, *, since=990.0, working=False, started=True, time=NOW):
    return Beat(time=time, phase=phase, since=since, working=working, started=started)


def _stall(beats, *, launched=900.0, start=60.0, progress=20.0):
    return find_stall(beats, now=NOW, launched=launched, start_timeout_s=start, progress_timeout_s=progress)


# ---------------------------------------------------------------- the rules


def test_a_moving_job_has_no_stall():
    beats = {0: _beat(), 1: _beat("a forward", since=995.0, working=True), 2: _beat(since=950.0)}
    assert _stall(beats) is None


def test_a_frozen_process_is_named_by_its_silent_beat():
    beats = {0: _beat(since=950.0), 1: _beat("a backward", since=970.0, working=True, time=975.0)}
    assert _stall(beats) == (1, "stage 1 stopped making progress: its process has not run for 25 s "
                                "(frozen or stopped, e.g. SIGSTOP), last in a backward")


def test_a_rank_stuck_in_its_own_work_is_named_not_the_ranks_waiting_for_it():
    beats = {0: _beat(since=940.0), 1: _beat("a forward", since=975.0, working=True), 2: _beat(since=930.0)}
    assert _stall(beats) == (1, "stage 1 stopped making progress: 25 s in a forward without finishing "
                                "(limit 20 s, --progress-timeout)")


def test_start_up_is_bounded_and_names_where_it_hung():
    beats = {0: _beat("build_model() of m.py", since=901.0, working=True, started=False),
             1: _beat("build_model() of m.py", since=902.0, working=True, started=False)}
    assert _stall(beats, start=120.0) is None  # 100 s since launch
    assert _stall(beats, start=60.0) == (0, "stages 0, 1 did not start within 60 s (--start-timeout): "
                                            "hung in build_model() of m.py")


def test_a_start_hang_blames_the_working_rank_not_the_one_waiting_for_it():
    beats = {0: _beat("joining the process group", since=905.0, started=False),
             1: _beat("importing m.py", since=903.0, working=True, started=False),
             2: None}
    assert _stall(beats, start=60.0) == (1, "stages 1, 2 did not start within 60 s (--start-timeout): "
                                            "stage 1 in importing m.py; stage 2 in importing torch and ckplan")


def test_when_every_stage_waits_the_first_to_stop_is_named():
    beats = {0: _beat(since=975.0), 1: _beat(WAITING, since=960.0), 2: _beat(since=970.0)}
    assert _stall(beats) == (1, "stage 1 stopped making progress: no stage has for 20 s, and stage 1 stopped "
                                "first, 40 s ago (a wait for a neighbour)")
    assert _stall(beats, progress=35.0) is None


def test_with_data_parallelism_a_rank_is_named_by_its_stage():
    # dp = 2: ranks 0, 1 run stage 0, ranks 2, 3 stage 1
    beats = {0: _beat(since=950.0), 1: _beat(since=950.0), 2: _beat("a forward", since=975.0, working=True),
             3: _beat(since=950.0)}
    assert find_stall(beats, now=NOW, launched=900.0, start_timeout_s=60.0, progress_timeout_s=20.0, dp=2) == (
        2, "stage 1 (rank 2) stopped making progress: 25 s in a forward without finishing (limit 20 s, "
           "--progress-timeout)")


def test_a_rank_stuck_in_a_collective_after_the_hung_one_is_not_blamed():
    """--dp 2: rank 3 hung in a forward; rank 0 of stage 0, healthy, then waited in its step for
    the replica that waits for rank 3. The first to stop is named, three times out of three."""
    beats = {0: _beat("the optimizer step", since=975.0, working=True), 1: _beat(since=972.0),
             2: _beat(since=960.0), 3: _beat("a forward", since=958.0, working=True)}
    assert find_stall(beats, now=NOW, launched=900.0, start_timeout_s=60.0, progress_timeout_s=10.0, dp=2) == (
        3, "stage 1 (rank 3) stopped making progress: 42 s in a forward without finishing (limit 10 s, "
           "--progress-timeout)")


def test_a_rank_inside_a_collective_waits_and_its_partner_in_its_own_compute_is_named(tmp_path):
    """Rank 0 began its forward first and now waits in the experts' all-to-all inside it; rank 1,
    later into its forward, is stuck in its own compute: rank 1 is named."""
    with Heartbeat(tmp_path / "rank0.beat") as beat:
        beat.training()
        with beat.phase("a forward", working=True):
            with collective("the experts' all-to-all"):
                inside = beat._phase  # what the beat thread writes next
                assert (inside[0], inside[2]) == ("the experts' all-to-all", False)
            after = beat._phase
            assert after[0] == "a forward" and after[2]  # the forward goes on after the exchange
    with collective("no rank here"):  # outside a rank: nothing to mark
        pass
    beats = {0: _beat("the experts' all-to-all", since=950.0), 1: _beat("a forward", since=960.0, working=True)}
    rank, message = _stall(beats)
    assert rank == 1 and message.startswith("stage 1 stopped making progress: 40 s in a forward")


def test_heartbeat_writes_what_the_rank_does(tmp_path):
    path = tmp_path / "rank0.beat"
    with Heartbeat(path) as beat:
        assert read_beat(path).phase == "starting" and not read_beat(path).started
        with beat.phase("build_model() of m.py", working=True):
            beat._write()
            assert read_beat(path).phase == "build_model() of m.py" and read_beat(path).working
        beat.training()
        with beat.phase("a forward", working=True):
            pass
        beat.stepped(3, 8)
        beat._write()
        written = read_beat(path)
    assert (written.phase, written.working, written.started, written.steps) == (WAITING, False, True, (3, 8))
    record = {"time": 1.0, "phase": "a forward", "since": 1.0, "working": True, "started": True}
    path.write_text(__import__("json").dumps(record))  # a beat without steps (a rank of an older ckplan)
    assert read_beat(path).steps == (0, 0)


def test_the_launcher_tells_the_steps_every_rank_has_done():
    told = []
    watch = launcher._Watch(60.0, 20.0, on_steps=lambda done, total: told.append((done, total)))
    beats = {0: _beat(), 1: _beat()}
    beats = {0: Beat(**{**beats[0].__dict__, "steps": (3, 8)}), 1: Beat(**{**beats[1].__dict__, "steps": (2, 8)})}
    shown = launcher._tell_steps(watch, beats, [None, None], (0, 0))
    assert shown == (2, 8) and told == [(2, 8)]  # the slowest rank's
    assert launcher._tell_steps(watch, beats, [None, None], shown) == (2, 8) and len(told) == 1  # unchanged: silent
    assert launcher._tell_steps(watch, beats, [0, 0], shown) == (8, 8) and told[-1] == (8, 8)  # both exited 0


# ---------------------------------------------------------------- end to end


def _ends_within(limit_s: float, match: str, plan, **kwargs) -> str:
    started = time.monotonic()
    with pytest.raises(UserError) as info:
        run_plan(plan, steps=2, warmup_steps=1, **kwargs)
    assert time.monotonic() - started < limit_s
    text = str(info.value)
    assert "Traceback" not in text and "\n" not in text
    assert text.startswith(match), text
    return text


@pytest.mark.slow
def test_a_frozen_rank_is_named_within_the_progress_timeout(monkeypatch):
    monkeypatch.setenv("FAULT", "freeze")
    plan = make_plan(FAULTS, [["0", "1"], ["2", "3"]])
    # the gloo timeout (60 s) is far away: only the heartbeat can tell
    _ends_within(60, "stage 1 stopped making progress: its process has not run for", plan, progress_timeout_s=5)


@pytest.mark.slow
def test_under_data_parallelism_the_hung_replica_is_named_not_a_healthy_rank_waiting_for_it(monkeypatch):
    from planner.commands.launch import with_dp

    monkeypatch.setenv("FAULT", "hang")
    monkeypatch.setenv("FAULT_RANK", "3")
    plan = with_dp(make_plan(FAULTS, [["0", "1"], ["2", "3"]]), 2)
    _ends_within(60, "stage 1 (rank 3) stopped making progress: ", plan, progress_timeout_s=5)


@pytest.mark.slow
def test_a_rank_hung_in_its_forward_is_named(monkeypatch):
    monkeypatch.setenv("FAULT", "hang")
    plan = make_plan(FAULTS, [["0"], ["1"], ["2", "3"]])
    text = _ends_within(60, "stage 2 stopped making progress: ", plan, progress_timeout_s=5)
    assert " s in a forward without finishing (limit 5 s, --progress-timeout)" in text


def test_a_build_that_hangs_in_the_launcher_is_bounded(monkeypatch):
    """The launcher builds the model (on meta) to check the plan's layer names first."""
    monkeypatch.setenv("HANG", "everywhere")
    plan = make_plan(FIXTURES / "hang_in_build.py", [["0"], ["1"]])
    _ends_within(30, "checking the plan against hang_in_build.py (importing it, build_model() on the meta device) "
                     "did not finish within 2 s (--start-timeout) while running line 15 of hang_in_build.py: "
                     "`time.sleep(3600)`", plan, start_timeout_s=2)


@pytest.mark.slow
def test_a_start_up_hang_in_the_ranks_is_bounded_and_named():
    plan = make_plan(FIXTURES / "hang_in_build.py", [["0"], ["1"]])
    # 30 s: on a busy machine importing torch alone can take 20 s, and that is not this hang
    _ends_within(90, "stages 0, 1 did not start within 30 s (--start-timeout): hung in build_model() of "
                     "hang_in_build.py", plan, start_timeout_s=30)


@pytest.mark.slow
def test_a_rank_that_exits_0_mid_run_is_named(monkeypatch):
    monkeypatch.setenv("FAULT", "exit0")
    plan = make_plan(FAULTS, [["0", "1"], ["2", "3"]])
    _ends_within(60, "stage 1 exited with code 0 before finishing its steps (something in the model file ended the process", plan)




@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_to_the_launcher_ends_the_run_like_ctrl_c(tmp_path):
    plan_path = tmp_path / "plan.yaml"
    save_plan(make_plan(TINY, [["0", "1"], ["2", "3", "4"]]), plan_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "RT_FAULT": "hang", "TMPDIR": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "launch", str(plan_path), "--steps", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(ranks := ranks_of(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(ranks) == 2
    ranks += children(proc.pid)  # its fork server too
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "terminated (SIGTERM): all stages were stopped and no output was written" in err
    assert "Traceback" not in err
    assert all(gone(pid) for pid in ranks)
    assert list(scratch.glob("ckplan-run-*")) == []


def test_the_default_progress_timeout_grows_with_the_slowest_stage():
    plan = make_plan(TINY, [["0", "1"], ["2", "3", "4"]])  # stages predicted at 10 ms
    assert launcher.default_progress_timeout_s(plan.stages) == launcher.PROGRESS_TIMEOUT_S
    slow = [stage.model_copy(update={"predicted": stage.predicted.model_copy(update={"time_ms": 9000.0})})
            for stage in plan.stages]
    assert launcher.default_progress_timeout_s(slow) == 90.0


def test_a_failure_under_data_parallelism_names_the_stage_and_rank_of_its_log(tmp_path):
    """With --dp the log line said 'log of stage 3' for rank 3, which runs stage 1."""
    import time

    from planner.runtime.launcher import Failure, _failure_message

    for rank in range(4):
        (tmp_path / f"rank{rank}.log").write_text(f"log of rank {rank}\n")
    (tmp_path / "rank3.error.json").write_text(
        Failure(rank=3, message="stage 1 (rank 3) raised ValueError", peer=False, time=time.time()).model_dump_json())
    message = _failure_message([0, 0, 0, 1], tmp_path, dp=2)
    assert "log of stage 1 (rank 3):" in message and "log of stage 3" not in message


@pytest.mark.slow
def test_a_nan_is_named_by_the_stage_step_and_microbatch_where_it_first_appeared():
    """Stage 0 passes the negative sample of microbatch 2 on, finite; stage 1's log makes it NaN.
    launch stopped with a traceback, or trained on NaN losses."""
    plan = make_plan(FIXTURES / "nan_at_stage_one.py", [["0"], ["1", "2", "3"]], microbatches=4, micro_batch_size=2)
    _ends_within(120, "stage 1 failed: a NaN or infinity first appeared in its forward output at step 0, "
                      "microbatch 2", plan)


@pytest.mark.slow
@pytest.mark.parametrize("hung", [1, 0])
def test_under_expert_parallelism_the_rank_hung_in_its_moe_forward_is_named_not_its_partner(monkeypatch, hung):
    """One stage on dp 2 x ep 2: a rank hangs in its MoE forward, and its expert-parallel partner
    waits inside the all-to-all for it. The partner was named in 3 of 4 runs (its forward began
    first), and its log kept. Each rank hung in turn, three times: the hung one is named each time."""
    monkeypatch.setenv("FAULT_RANK", str(hung))
    monkeypatch.setenv("FAULT_AFTER", "6")  # mid-run: past shape inference and the warm-up step
    plan = make_plan(FIXTURES / "moe_hang.py", [["embed", "blocks.0", "blocks.1", "head"]], microbatches=2)
    plan.setup = TrainSetup.model_validate({**plan.setup.model_dump(), "dp": 2, "ep": 2})
    for _ in range(3):
        text = _ends_within(90, f"stage 0 (rank {hung}) stopped making progress: ", plan, progress_timeout_s=4)
        assert " in a forward without finishing" in text and text.endswith(f"rank{hung}.log)"), text
