"""`ckplan compare` end to end on a small model: profile -> solve -> compare (CPU, gloo)."""

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.cli import run_ok as run

from planner import io
from planner.cli import cli
from planner.cost import costmodel
from planner.measure.compare import Comparison, strategies_to_run
from planner.solve import baselines

FIXTURES = Path(__file__).parent / "fixtures"

MODEL = '''
import torch
from torch import nn

def build_model():  # blocks: a lone Linear or GELU keeps only its input, nothing to checkpoint
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)) for _ in range(4)))

def example_batch(micro_batch_size):
    g = torch.Generator().manual_seed(0)
    return torch.randn(micro_batch_size * 256, 64, generator=g), torch.randn(micro_batch_size * 256, 64, generator=g)
'''


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """A 2-stage plan at a cap halfway between what full and no checkpointing need."""
    tmp = tmp_path_factory.mktemp("compare")
    model = tmp / "mlp.py"
    model.write_text(MODEL)
    profile_path = tmp / "mlp.json"
    run("profile", model, "--threads", "1", "--repeats", "1", "--warmup", "0", "--out", profile_path)
    profile = io.load_profile(profile_path)
    probe = run("solve", "--profile", profile_path, "--mem", "1GB", "--stages", "2", "--microbatches", "4",
                "--out", tmp / "probe.yaml")
    assert probe.exit_code == 0
    setup = io.load_plan(tmp / "probe.yaml").setup
    need = {name: max(costmodel.evaluate(fn(profile, setup), profile, setup).peak_bytes_per_stage)
            for name, fn in (("full", baselines.full_checkpointing), ("none", baselines.no_checkpointing))}
    cap = (need["full"] + need["none"]) // 2
    plan_path = tmp / "plan.yaml"
    run("solve", "--profile", profile_path, "--mem", cap, "--stages", "2", "--microbatches", "4", "--out", plan_path)
    return plan_path, cap


@pytest.mark.slow
def test_compare_runs_every_fitting_strategy_under_its_cap(solved, tmp_path):
    plan_path, cap = solved
    out = tmp_path / "compare.json"
    result = run("compare", plan_path, "--steps", "1", "--warmup-steps", "0", "--rounds", "2", "--max-rounds", "2", "--out", out,
                 "--plot", tmp_path / "c.png")
    plan = io.load_plan(plan_path)
    comparison = Comparison.model_validate_json(out.read_text())
    # the table and the file name the same strategies: ckplan first, then every fitting baseline
    expected = [name for name, _ in strategies_to_run(plan)]
    assert [s.name for s in comparison.strategies] == expected
    assert expected[0] == "ckplan" and "full-ckpt" in expected and "no-ckpt" not in expected
    for name in expected:
        assert name in result.output
    assert comparison.rounds == 2
    for strategy in comparison.strategies:
        # one median per round; the strategy's figure is their median
        assert len(strategy.iteration_ms_rounds) == 2
        assert strategy.iteration_ms == pytest.approx(sum(strategy.iteration_ms_rounds) / 2)
        report = strategy.report
        assert len(report.stages) == 2 and report.steps == 1
        # measured on the runtime, every strategy stays under every cap
        assert all(s.measured.peak_bytes <= s.cap_bytes == cap for s in report.stages)
        assert strategy.peak_over_cap == pytest.approx([s.measured.peak_bytes / cap for s in report.stages])
        # an identical layout is measured once and shared
        if strategy.same_as:
            first = next(s for s in comparison.strategies if s.name == strategy.same_as)
            assert strategy.report == first.report
    full = next(s for s in comparison.strategies if s.name == "full-ckpt")
    assert full.speedup_vs_full == pytest.approx(1.0)
    # speed-ups pair the rounds: a slow spell lands on both sides of each ratio
    for strategy in comparison.strategies:
        ratios = [f / t for f, t in zip(full.iteration_ms_rounds, strategy.iteration_ms_rounds)]
        assert strategy.speedup_vs_full == pytest.approx(math.sqrt(ratios[0] * ratios[1]))  # geometric mean
        assert strategy.vs_full.low <= strategy.vs_full.ratio <= strategy.vs_full.high
        # ckplan against each other layout: the same pairing, with the busiest rank's compute beside it
        if strategy.name != "ckplan" and strategy.same_as != "ckplan":
            assert strategy.ckplan_vs.verdict in ("faster", "slower", "unresolved")
            assert strategy.ckplan_vs_compute is not None and len(strategy.compute_ms_rounds) == 2
    # the JSON round-trips through the pydantic model
    assert Comparison.model_validate(json.loads(comparison.model_dump_json())) == comparison


def test_compare_tables_fit_the_terminal_they_print_on(monkeypatch, capsys):
    # at 110 columns the demo's two tables ran to 127 and 119 and were cut off at the edge
    from planner import console
    from planner.commands.compare import print_comparison

    comparison = Comparison.model_validate_json((FIXTURES / "compare-demo.json").read_text())
    plan = type("Plan", (), {"setup": type("Setup", (), {"pipeline": type("P", (), {"mem_caps_bytes": [80 * 2**20]})})})
    for width in (80, 110, 160):
        monkeypatch.setattr(console.console, "width", width)
        print_comparison(comparison, plan)
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
        assert lines and all(len(line) <= width for line in lines), out
        assert all(line.rstrip().endswith(("┓", "┃", "┩", "│", "┘")) for line in lines), out  # none cut short
        assert "unresolved" in out and "balanced-ratio" in out


def test_compare_refuses_a_missing_plan(tmp_path):
    result = CliRunner().invoke(cli, ["compare", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "c.json")])
    assert result.exit_code != 0 and "does not exist" in result.output
    assert not (tmp_path / "c.json").exists()
