"""scripts/replay_trace.py traces a settled replay (allocator.settled_replay: FSDP2's, Megatron-LM's) as the one
sequence it plays: the traced rank's peaks are the settled replay's, over the same steps."""
import sys

from fixtures.scripts import load_script

from planner.cost import allocator
from planner.cost.allocator import Alloc, Free

MIB = 2**20


def _trace_module(monkeypatch):
    """The script, imported with the allocator's functions it replaces restored after the test."""
    monkeypatch.setattr(allocator, "replay", allocator.replay)
    monkeypatch.setattr(allocator, "settled_replay", allocator.settled_replay)
    return load_script("replay_trace")  # run afresh: its import patches the functions in


def _step(index):
    """A step whose requests grow the cache on its first two plays only: a 6 MiB block held across a 10 MiB one
    that the next step's 14 MiB cannot reuse until the third play finds the segments it left."""
    return [Alloc(("a", index), 6 * MIB), Alloc(("b", index), 10 * MIB), Free(("a", index)),
            Alloc(("c", index), 14 * MIB), Free(("b", index)), Free(("c", index))]


def test_a_settled_replay_is_traced_as_the_steps_it_plays(monkeypatch, capsys):
    settled = allocator.settled_replay
    static = [Alloc("weights", 20 * MIB)]
    expected = settled(static, _step, min_steps=2, max_steps=8)
    trace = _trace_module(monkeypatch)
    monkeypatch.setattr(trace, "RANK", 0)
    monkeypatch.setattr(trace, "OUT", sys.stdout)
    got = allocator.settled_replay(static, _step, min_steps=2, max_steps=8)  # the script's, patched in
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes) == (expected.allocated_peak_bytes, expected.reserved_peak_bytes)
    played = trace.calls[0]
    assert played[:1] == static and len(played) % len(_step(0)) == 1 and len(played) >= 1 + 2 * len(_step(0))
    line = [text for text in capsys.readouterr().out.splitlines() if text.startswith("rank 0:")][0]
    assert f"{len(played)} events" in line and f"reserved peak {expected.reserved_peak_bytes / 2**30:.3f} GiB" in line


def test_small_lists_the_small_pools_segments(monkeypatch, capsys):
    # 1,000 B and 1 MiB + 1 B: one 2 MiB small segment and one 20 MiB large one; SMALL=1 adds the small one's line
    trace = _trace_module(monkeypatch)
    monkeypatch.setattr(trace, "RANK", 0)
    monkeypatch.setattr(trace, "OUT", sys.stdout)
    events = [Alloc("tiny", 1000), Alloc("mid", MIB + 1)]
    for small, lines in ((False, 1), (True, 2)):
        monkeypatch.setattr(trace, "SMALL", small)
        trace.calls.clear()
        allocator.replay(events)  # the script's, patched in
        out = capsys.readouterr().out
        assert out.count(" segment ") == lines and ("small segment       2.0 MiB stream 0 for tiny" in out) == small
