"""One microbatch of the slowest stage by the cost model's own time rows (scripts/published_rows.py microbatch_terms,
`split --terms`): the stage it picks, each row summed over the stage's layers by kind at their recompute options, held
by hand to the profile's per-layer times, and the rows adding up to the stage's time."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fixtures.scripts import load_script

from planner.cli import cli

rows_mod = load_script("published_rows")
FBR = "forward, backward, recompute"


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("terms") / "l8_s2048.json"
    result = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "2048", "--micro-batch-size", "1",
                                      "--gpu", "h100", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _terms(path, *extra):
    captured = rows_mod.capture(["--profile", str(path), "--layers-per-stage", "17,17", "--microbatches", "4",
                                 "--mem", "80GB", "--precision", "bf16-mixed", *extra])
    return rows_mod.microbatch_terms("t", *captured), captured


def test_the_slowest_stage_by_hand_from_the_profiles_layer_times(profile):
    got, (stages, _, _, cost) = _terms(profile, "--checkpoint", "layers.20,layers.21")
    layers = json.loads(profile.read_text())["layers"]
    assert len(layers) == 34 and layers[0]["name"] == "tok_embeddings" and layers[-1]["name"] == "output"
    # the last stage (16 blocks, the norm-and-head layer, the loss) is the slower: it is the one split
    busy = [s.time_ms + s.comm_ms for s in cost.stages]
    assert got["stage"] == 1 and got["microbatch_ms"] == max(busy) and busy[1] > busy[0]
    assert got["layers"] == 17 and stages[1].layers[0] == "layers.16"
    # each layer's forward and backward, and the two checkpointed blocks' reruns, from the file (compute scale 1)
    blocks = layers[17:33]
    assert [layer["name"] for layer in blocks] == [f"layers.{i}" for i in range(16, 32)]
    by_hand = sum(layer["fwd_ms"] + layer["bwd_ms"] for layer in blocks)
    by_hand += sum(layer["recompute_ms"] for layer in blocks if layer["name"] in ("layers.20", "layers.21"))
    assert got["terms_ms"][f"layers: {FBR}"] == pytest.approx(by_hand, rel=1e-12)
    assert got["terms_ms"][f"output: {FBR}"] == pytest.approx(layers[33]["fwd_ms"] + layers[33]["bwd_ms"], rel=1e-12)
    # no layer row left out: the rows add up to what the accumulator charged the stage
    assert got["unsplit_ms"] == pytest.approx(0.0, abs=1e-9)
    assert got["time_ms"] + got["comm_ms"] == got["microbatch_ms"]


def test_a_checkpointed_block_adds_its_rerun_and_nothing_else(profile):
    plain, _ = _terms(profile, "--ckpt-per-stage", "0,0")
    checked, _ = _terms(profile, "--checkpoint", "layers.20")
    rerun = next(layer for layer in json.loads(profile.read_text())["layers"] if layer["name"] == "layers.20")
    assert rerun["recompute_ms"] > 0
    assert checked["terms_ms"][f"layers: {FBR}"] - plain["terms_ms"][f"layers: {FBR}"] == pytest.approx(
        rerun["recompute_ms"], rel=1e-9)
    assert {k: v for k, v in checked["terms_ms"].items() if k != f"layers: {FBR}"} == {
        k: v for k, v in plain["terms_ms"].items() if k != f"layers: {FBR}"}


def test_split_terms_needs_rows(capsys):
    with pytest.raises(SystemExit):
        rows_mod.main(["split", "--terms"])
    assert "--only" in capsys.readouterr().err
