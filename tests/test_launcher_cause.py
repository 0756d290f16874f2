"""The launcher names the failure's cause, not its echo, when the echo is seen first: a rank that reports its
peer's closed connection can exit before the killed peer's death is reaped."""
import time

from planner.runtime import launcher
from planner.runtime.worker import Failure


class Rank:
    """A rank whose exit code shows after `after` polls (None before)."""

    def __init__(self, code, after=0):
        self.code, self.after, self.polls = code, after, 0

    def poll(self):
        self.polls += 1
        return self.code if self.polls > self.after else None


def _ranks(tmp_path, killed_after):
    for rank in range(3):
        (tmp_path / f"rank{rank}.log").write_text(f"rank {rank}\n")
    echo = Failure(rank=2, message="stage 2 failed: RuntimeError: Connection closed by peer", peer=True, time=time.time())
    (tmp_path / "rank2.error.json").write_text(echo.model_dump_json())
    return [Rank(None), Rank(-9, after=killed_after), Rank(1)]


def test_a_killed_ranks_death_seen_after_its_neighbours_echo_is_named_as_the_cause(tmp_path):
    procs = _ranks(tmp_path, killed_after=3)
    codes = [proc.poll() for proc in procs]
    assert codes == [None, None, 1]  # only the echo is seen yet
    codes = launcher._await_cause(procs, codes, tmp_path)
    assert codes[1] == -9
    assert launcher._failure_message(codes, tmp_path).startswith("stage 1 died (SIGKILL); all stages were stopped")


def test_an_echo_with_no_cause_is_reported_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "CAUSE_GRACE_S", 0.2)
    procs = _ranks(tmp_path, killed_after=10**9)  # the peer never ends: a hang, not a death
    started = time.monotonic()
    codes = launcher._await_cause(procs, [proc.poll() for proc in procs], tmp_path)
    assert 0.2 <= time.monotonic() - started < 5
    message = launcher._failure_message(codes, tmp_path)
    assert message.startswith("stage 2 failed: RuntimeError: Connection closed by peer")
