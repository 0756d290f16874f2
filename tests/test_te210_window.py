"""Transformer Engine v2.10's offload handler (DefaultOffloadSynchronizer, cpu_offload.py 522-593 at v2.10, the
same at 4329ff84, the TE Megatron-LM d98e8a64 pins; docs/framework-facts.md §425-§430), which the megatron record
at d98e8a64 names (`te_window_handler` "v2.10") and the Bridge's megatron-core 92c8482e does not (TE v2.9): its
map by hand, the most it holds by brute force, its one copy stream's waits by hand, the replay's requests by hand,
the tiny job's replayed need at N = 0..3 under both, and the export the same under both."""

from __future__ import annotations

import itertools

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_window_replay import LAYERS, OPTIONS, RECORDS

from planner import io
from planner.cost import costmodel, reserve_megatron, runtimes, te_offload
from planner.cost.allocator import Alloc, Free, replay
from planner.cost.float8 import float8_profile
from planner.cost.reserve_window import WindowPasses
from planner.schema import OPTION_OFFLOAD, StagePlan

MIB = 2**20
V210 = te_offload.V210


def test_v2_10_s_map_by_hand():
    # _init_offload_synchronization_dicts: layer i released before layer L - N + i's forward, reloaded before
    # layer L - 1 - N + i's backward: the window's last layer L - N - 1 + i both ways
    assert te_offload.window_map(4, 1, handler=V210) == [2]
    assert te_offload.window_map(4, 2, handler=V210) == [1, 2]
    assert te_offload.window_map(4, 3, handler=V210) == [0, 1, 2]  # N = L - 1: each released as the next begins
    assert te_offload.window_map(80, 40, handler=V210) == [39 + i for i in range(40)]  # B3's shape
    assert te_offload.window_map(80, 40) == [2 * i + 1 for i in range(40)]  # v2.9's (§107)
    with pytest.raises(ValueError):
        te_offload.window_map(4, 4, handler=V210)  # "Cannot offload all layers" (get_cpu_offload_context)


@pytest.mark.parametrize(("num_layers", "num_offload"),
                         [(L, N) for L in range(2, 9) for N in range(1, L)])
def test_the_most_held_is_l_minus_n_layers_against_v2_9_s_one_more(num_layers, num_offload):
    # brute force over the layers: the saved sets on the device while layer k runs (the layers not offloaded up
    # to k and the groups held beside it); TE v2.10's docstring: "(num_layers - num_offloaded_layers) * T"
    def most(handler):
        return max(max(0, k - num_offload + 1) + len(te_offload.held_groups(num_layers, num_offload, k,
                                                                             handler=handler))
                   for k in range(num_layers))
    assert most(V210) == num_layers - num_offload
    assert most("v2.9") == num_layers - num_offload + 1


def test_one_stream_s_waits_by_hand():
    # L = 4, N = 2 (window [1, 2]), forwards 1 ms, backwards 2 ms, each group's copy 3 ms. Forward: copy 0 issued
    # as layer 1 begins (t 1), done at 4; copy 1 issued as layer 2 begins (t 2), queued behind it: done at 7;
    # layer 2 begins waiting for copy 0 (2 ms: t 4), layer 3 for copy 1 (t 5 -> 7: 2 ms). Backward: reload 1
    # issued as layer 2's backward begins (t 2), done at 5; reload 0 as layer 1's begins (t 4), behind it: 8;
    # layer 1 waits for reload 1 (t 4 -> 5: 1 ms), layer 0 for reload 0 (t 7 -> 8: 1 ms)
    got = te_offload.exposed_ms([3, 3, 9, 9], [1.0] * 4, [2.0] * 4, 2, ms_per_byte=1.0, handler=V210)
    assert got == [(2.0, 1.0), (2.0, 1.0)]
    # v2.9 (window [1, 3], a stream each way, each copy beside its window): group 0 beside layer 1 (3 - 1 forward,
    # 3 - 2 backward), group 1 beside layers 2-3 (3 - 2, 0)
    assert te_offload.exposed_ms([3, 3, 9, 9], [1.0] * 4, [2.0] * 4, 2, ms_per_byte=1.0) == [(2.0, 1.0), (1.0, 0.0)]
    # N = L - 1: nothing to hide behind, each copy whole
    assert te_offload.exposed_ms([3, 3, 3, 9], [1.0] * 4, [2.0] * 4, 3, ms_per_byte=1.0, handler=V210) == [
        (3.0, 3.0)] * 3


def test_v2_10_s_requests_by_hand():
    # the records of test_window_replay (an embedding, 4 blocks: 3 MiB saved, 5 MiB scratch, 2 MiB output), blocks
    # 1-2 offloaded: window [1, 2], so group 0 (stage layer 1) is freed after stage layer 2's forward and reloaded
    # before its backward, group 1 (layer 2) after layer 3's, before its; a reload held to the layer's end
    events = []
    passes = WindowPasses(LAYERS, OPTIONS, RECORDS, None, events, window=([1, 2, 3, 4], 2), handler=V210)
    passes.forward(0)
    forward = len(events)
    passes.backward(0)
    assert events[:forward] == [
        Alloc((0, 0, 1), 2 * MIB),
        Alloc((0, 1, 1), 3 * MIB), Alloc((0, 1, 2), 5 * MIB), Free((0, 1, 2)), Alloc((0, 1, 3), 2 * MIB),  # group 0
        Alloc((0, 2, 1), 3 * MIB), Alloc((0, 2, 2), 5 * MIB), Free((0, 2, 2)), Alloc((0, 2, 3), 2 * MIB),  # group 1
        Free((0, 0, 1)), Free((0, 1, 1)),  # before layer 3's forward: group 0 released
        Alloc((0, 3, 1), 3 * MIB), Alloc((0, 3, 2), 5 * MIB), Free((0, 3, 2)), Alloc((0, 3, 3), 2 * MIB),
        Free((0, 1, 3)), Free((0, 2, 1)),  # before layer 4's: group 1 (v2.9: after layer 4's)
        Alloc((0, 4, 1), 3 * MIB), Alloc((0, 4, 2), 5 * MIB), Free((0, 4, 2)), Alloc((0, 4, 3), 2 * MIB),
    ]
    assert events[forward:] == [
        Alloc((0, 4, 4), 2 * MIB), Free((0, 4, 1)), Free((0, 4, 3)), Free((0, 3, 3)),  # layer 4
        Alloc(("back", 0, 1, 3), 2 * MIB), Alloc(("back", 0, 2, 1), 3 * MIB),  # before layer 3's backward: group 1
        Alloc((0, 3, 4), 2 * MIB), Free((0, 3, 1)), Free((0, 4, 4)), Free((0, 2, 3)),  # layer 3
        Alloc(("back", 0, 0, 1), 2 * MIB), Alloc(("back", 0, 1, 1), 3 * MIB),  # before layer 2's: group 0
        # layer 2 on group 1's reloads, which autograd's frees leave to bwd_gpu_tensor_group
        Alloc((0, 2, 4), 2 * MIB), Free(("held", "back", 0, 2, 1)), Free((0, 3, 4)),
        Free(("held", "back", 0, 1, 3)), Free(("held", "back", 0, 2, 1)), Free((0, 1, 3)),
        Free(("back", 0, 1, 3)), Free(("back", 0, 2, 1)),  # layer 1's bwd_step: layer 2's state released
        Alloc((0, 1, 4), 2 * MIB), Free(("held", "back", 0, 1, 1)), Free((0, 2, 4)),  # layer 1
        Free(("held", "back", 0, 0, 1)), Free(("held", "back", 0, 1, 1)), Free((0, 0, 1)),
        Free((0, 1, 4)),  # the embedding's backward: the input gradient
        Free(("back", 0, 0, 1)), Free(("back", 0, 1, 1)),  # finish_part_of_bwd, the backward's end
    ]
    # by hand: the forward asks for at most 15 MiB (at layer 2's scratch: group 0's 5 + layer 2's 3 + 5 and its
    # input 2), against v2.9's 20 MiB at layer 4's (test_window_replay); the backward at layer 2's for 14 MiB
    # (both groups' reloads, 5 + 5, and two input gradients), in blocks 2 MiB larger: group 1's 3 MiB reload
    # takes a cached 4 MiB block and group 0's 2 MiB one a 3 MiB block whole (the large pool splits a block
    # only where more than 1 MiB is left): 16 MiB, one 20 MiB segment
    live, asked = {}, []  # the bytes asked for and not yet freed, after each event
    for event in events:
        if isinstance(event, Alloc):
            live[event[0]] = event[1]
        else:
            live.pop(event[0], None)
        asked.append(sum(live.values()))
    most = max(asked)
    assert (max(asked[:forward]), max(asked[forward:])) == (15 * MIB, 14 * MIB)
    got = replay(events)
    assert (most, got.allocated_peak_bytes, got.reserved_peak_bytes, got.segments) == (15 * MIB, 16 * MIB, 20 * MIB, 1)
    v29 = []
    WindowPasses(LAYERS, OPTIONS, RECORDS, None, v29, window=([1, 2, 3, 4], 2)).forward(0)
    assert replay(v29).allocated_peak_bytes == 20 * MIB


def test_the_records_name_their_handler():
    assert runtimes.facts("megatron").te_window_handler == V210  # d98e8a64 (TE 4329ff84)
    assert runtimes.facts("megatron", "92c8482e").te_window_handler == "v2.9"  # the Bridge's (TE v2.9)
    assert "cpu_offload.py" in runtimes.facts("megatron").sources["te_window_handler"]
    assert "4329ff84" in runtimes.facts("megatron").sources["te_window_handler"]


def _tiny(tmp_path):
    out = tmp_path / "tiny.json"
    run_ok("profile", "--arch-config", _tiny_config(tmp_path), "--seq-len", "2048", "--gpu", "gb200",
           "--micro-batch-size", "1", "--out", out)
    return out


def _version(setup, version):
    return setup.model_copy(update={"training": setup.training.model_copy(update={"runtime_version": version})})


def test_the_tiny_job_s_replayed_need_at_n_0_to_3_under_both(tmp_path):
    """The tiny Megatron job (4 decoder layers) at micro-batch 1: each layer's saved set, its input among them,
    is one group; the replay's device need (its reserved peak) at N = 0..3 under both handlers. v2.10 holds at
    most L - N groups' worth where v2.9 holds L - N + 1, so at each N > 0 it needs less, and at N = 0 (no
    window) the two are one replay. The window's bytes by hand: the cost model's extra beside each block layer
    is the groups its map holds there, each group a layer's none-kept bytes."""
    profile_path = _tiny(tmp_path)
    run_ok("solve", "--profile", profile_path, "--mem", "2GB", "--stages", "1", "--microbatches", "8",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--out", tmp_path / "plan.yaml")
    base = io.load_plan(tmp_path / "plan.yaml").setup
    needs = {}
    for version in ("d98e8a64", "92c8482e"):
        setup = _version(base, version)
        profile = float8_profile(io.load_profile(profile_path), setup)
        names = [layer.name for layer in profile.layers]
        for count in range(4):
            plan = StagePlan(index=0, layers=names, recompute={f"layers.{i}": OPTION_OFFLOAD for i in range(count)})
            cost = costmodel.evaluate([plan], profile, setup)
            replayed = reserve_megatron.replay_stage(plan, cost.stages[0], stage=0, profile=profile, setup=setup)
            needs[(version, count)] = replayed.reserved_peak_bytes
    assert needs[("d98e8a64", 0)] == needs[("92c8482e", 0)]
    for count in range(1, 4):  # v2.10 needs less at every N, and each N lowers it (v2.9's N = 1 did not, §379)
        assert needs[("d98e8a64", count)] < needs[("92c8482e", count)]
        assert needs[("d98e8a64", count)] < needs[("d98e8a64", count - 1)]
        assert needs[("92c8482e", count)] <= needs[("92c8482e", count - 1)]
    # the held groups by hand, L = 4: v2.10 at N = 2 (window [1, 2]) holds group 0 beside layers 0-1 and group
    # 1 beside layers 1-2; v2.9 (window [1, 3]) group 1 beside layers 1-3
    saved = [10, 20, 40, 80]
    assert te_offload.extra_bytes(saved, 2, handler=V210) == [10, 30, 20, 0]
    assert te_offload.extra_bytes(saved, 2) == [10, 30, 20, 20]


def test_solve_takes_v2_10_s_window_and_export_writes_the_same_flags(tmp_path):
    # on 650 MiB, the replay judging: at d98e8a64 (v2.10) the window at N = 2 fits (it holds a group fewer than
    # v2.9's, which needs N = 3 there: test_window_replay) and is faster than N = 3, whose copies have no layer
    # to hide behind (window[i] = i); export writes it as it writes v2.9's: the flags megatron-core reads
    profile_path, plan_path, script = _tiny(tmp_path), tmp_path / "plan.yaml", tmp_path / "plan.sh"
    run_ok("solve", "--profile", profile_path, "--mem", "650MiB", "--stages", "1", "--microbatches", "8",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--out", plan_path)
    plan = io.load_plan(plan_path)
    assert plan.stages[0].recompute == {f"layers.{i}": OPTION_OFFLOAD for i in range(2)}
    said = " ".join(run_ok("export", plan_path, "--to", "megatron", "--out", script).output.split())
    assert "rounded: nothing; the export is the plan exactly" in said
    text = script.read_text()
    assert "    --cpu-offloading\n    --cpu-offloading-num-layers 2\n" in text
    older = tmp_path / "plan29.yaml"
    io.save_plan(plan.model_copy(update={"setup": _version(plan.setup, "92c8482e")}), older)
    run_ok("export", older, "--to", "megatron", "--out", tmp_path / "plan29.sh")
    flags = [line for line in text.splitlines() if line.startswith("    --")]
    assert flags == [line for line in (tmp_path / "plan29.sh").read_text().splitlines() if line.startswith("    --")]


def test_v2_9_s_pairs_unchanged():
    # every pair the v2.9 map gave before is what it gives now (the handler's default)
    for num_layers, num_offload in itertools.product(range(2, 7), range(1, 6)):
        if num_offload < num_layers:
            assert te_offload.window_map(num_layers, num_offload) == te_offload.window_map(
                num_layers, num_offload, handler="v2.9")
