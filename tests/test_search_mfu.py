"""The search's MFU column is the figure the runtime logs, as evaluate prints it (planner/profiler/throughput.py via
solve_report.throughput_of): on a tied model the output projection is the embedding's weight, which Megatron-LM's
count charges once as the logits' GEMM and torchtitan's leaves out with the embedding (§597)."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run
from test_launchers import _tiny_config

from planner import io
from planner.commands.solve_report import throughput_of


@pytest.mark.parametrize("runtime,field,named", [("megatron", "megatron_mfu", "Megatron-LM"),
                                                 ("torchtitan", "torchtitan_mfu", "torchtitan")])
def test_search_prints_the_runtimes_logged_mfu_on_a_tied_model(tmp_path, runtime, field, named):
    config = _tiny_config(tmp_path, tie_word_embeddings=True)
    flags = ("search", "--arch-config", config, "--gpus", "8", "--global-batch", "8", "--seq-len", "512", "--top",
             "2", "--runtime", runtime, "--micro-batch-sizes", "1", "--out", tmp_path / "best.yaml")
    result = run(*flags, "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    first = answer["ranked"][0]
    plan = io.load_plan(tmp_path / "best.yaml")
    profile = io.load_profile(tmp_path / plan.profile.file)
    logged = getattr(throughput_of(profile, plan.setup, first["iteration_ms"]), field)
    assert first["mfu"] == pytest.approx(logged, rel=1e-12) and first["mfu_of"] == named
    text = run(*flags)
    assert text.exit_code == 0, text.output
    assert f"({named}'s)" in text.output  # the column's header names whose figure it is
