"""The replayed reserve's range (planner/cost/reserve_range.py): hand-counted sequences whose large request lands in
a cached hole or not with a page more, frees at one instant in either order, and the range where evaluate and solve
write it (docs/published-runs.md §33.modes)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from fixtures.cli import run_ok
from test_stage_json import GPT3, LLAMA8B

from planner.commands.stage_json import range_line
from planner.cost import allocator
from planner.cost.allocator import Alloc, Free
from planner.cost.reserve_range import LARGE_REQUEST_BYTES, PAGE_BYTES, VARIANTS, resized

MIB, GIB = 2**20, 2**30


def _reserved(events, perturb=None) -> int:
    return allocator.replay(events, perturb=perturb).reserved_peak_bytes


def test_a_page_more_takes_a_segment_the_hole_held():
    """A 511 MiB tensor takes a 512 MiB segment (2 MiB rounding) and its 1 MiB tail stays in its block (a split needs
    more than kSmallSize left); freed, it leaves a 512 MiB hole. A 512 MiB request fits it: 512 MiB reserved. A page
    larger (514 MiB) it does not: a second segment, 512 + 514 = 1,026 MiB. A page smaller (510) fits, split: 512."""
    events = [Alloc("hole", 511 * MIB), Free("hole"), Alloc("big", 512 * MIB), Free("big")]
    assert LARGE_REQUEST_BYTES == 512 * MIB and PAGE_BYTES == 2 * MIB
    assert _reserved(events) == 512 * MIB
    assert _reserved(events, resized(PAGE_BYTES)) == 1026 * MIB  # "hole" (511 MiB) is below the threshold: unchanged
    assert _reserved(events, resized(-PAGE_BYTES)) == 512 * MIB
    assert [_reserved(events, change) for change in VARIANTS] == [1026 * MIB, 512 * MIB]


def test_frees_at_one_instant_leave_the_same_cache_in_either_order():
    """Three 100 MiB tensors split from one 300 MiB segment (a 300 MiB tensor's, freed first), freed together in two
    orders: each free merges with its free neighbours, so either leaves the one 300 MiB block, which a 300 MiB
    request takes: 300 MiB reserved both ways, where holding the middle one would take a second segment (600)."""
    made = [Alloc("seg", 300 * MIB), Free("seg"), Alloc("a", 100 * MIB), Alloc("b", 100 * MIB), Alloc("c", 100 * MIB)]
    after = [Alloc("whole", 300 * MIB)]
    forward = made + [Free("a"), Free("b"), Free("c")] + after
    backward = made + [Free("c"), Free("a"), Free("b")] + after
    assert _reserved(forward) == _reserved(backward) == 300 * MIB
    assert _reserved(made + [Free("a"), Free("c")] + after) == 600 * MIB


def test_settled_replay_changes_the_static_events_and_every_step():
    """settled_replay's perturb acts on the static events and each step: the static 511 MiB hole, then each step's
    512 MiB request: as played 512 MiB; a page larger, a segment of 514 beside the hole."""
    static = [Alloc("hole", 511 * MIB), Free("hole")]
    step = lambda index: [Alloc(("big", index), 512 * MIB), Free(("big", index))]  # noqa: E731
    played = allocator.settled_replay(static, step, min_steps=2, max_steps=4)
    grown = allocator.settled_replay(static, step, min_steps=2, max_steps=4, perturb=resized(PAGE_BYTES))
    assert (played.reserved_peak_bytes, grown.reserved_peak_bytes) == (512 * MIB, 1026 * MIB)


def test_the_line_names_the_ranks_that_move():
    costs = SimpleNamespace(stages=[SimpleNamespace(reserved_bytes=70 * GIB), SimpleNamespace(reserved_bytes=76 * GIB)])
    line = range_line([(70 * GIB, 70 * GIB), (int(67.5 * GIB), 76 * GIB)], costs)
    assert line is not None and line.endswith("reserved rank 1 76.0 GiB in [67.5, 76.0]")
    assert range_line([(70 * GIB, 70 * GIB), None], costs) is None
    # a range a few MiB wide prints as one figure: no line (qwen3_1_7b on 8 B200 said "23.9 GiB in [23.9, 23.9]")
    assert range_line([(70 * GIB, 70 * GIB + 4 * 2**20), None], costs) is None


def test_evaluate_writes_the_range_where_fsdp2s_replay_ran():
    """torchtitan's 8B (FSDP2 over 8 GPUs): each rank's range holds its replayed reserve; Megatron-LM's replay: null."""
    ranks = json.loads(run_ok("evaluate", "--from-torchtitan", LLAMA8B, "--gpus", "8", "--json").stdout)["ranks"]
    for rank in ranks:
        assert rank["reserved_by"] == "replay"
        low, high = rank["reserved_range_bytes"]
        assert low <= rank["reserved_bytes"] <= high
    ranks = json.loads(run_ok("evaluate", "--from-megatron", GPT3, "--gpus", "4", "--json").stdout)["ranks"]
    assert all(rank["reserved_range_bytes"] is None for rank in ranks)


def test_evaluate_says_the_range_in_its_text_where_a_rank_moves(tmp_path):
    """evaluate --profile on torchtitan's 8B: the configuration's ranks carry the range in --json, and the text's
    line is there exactly where a rank's range does not print as one figure."""
    from test_stage_json import LLAMA8B_OPTIONS, _profile_of

    profile = _profile_of(LLAMA8B, tmp_path, megatron=False, gpus=8)
    options = ("--profile", profile, *LLAMA8B_OPTIONS, "--time-limit", "20")
    hand = json.loads(run_ok("evaluate", *options, "--json").stdout)["hand"]["stages"]
    spans = [stage["reserved_range_bytes"] for stage in hand]
    assert all(span is not None and span[0] <= stage["reserved_bytes"] <= span[1] for span, stage in zip(spans, hand))
    text = run_ok("evaluate", *options).stdout
    assert ("lands in another mode" in text) == any(f"{low / GIB:.1f}" != f"{high / GIB:.1f}" for low, high in spans)
