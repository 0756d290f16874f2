"""Fake profiles record a split backward's bytes as measured ones do (issue 33; docs/published-runs.md
§67.fakesplit): split_held_bytes, split_input_peak_bytes, split_peak_bytes, split_first_peak_bytes and
split_carry_bytes per layer and option, by the measured profiler's own splitbackward.split_per_option run on the
fake tensors. Before, a fake profile recorded none of them (split_peak_bytes 0), so a ZB / ZBV plan from it charged
nothing for the input and weight passes: dp_tiny's ZBV rank 1 planned 9,984 B under its run, ZB's 7,932."""

from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel
from planner.schema import StagePlan

FIXTURES = Path(__file__).parent / "fixtures"
SPLIT = ("split_held_bytes", "split_input_peak_bytes", "split_peak_bytes", "split_first_peak_bytes", "split_carry_bytes",
         "split_left_bytes")
# dp_tiny's block, Linear(32, 32) + Tanh on 4 rows in float32, by hand: the weight pass holds the Linear's output
# gradient (4 x 32 x 4 = 512 B) from the input pass; that pass peaks at it and the input gradient (512); the
# weight pass at the weight and bias gradients (4,096 + 128 = 4,224), one group (a Linear's weight and bias meet
# the activations at one addmm), which carries them less the saved 512 B it frees, none of it past the next
# group's call (no rerun). Block 0 has no input gradient.
DP_TINY_BLOCK = (512, 1024, 4224, 4224, 3712, 0)
# model: micro-batch size (llama_style's the command's default, 4: conftest's llama_style_profiles, shared)
MODELS = {"dp_tiny": 4, "llama_style": 4}


def _split(option) -> tuple:
    return tuple(getattr(option, field) for field in SPLIT)


@pytest.fixture(scope="module", params=sorted(MODELS))
def profiles(request, tmp_path_factory):
    """(model, measured profile, fake profile): on the CPU in float32."""
    if request.param == "llama_style":  # the same two runs as below (the fake's float32 is its CPU default)
        measured, fake, _ = request.getfixturevalue("llama_style_profiles")
        return request.param, io.load_profile(measured), io.load_profile(fake)
    folder = tmp_path_factory.mktemp(request.param)
    model, rows = FIXTURES / f"{request.param}.py", str(MODELS[request.param])
    run_ok("profile", model, "--micro-batch-size", rows, "--threads", "1", "--repeats", "1", "--warmup", "0",
           "--out", folder / "measured.json")
    run_ok("profile", model, "--micro-batch-size", rows, "--fake", "--device", "cpu", "--dtype", "float32",
           "--out", folder / "fake.json")
    return request.param, io.load_profile(folder / "measured.json"), io.load_profile(folder / "fake.json")


@pytest.mark.xdist_group("llama_style_profiles")  # one worker: the shared profiles once (conftest.py)
def test_a_fake_profile_records_each_split_field_as_the_measured_one_to_the_byte(profiles):
    model, measured, fake = profiles
    pairs = [(ours.name, ours.recompute_options, theirs.recompute_options)
             for ours, theirs in zip(fake.layers, measured.layers, strict=True)]
    for name, ours, theirs in pairs:
        assert [(o.name, _split(o)) for o in ours] == [(o.name, _split(o)) for o in theirs], name
    split = [o for _, ours, _ in pairs for o in ours if o.split_peak_bytes > 0]
    assert len(split) >= 2 * (len(pairs) - 1)  # none and full split in every layer but the first
    if model == "dp_tiny":
        assert [_split(o) for o in fake.layers[0].recompute_options] == [(0,) * 6] * 2
        assert {_split(o) for layer in fake.layers[1:] for o in layer.recompute_options} == {DP_TINY_BLOCK}
    else:  # a selective option that splits is recorded too (attn,mlp: the attention and MLP rerun)
        assert any(o.name not in ("none", "full") for o in split)


def test_a_fake_cuda_profiles_offload_is_bounded_from_nones_split_and_the_moved_bytes(tmp_path):
    """No fake device runs offload's copies: its split is none's with the copies the input pass brings back held
    until the weight pass (dp_tiny's block in bfloat16: the Tanh's 256 B output, one 512 B block)."""
    run_ok("profile", FIXTURES / "dp_tiny.py", "--micro-batch-size", "4", "--fake", "--out", tmp_path / "p.json")
    none, full, offload = io.load_profile(tmp_path / "p.json").layers[1].recompute_options
    assert (none.name, full.name, offload.name, offload.host_bytes) == ("none", "full", "offload", 512)
    held, input_peak, peak, first, carry, left = _split(none)
    assert (held, input_peak, peak, first, carry, left) == (512, 1024, 2560, 2560, 2048, 0)  # bf16: 2,048 + 64 -> 2,560
    assert _split(offload) == (held + 512, input_peak + 512, peak, first, carry, left)


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "over"), [("ZBV", 1024), ("ZB", 3072)])
def test_a_zero_bubble_plan_from_a_fake_profile_is_exact_or_over_on_every_rank(schedule, over, tmp_path):
    """ckplan's own run (gloo), dp_tiny, 2 ranks x 2 chunks, 4 microbatches of 4 rows: ZBV [0 1 2 | 7], [3 | 4 5 6];
    ZB (looped) [0 1], [4 5] | [2 3], [6 7]. Planned from a fake profile, as from the measured one (the same
    excess: §66.zbvgroup's 1,024 / 3,072 B on rank 1); before, rank 1 was 9,984 / 7,932 B under. ckplan launches
    no plan of a fake profile (its times are another machine's): the plan is solved from the measured profile,
    its fixed cut's predictions the fake profile's."""
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan

    paths = {kind: tmp_path / f"{kind}.json" for kind in ("measured", "fake")}
    plan_path, model = tmp_path / "plan.yaml", FIXTURES / "dp_tiny.py"
    run_ok("profile", model, "--micro-batch-size", "4", "--threads", "1", "--repeats", "1", "--warmup", "0",
           "--out", paths["measured"])
    run_ok("profile", model, "--micro-batch-size", "4", "--fake", "--device", "cpu", "--dtype", "float32",
           "--out", paths["fake"])
    run_ok("solve", "--profile", paths["measured"], "--stages", "2", "--mem", "100MiB", "--microbatches", "4",
           "--schedule", schedule, "--chunks", "2", "--out", plan_path)
    solved = io.load_plan(plan_path)
    cut = [["0", "1", "2"], ["3"], ["4", "5", "6"], ["7"]] if schedule == "ZBV" else \
          [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    pairs = ((0, 3), (1, 2)) if schedule == "ZBV" else ((0, 2), (1, 3))
    ranks = [StagePlan(index=r, layers=cut[a] + cut[b], chunks=[cut[a], cut[b]]) for r, (a, b) in enumerate(pairs)]
    cost = costmodel.evaluate(ranks, io.load_profile(paths["fake"]), solved.setup)
    io.save_plan(solved.model_copy(update={"stages": with_predictions(ranks, cost)}), plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    for stage in report.stages:
        assert 0 <= stage.predicted.peak_bytes - stage.measured.peak_bytes <= over, report
