"""`profile --fake` on code that needs tensor values (.item(), a boolean mask, mixture-of-experts
routing's counts, the bundled configs/models/moe.py's among them) names the layer, the operation
and the user's line, in one sentence, instead of blaming the chain's contract."""

from __future__ import annotations

import pytest
from conftest import MODELS
from fixtures.cli import run

BODY = """import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return {expr}


def build_model():
    return nn.Sequential(nn.Linear(8, 8), Layer())


def example_batch(n):
    return torch.randn(n, 8), torch.randn(n, 8)
"""


@pytest.mark.parametrize("expr, needles", [
    ("y * x.abs().max().item()", ["reads a tensor's value as a Python number", "aten._local_scalar_dense",
                                  "model.py:12 (return y * x.abs().max().item())"]),
    ("y * y[y > 0].sum()", ["selects elements by their values (a boolean mask", "aten.nonzero"]),
    ("y * (2.0 if y.sum() > 0 else 1.0)", ["reads a tensor's value as a Python number"]),
])
def test_a_value_dependent_layer_is_named_with_its_operation(tmp_path, expr, needles):
    model = tmp_path / "model.py"
    model.write_text(BODY.format(expr=expr))
    result = run("profile", model, "--fake", "--out", tmp_path / "p.json")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(f"Error: layer '1' of {model} "), errors[0]
    assert "each layer must accept the previous layer's output" not in result.output
    for needle in [*needles, "a --fake profile has shapes, not values", "profile without --fake"]:
        assert needle in errors[0], errors[0]
    assert not (tmp_path / "p.json").exists()


def test_the_bundled_moe_model_under_fake_names_its_routing(tmp_path):
    result = run("profile", MODELS / "moe.py", "--fake", "--out", tmp_path / "p.json")
    assert result.exit_code == 1
    assert "layer 'blocks.0' of" in result.output and "counts by value (bincount()" in result.output
    assert "aten.bincount at moe.py:" in result.output
    assert "previous layer's output" not in result.output
