"""Profiles a busy machine gets wrong: suspects are re-measured, nonsense is refused."""

import time

import pytest
import torch
from torch import nn

from planner.models.synthetic import layer
from planner.profiler import sanity
from planner.profiler.measure import measure_model

MIB = 2**20


def _blocks(changes=None):
    """Four identical blocks; `changes` maps an index to fields to replace."""
    layers = [layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=8, input_mib=1, param_count=1000,
                    adam_step_ms=0.4, recompute_ms=7) for i in range(4)]
    return [item.model_copy(update=(changes or {}).get(i, {})) for i, item in enumerate(layers)]


def test_a_clean_profile_has_no_suspects_and_no_nonsense():
    layers = _blocks()
    assert sanity.suspects(layers) == set() and sanity.nonsense(layers) == ""


def test_zero_recompute_for_a_layer_that_saves_tensors_is_nonsense():
    layers = _blocks({2: {"recompute_ms": 0.0}})
    assert sanity.suspects(layers) == {2}
    assert "blocks.2 saves tensors for backward but measured no recompute" in sanity.nonsense(layers)


def test_zero_recompute_is_fine_when_the_layer_keeps_only_its_input():
    layers = _blocks({2: {"recompute_ms": 0.0, "act_bytes": MIB, "input_in_act_bytes": MIB}})
    assert sanity.nonsense(layers) == ""


def test_a_step_a_hundred_times_its_kinds_median_is_nonsense():
    # the case: a 128 ms Adam step on one block, 0.4 ms on the others
    layers = _blocks({1: {"step_ms": {"adam": 128.0, "sgd": 0.1}}})
    assert sanity.suspects(layers) == {1}
    assert "adam step of layer blocks.1 took 128 ms" in sanity.nonsense(layers)
    # five times is worth measuring again, but not refused
    milder = _blocks({1: {"step_ms": {"adam": 2.4, "sgd": 0.1}}})
    assert sanity.suspects(milder) == {1} and sanity.nonsense(milder) == ""


def test_same_kind_layers_far_apart_are_suspects():
    layers = _blocks({3: {"fwd_ms": 30.0, "bwd_ms": 60.0}})
    assert sanity.suspects(layers) == {3} and sanity.nonsense(layers) == ""


def test_a_layer_is_judged_by_its_own_variants_median():
    """A global layer three times its sliding ones' time is its own work, not load: judged among its variant."""
    glob = {"fwd_ms": 30.0, "bwd_ms": 60.0, "fwd_ms_min": 30.0, "fwd_ms_max": 30.0, "bwd_ms_min": 60.0,
            "bwd_ms_max": 60.0, "variant": "full attention"}
    layers = _blocks({i: {"variant": "window 64"} for i in range(3)} | {3: glob})
    assert sanity.suspects(layers) == set() and sanity.robust_figures(layers) == {}
    assert sanity.suspects(_blocks({3: glob | {"variant": None}})) == {3}


class SlowAtFirst(nn.Module):
    """A block that sleeps 1 ms per forward, and 25 ms while `busy_calls` lasts: a spell
    of load that hits one layer's whole first series."""

    def __init__(self, busy_calls: int = 0):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.busy_calls = busy_calls

    def forward(self, x):
        if self.busy_calls:
            self.busy_calls -= 1
            time.sleep(0.025)
        time.sleep(0.001)
        return torch.relu(self.linear(x))


def test_a_layer_hit_by_a_spell_of_load_is_measured_again():
    # 1 call for the transient, then 3 per repeat (plain, checkpointed, its recompute)
    blocks = [SlowAtFirst(busy_calls=1 + 3 * 3 if i == 2 else 0) for i in range(4)]
    layers = [(f"blocks.{i}", block) for i, block in enumerate(blocks)]
    x = torch.randn(4, 8)
    outputs, h = [], x
    with torch.no_grad():
        for _, block in layers:
            h = block(h)
            outputs.append(h)
    for block in blocks:  # the no-grad pass above was not profiling
        block.busy_calls = 1 + 3 * 3 if block is blocks[2] else 0
    result = measure_model(layers, x, torch.randn(4, 8), nn.functional.mse_loss, layer_outputs=outputs,
                           warmup=0, repeats=3)
    times = [item.fwd_ms for item in result.layers]
    # block 2's first series all slept 25 ms more; new samples outvoted it (with room for a busy machine)
    assert times[2] < 10.0, times


def test_a_step_that_stays_absurd_is_charged_its_kinds_median(monkeypatch):
    import planner.profiler.measure as measure

    blocks = [SlowAtFirst() for _ in range(4)]
    stalled = blocks[2]
    # the machine stalls every time block 2's step is timed: measured again, still absurd
    monkeypatch.setattr(measure, "_step_ms", lambda layer, **_: {"adam": 200.0 if layer is stalled else 0.8,
                                                                  "sgd": 0.6})
    layers = [(f"blocks.{i}", block) for i, block in enumerate(blocks)]
    x = torch.randn(4, 8)
    outputs, h = [], x
    with torch.no_grad():
        for block in blocks:
            h = block(h)
            outputs.append(h)
    result = measure_model(layers, x, torch.randn(4, 8), nn.functional.mse_loss, layer_outputs=outputs,
                           warmup=0, repeats=1)
    assert [item.step_ms["adam"] for item in result.layers] == [0.8, 0.8, 0.8, 0.8]
    assert [item.step_ms["sgd"] for item in result.layers] == [0.6] * 4
    # (the blocks' passes are timed for real: on a loaded machine one may warn of its own, not of a step)
    assert [w for w in result.warnings if " step " in w] == [
        "layer blocks.2's adam step measured 200 ms, 250x its kind's median, even when measured again; it is "
        "charged that median, 0.8 ms (profile on a quieter machine to measure it)"]


@pytest.mark.parametrize("factor", [sanity.STEP_SUSPECT, sanity.STEP_ABSURD])
def test_kinds_of_fewer_than_three_layers_are_not_judged_by_their_step(factor):
    layers = _blocks({1: {"step_ms": {"adam": 0.4 * factor * 2, "sgd": 0.1}}})[:2]
    assert sanity.suspects(layers) == set() and sanity.nonsense(layers) == ""


def test_a_recompute_lost_in_noise_is_charged_a_whole_forward(monkeypatch):
    import planner.profiler.measure as measure

    monkeypatch.setattr(measure._TimedLayer, "recompute_ms",
                        lambda self: None if not self.recompute_measured else 0.0)  # the noise wins every time
    block = SlowAtFirst()
    x = torch.randn(4, 8)
    with torch.no_grad():
        out = block(x)
    result = measure_model([("block", block)], x, torch.randn(4, 8), nn.functional.mse_loss, layer_outputs=[out],
                           warmup=0, repeats=1)
    assert result.layers[0].recompute_ms is None  # the cost model charges a whole forward
    assert result.warnings == ["layer block's recompute was lost in the machine's noise; it is charged a whole "
                               "forward (profile on a quieter machine to measure it)"]


def test_identical_layers_still_far_apart_are_charged_their_kinds_median():
    """Block 2 is slow at every call (a core kept busy while it runs): measured again it stays
    25 ms over its identical siblings, so its forward, backward and recompute take the kind's
    medians, and the profile says so; no figure of it reaches a plan."""
    blocks = [SlowAtFirst(busy_calls=10**6 if i == 2 else 0) for i in range(4)]
    layers = [(f"blocks.{i}", block) for i, block in enumerate(blocks)]
    x = torch.randn(4, 8)
    outputs, h = [], x
    with torch.no_grad():
        for block in blocks:
            h = block(h)
            outputs.append(h)
    result = measure_model(layers, x, torch.randn(4, 8), nn.functional.mse_loss, layer_outputs=outputs,
                           warmup=0, repeats=3)
    others = [result.layers[i] for i in (0, 1, 3)]
    slow = result.layers[2]
    assert slow.fwd_ms + slow.bwd_ms < 10.0, slow  # not the 25 ms a call it measured
    assert all(abs(slow.fwd_ms - layer.fwd_ms) < 10.0 for layer in others)
    said = [line for line in result.warnings if line.startswith("layer blocks.2's forward + backward measured")]
    assert len(said) == 1 and "even when measured again; it is charged its kind's median" in said[0], result.warnings


def test_robust_figures_replace_a_recompute_far_from_its_kinds():
    layers = _blocks({1: {"recompute_ms": 99.0}})
    fixed = sanity.robust_figures(layers)
    assert set(fixed) == {1} and fixed[1].values == {"recompute_ms": layers[0].recompute_ms}
    assert fixed[1].what == "recompute measured 99 ms"


def test_more_threads_slower_is_timed_again_then_said_untrustworthy(capsys):
    from planner.commands.profile import _consistent_threads

    again = [{1: [50.0], 2: [150.0]}]
    assert _consistent_threads({1: 40.0, 2: 25.0}, lambda: again.pop()) == {1: 40.0, 2: 25.0}  # consistent: kept
    assert again and capsys.readouterr().err == ""  # not timed again, nothing said
    kept = _consistent_threads({1: 40.0, 2: 136.0}, lambda: again.pop())  # 3.4x slower at 2 threads
    assert kept == {1: 40.0, 2: 136.0} and not again
    err = capsys.readouterr().err
    assert "the whole model ran slower with more threads (40 ms at 1, 136 ms at 2), even when timed again" in err
    assert "cannot be trusted" in err and "profile with --threads 1" in err
    assert _consistent_threads({1: 40.0, 2: 136.0}, lambda: {1: [41.0], 2: [22.0]}) == {1: 40.0, 2: 22.0}
    assert capsys.readouterr().err == ""  # timed again, consistent: nothing to say


def test_a_profile_that_contradicts_itself_says_so_in_the_file_and_solve_repeats_it(tmp_path):
    from click.testing import CliRunner

    from planner import io
    from planner.cli import cli
    from planner.commands.profile import with_timing_verdict
    from planner.models import synthetic

    layers = [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=1, input_mib=0.5, param_count=1000)
              for i in range(3)]
    profile = synthetic.profile_of(layers)
    assert with_timing_verdict(profile) == profile  # consistent: nothing recorded
    busy = profile.model_copy(update={"device": profile.device.model_copy(update={"thread_ms": {1: 555.0, 2: 2810.0}})})
    judged = with_timing_verdict(busy)
    assert judged.assumptions["timing_noise"] == "the whole model ran slower at 2 threads (2.81e+03 ms) than at 1 (555 ms)"
    io.save_profile(judged, tmp_path / "p.json")
    result = CliRunner().invoke(cli, ["solve", "--profile", str(tmp_path / "p.json"), "--mem", "1GB", "--stages", "2",
                                      "--out", str(tmp_path / "plan.yaml")])
    assert result.exit_code == 0, result.output
    assert "the profile's timings cannot be trusted (the whole model ran slower at 2 threads" in result.output


def test_a_layer_whose_repeats_spread_past_the_noise_bound_is_measured_again():
    layers = _blocks({3: {"fwd_ms_max": 40.0}})  # one repeat 4x the others
    assert sanity.suspects(layers) == {3}
