"""The caching allocator's replay of Transformer Engine's offload window (planner/cost/reserve_window.py, TE v2.9
cpu_offload.py, docs/framework-facts.md §377-§379): each group's tensors made at its layer's forward, freed at the
end of layer window[g]'s forward, reloaded into new blocks before layer window[g]'s backward and freed after its own;
the request sequence counted by hand, and `ckplan solve` taking the window where the replay now admits it."""

from __future__ import annotations

import json

from fixtures.cli import run_ok
from test_launchers import _tiny_config

from planner import io
from planner.cost import costmodel, reserve_megatron, te_offload
from planner.cost.allocator import Alloc, Free, replay
from planner.cost.float8 import float8_profile
from planner.cost.reserve import _Step
from planner.cost.reserve_window import WindowPasses, layer_passes
from planner.schema import OPTION_OFFLOAD, AllocRecord, StagePlan

MIB = 2**20


class _Layer:  # what the layers' passes read of a LayerProfile
    fwd_ms = bwd_ms = 0.0
    recompute_options = ()

    def __init__(self, saves_input: int) -> None:
        self.input_in_act_bytes = saves_input  # none keeps the layer's input (TE's LayerNormLinear saves it)


# an embedding: its 2 MiB output (id 1); a block: a 3 MiB saved tensor (1), a 5 MiB scratch (2) freed, its 2 MiB
# output (3); backward its input's 2 MiB gradient (4), the saved tensor freed
EMBED = AllocRecord(forward=[2 * MIB], backward=[], output=1)
BLOCK = AllocRecord(forward=[3 * MIB, 5 * MIB, -2, 2 * MIB], backward=[2 * MIB, -1], output=3, input_grad=4)
LAYERS = [_Layer(0), *[_Layer(1)] * 4]
RECORDS = [EMBED, *[BLOCK] * 4]
OPTIONS = ["none", OPTION_OFFLOAD, OPTION_OFFLOAD, "none", "none"]


def test_the_window_s_requests_by_hand():
    # L = 4 blocks, N = 2: window = [1, 3] (cpu_offload.py 343-350), so group 0 (stage layer 1) is freed after
    # stage layer 2's forward and reloaded before its backward; group 1 (layer 2) after layer 4's, before its
    assert te_offload.window_map(4, 2) == [1, 3]
    events = []
    passes = WindowPasses(LAYERS, OPTIONS, RECORDS, None, events, window=([1, 2, 3, 4], 2))
    passes.forward(0)
    forward = len(events)
    passes.backward(0)
    assert events[:forward] == [
        Alloc((0, 0, 1), 2 * MIB),  # the embedding's output: block 0's input
        Alloc((0, 1, 1), 3 * MIB), Alloc((0, 1, 2), 5 * MIB), Free((0, 1, 2)), Alloc((0, 1, 3), 2 * MIB),  # group 0
        Alloc((0, 2, 1), 3 * MIB), Alloc((0, 2, 2), 5 * MIB), Free((0, 2, 2)), Alloc((0, 2, 3), 2 * MIB),  # group 1
        Free((0, 0, 1)), Free((0, 1, 1)),  # window[0]'s end: group 0 (its input, its saved tensor), cached at once
        Alloc((0, 3, 1), 3 * MIB), Alloc((0, 3, 2), 5 * MIB), Free((0, 3, 2)), Alloc((0, 3, 3), 2 * MIB),
        Alloc((0, 4, 1), 3 * MIB), Alloc((0, 4, 2), 5 * MIB), Free((0, 4, 2)), Alloc((0, 4, 3), 2 * MIB),
        Free((0, 1, 3)), Free((0, 2, 1)),  # window[1]'s end: group 1
    ]
    assert events[forward:] == [
        Alloc(("back", 0, 1, 3), 2 * MIB), Alloc(("back", 0, 2, 1), 3 * MIB),  # before layer 4's backward: group 1
        Alloc((0, 4, 4), 2 * MIB), Free((0, 4, 1)), Free((0, 4, 3)), Free((0, 3, 3)),  # layer 4 (not offloaded)
        Alloc((0, 3, 4), 2 * MIB), Free((0, 3, 1)), Free((0, 4, 4)), Free((0, 2, 3)),  # layer 3
        Alloc(("back", 0, 0, 1), 2 * MIB), Alloc(("back", 0, 1, 1), 3 * MIB),  # before layer 2's backward: group 0
        Alloc((0, 2, 4), 2 * MIB), Free(("back", 0, 2, 1)), Free((0, 3, 4)),  # layer 2 on its reloaded tensors
        Free(("back", 0, 1, 3)), Free(("back", 0, 2, 1)), Free((0, 1, 3)),  # freed after it (the rest: no-ops)
        Alloc((0, 1, 4), 2 * MIB), Free(("back", 0, 1, 1)), Free((0, 2, 4)),  # layer 1
        Free(("back", 0, 0, 1)), Free(("back", 0, 1, 1)), Free((0, 0, 1)),
        Free((0, 1, 4)),  # the stage's input gradient, sent
    ]


def test_the_window_frees_what_ckplan_s_per_layer_offload_holds():
    # the same step with ckplan's per-layer option (untimed: each saved block held, record_stream, until its
    # layer's backward) holds groups 0 and 1 through layers 3-4's forwards: 5 MiB each beyond the window's
    window_events, per_layer_events = [], []
    layer_passes(LAYERS, OPTIONS, RECORDS, None, window_events, window=([1, 2, 3, 4], 2)).forward(0)
    per_layer = layer_passes(LAYERS, OPTIONS, RECORDS, None, per_layer_events, window=None)
    assert type(per_layer) is _Step
    per_layer.forward(0)
    # by hand, at layer 4's scratch: the window holds group 1 (2 + 3) + layer 3 (3, its input 2) + layer 4 (3 + 5,
    # its input 2) = 20 MiB, one 20 MiB segment (2-10 MiB requests: kLargeBuffer segments) filled exactly; the
    # per-layer option holds each offloaded layer's input (2 + 2) allocated, 19 MiB, and groups 0 and 1's saved
    # 3 MiB blocks waiting on their copies (not cached): 25 MiB of blocks, a second segment
    got, held = replay(window_events), replay(per_layer_events)
    assert (got.allocated_peak_bytes, got.reserved_peak_bytes, got.segments) == (20 * MIB, 20 * MIB, 1)
    assert (held.allocated_peak_bytes, held.reserved_peak_bytes, held.segments) == (19 * MIB, 40 * MIB, 2)


def _profile(tmp_path):
    out = tmp_path / "tiny.json"
    run_ok("profile", "--arch-config", _tiny_config(tmp_path), "--seq-len", "2048", "--gpu", "gb200",
           "--micro-batch-size", "1", "--out", out)
    return out


def test_solve_takes_the_window_where_the_replay_now_admits_it(tmp_path):
    # the tiny LLaMA at micro-batch 1 on 650 MiB, the replay judging (no --fragmentation): no plan at none fits
    # the replay; the window at N = 3 does now, at none's time (GB200's host link hides its copies), faster
    # than any recompute. TE v2.9's window: the Bridge's megatron-core (tests/test_te210_window.py: v2.10's)
    profile_path, plan_path = _profile(tmp_path), tmp_path / "plan.yaml"
    result = run_ok("solve", "--profile", profile_path, "--mem", "650MiB", "--stages", "1", "--microbatches", "8",
                    "--precision", "bf16-mixed", "--runtime", "megatron", "--runtime-version", "92c8482e", "--json",
                    "--out", plan_path)
    plan = io.load_plan(plan_path)
    assert plan.stages[0].recompute == {f"layers.{i}": OPTION_OFFLOAD for i in range(3)}
    stage = json.loads(result.stdout)["stages"][0]
    assert stage["reserved_by"] == "replay" and stage["cap_replay"] == "fits"
    assert stage["reserved_bytes"] <= 650 * MIB
    # evaluate's verdict on the same profile: at none the replay is over the cap, so the window is what fits
    profile = float8_profile(io.load_profile(profile_path), plan.setup)  # as the CLI charges it
    none = costmodel.evaluate([StagePlan(index=0, layers=plan.stages[0].layers)], profile, plan.setup)
    assert not none.feasible and none.stages[0].reserved_by == "replay"
    window = costmodel.evaluate(plan.stages, profile, plan.setup)
    assert window.feasible and window.stages[0].device_need_bytes < none.stages[0].device_need_bytes


def test_megatron_s_replay_plays_the_window_only_where_megatron_core_runs_it(tmp_path):
    # the window's replayed allocated peak falls with N as the cost model's does; a plan megatron-core would not
    # run as the window (here: the offloaded layer not the block's first) keeps ckplan's per-layer replay
    profile_path = _profile(tmp_path)
    run_ok("solve", "--profile", profile_path, "--mem", "2GB", "--stages", "1", "--microbatches", "8",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--out", tmp_path / "plan.yaml")
    setup = io.load_plan(tmp_path / "plan.yaml").setup
    profile = float8_profile(io.load_profile(profile_path), setup)  # as the CLI charges it
    names = [layer.name for layer in profile.layers]
    peaks = []
    for count in range(4):
        plan = StagePlan(index=0, layers=names, recompute={f"layers.{i}": OPTION_OFFLOAD for i in range(count)})
        cost = costmodel.evaluate([plan], profile, setup)
        replayed = reserve_megatron.replay_stage(plan, cost.stages[0], stage=0, profile=profile, setup=setup)
        peaks.append((cost.stages[0].peak_bytes, replayed.allocated_peak_bytes))
    assert all(later[0] < earlier[0] and later[1] < earlier[1] for earlier, later in zip(peaks, peaks[1:]))
    kinds = [layer.kind for layer in profile.layers]
    assert te_offload.plan_window(kinds, ["none", "none", OPTION_OFFLOAD, "none", "none", "none"], setup) is None
