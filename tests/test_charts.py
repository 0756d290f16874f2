"""What the PNG charts draw, decided before matplotlib sees it: one colour per strategy in
every panel, one bar (or curve) for strategies that are the same, the cap in the tables'
unit, the measured spread, a title naming model, cap and machine."""

from types import SimpleNamespace

import pytest

from planner.commands.compare import chart_title, measured_interval_ms, plotted_strategies
from planner.emit.charts import byte_unit, merged_curves, strategy_colours


def test_every_strategy_keeps_one_colour_and_ckplan_is_always_green():
    colours = strategy_colours(["ckplan", "full-ckpt", "colossalai-ratio"])
    assert colours["ckplan"] == "tab:green" and len(set(colours.values())) == 3
    # ckplan is green wherever it stands, and no baseline is ever green
    assert strategy_colours(["full-ckpt", "ckplan"])["ckplan"] == "tab:green"
    assert "tab:green" not in [c for n, c in strategy_colours([f"b{i}" for i in range(20)]).items()]


def test_identical_curves_are_drawn_once_under_every_name():
    values = {"ckplan": [3, 2, 1], "megatron-block": [4, 2, 1], "balanced-ratio": [4, 2, 1], "full-ckpt": [5, 5, 5]}
    assert merged_curves(list(values), values) == [
        ("ckplan", ["ckplan"]), ("megatron-block", ["megatron-block", "balanced-ratio"]), ("full-ckpt", ["full-ckpt"])]


@pytest.mark.parametrize("largest, unit", [(900, "B"), (300 * 2**20, "MiB"), (2**30, "GiB"), (80 * 2**30, "GiB")])
def test_the_cap_axis_uses_the_unit_the_tables_print(largest, unit):
    assert byte_unit([1, largest])[0] == unit


def _result(name, same_as=None, rounds=(100.0,), steps=(90.0, 100.0, 110.0, 130.0)):
    report = SimpleNamespace(iteration_ms_all=list(steps), device=SimpleNamespace(type="cpu", name="x86_64", threads=1))
    return SimpleNamespace(name=name, same_as=same_as, iteration_ms_rounds=list(rounds),
                           iteration_ms=sorted(rounds)[len(rounds) // 2], report=report)


def test_strategies_that_ran_the_same_plan_share_one_bar_labelled_with_all_names():
    comparison = SimpleNamespace(strategies=[_result("ckplan"), _result("full-ckpt"),
                                             _result("megatron-block", same_as="ckplan")])
    bars = plotted_strategies(comparison)
    assert [label for _, label in bars] == ["ckplan = megatron-block", "full-ckpt"]
    assert [result.name for result, _ in bars] == ["ckplan", "full-ckpt"]


def test_the_measured_interval_is_the_rounds_range_or_one_rounds_quartiles():
    assert measured_interval_ms(_result("a", rounds=(100.0, 120.0, 95.0))) == (95.0, 120.0)
    low, high = measured_interval_ms(_result("a"))  # one round: the quartiles of its steps 90, 100, 110, 130
    assert (low, high) == (pytest.approx(92.5), pytest.approx(125.0))


def test_the_title_names_the_model_the_cap_and_the_machine(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    plan = SimpleNamespace(model=SimpleNamespace(file="models/gpt.py"), setup=SimpleNamespace(
        pipeline=SimpleNamespace(stages=2, mem_caps_bytes=[512 * 2**20] * 2, microbatches=4)))
    title = chart_title(SimpleNamespace(strategies=[_result("ckplan")]), plan)
    assert title == "gpt: 2 stages, cap 512 MiB per stage, 4 microbatches; x86_64, 1 thread(s) per rank on 2 cores"
