"""`ckplan profile` is never silent: piped, it prints plain progress lines on stderr as the work
goes on; its bar advances as soon as the first layer's memory is measured, not only after every
layer has been timed."""

from __future__ import annotations

import torch
from click.testing import CliRunner
from torch import nn

from planner import console
from planner.cli import cli
from planner.profiler.measure import measure_model


def test_progress_is_told_during_the_first_layer_not_after_all_are_timed():
    layers = [(str(i), nn.Sequential(nn.Linear(8, 8), nn.ReLU())) for i in range(3)]
    x = torch.randn(4, 8)
    outputs, current = [], x
    for _, layer in layers:
        current = layer(current).detach()
        outputs.append(current)
    told, layers_done = [], []
    measure_model(layers, x, torch.randn(4, 8), nn.functional.mse_loss, layer_outputs=outputs, warmup=1, repeats=2,
                  on_layer=layers_done.append, on_progress=lambda done, total, what: told.append((done, total, what,
                                                                                                  len(layers_done))))
    assert told[0][:3] == (1, told[0][1], "memory of layer 0") and told[0][3] == 0
    assert [done for done, *_ in told] == list(range(1, len(told) + 1))
    assert told[-1][0] == told[-1][1]  # ends at its total
    assert any(what.startswith("timing every layer, round 1/3") for _, _, what, _ in told)
    first_step = next(i for i, (_, _, what, _) in enumerate(told) if what.startswith("optimizer steps"))
    assert first_step > 3  # several updates before the per-layer count the bar had


def test_piped_progress_is_plain_lines_each_new_phase_and_every_few_seconds(monkeypatch):
    lines = []
    monkeypatch.setattr(console.err_console, "print", lambda text, **kwargs: lines.append(text))
    now = [0.0]
    with console.WorkProgress("profile", clock=lambda: now[0]) as work:
        work.phase("measuring the memory of 3 layers")
        work.update(1, 5, "memory of layer 0")
        now[0] = 1.0
        work.update(2, 5, "memory of layer 1")  # same phase, 1 s later: quiet
        now[0] = 7.0
        work.update(3, 5, "memory of layer 2")  # same phase, 6 s later: said
        work.update(4, 5, "timing every layer, round 1/1")
        work.update(5, 5, "optimizer steps of layer 0")
    assert lines == ["profile: measuring the memory of 3 layers [0 s]", "profile: memory of layer 0 (1/5) [0 s]",
                     "profile: memory of layer 2 (3/5) [7 s]", "profile: timing every layer, round 1/1 (4/5) [7 s]",
                     "profile: optimizer steps of layer 0 (5/5) [7 s]"]


def test_a_piped_profile_prints_its_progress(tmp_path):
    from conftest import MODELS

    result = CliRunner().invoke(cli, ["profile", str(MODELS / "mlp.py"), "--repeats", "1", "--warmup", "0",
                                      "--threads", "1", "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("profile: ")]
    assert said[0] == "profile: measuring the memory of 8 layers [0 s]"
    assert any(line.startswith("profile: memory of layer 0 (1/") for line in said)
    assert any(line.startswith("profile: optimizer steps of layer 7 (") for line in said)
    assert any(line.startswith("profile: timing the whole model at 1 thread") for line in said)
