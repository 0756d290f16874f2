"""`ckplan search` from the command line: the ranked table at 80 and 120 columns, --json with
the whole ranking, a hand configuration beside it, and the sentence when nothing fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run, run_ok
from test_launchers import _tiny_config

from planner import console, io

JOB = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512")


@pytest.mark.parametrize("width", [80, 120])
def test_table_fits_the_terminal(tmp_path, monkeypatch, width):
    monkeypatch.setattr(console.console, "width", width)
    out = tmp_path / "best.yaml"
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--top", "3", "--out", out,
                    "--tp", "2", "--sp", "--pp", "2", "--micro-batch-size", "1")
    lines = result.output.splitlines()
    assert all(len(line) <= width for line in lines), "\n".join(line for line in lines if len(line) > width)
    assert "#1" in result.output and "#3" in result.output and "…" not in result.output
    assert "your configuration" in result.output and "configurations considered" in result.output
    assert "differs from #2" in result.output
    plan = io.load_plan(out)  # the best, as a plan export reads, its profile beside it
    assert (tmp_path / "best.profile.json").is_file() and plan.solver.status == "optimal"


def test_json_gives_the_whole_ranking(tmp_path):
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--top", "4", "--json",
                    "--out", tmp_path / "best.yaml")
    data = json.loads(result.stdout)
    counts = data["counts"]
    assert len(data["ranked"]) == 4 and counts["complete"]
    # every interleaved configuration is solved or pruned (§41.chunklp: none set aside by its 1F1B twin); those
    # pruned by their bubble (chunkbound.py) count among pruned_time
    assert counts["considered"] == (counts["duplicates"] + counts["refused"] + counts["pruned_memory"]
                                    + counts["pruned_time"] + counts["solved"])
    times = [row["iteration_ms"] for row in data["ranked"]]
    # a bound no higher than the time, up to the rounding of summing the same terms in another order
    assert times == sorted(times) and all(row["bound_ms"] <= row["iteration_ms"] * (1 + 1e-12) for row in data["ranked"])
    first = data["ranked"][0]
    assert first["degrees"]["tp"] * first["degrees"]["pp"] * first["degrees"]["dp"] == 8
    assert first["differs_from_next"] and first["stages"] and 0 < first["mfu"] < 1


def test_nothing_fits_says_which_resource_and_what_would(tmp_path):
    """A 1.9 B-parameter model over 8 GPUs of 2 GB: even ZeRO-3 leaves about 3.6 GiB of weights,
    gradients and Adam state a GPU; the explanation names the first multiple of the GPUs
    (2x, 4x, 8x) under which some configuration passes the memory bound: 32 here (64 while NCCL's buffers were
    nccl#964's flat 544 / 688 MiB a communicator; planner/cost/nccl_buffers.py charges H100's from NCCL's code). 22
    of them: the bound holds each stage's allocated peak to the card less NCCL's buffers, which every plan the
    allocator replay admits meets (planner/solve/replayfit.py, §37.solvefit); 14 under the divisor's 15% reserve
    (10 while a data-parallel group with two or fewer ranks a node, at TP 4 or 8, was charged NVLS's buffer,
    which NCCL makes only for more than two GPUs of the group in a node: src/transport/nvls.cc 160); 34 since the
    default space holds interleaved 1F1B (§37.searchspace): 12 interleaved ones, whose memory bound holds the static
    bytes alone (bounds.py: a chunked schedule's kept activations are not bounded)."""
    config = _tiny_config(tmp_path, hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
                          num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
    out = tmp_path / "best.yaml"
    result = run("search", "--arch-config", config, "--gpus", "8", "--global-batch", "8", "--seq-len", "256",
                 "--mem", "2GB", "--micro-batch-sizes", "1", "--out", out)
    assert result.exit_code == 1
    assert "no configuration fits 8 x h100-sxm" in result.output and "% over" in result.output
    assert "weights, gradients and optimizer state" in result.output
    assert "With --gpus 32, 34 configurations pass the memory bound" in " ".join(result.output.split())
    assert not out.exists()
    # every configuration of 8 GPUs holds a communicator of >= 2 ranks: H100's least, a 2-rank ring, 24 x 12 MiB
    result = run("search", "--arch-config", config, *JOB, "--mem", "250MB", "--out", out)
    assert result.exit_code == 1 and "less than NCCL's communicator buffers" in result.output


def test_one_model_and_clean_refusals(tmp_path):
    config = _tiny_config(tmp_path)
    result = run("search", "--arch", "llama3-8b", "--arch-config", config, *JOB)
    assert result.exit_code == 1 and "give one model" in result.output
    result = run("search", "--arch-config", config, "--gpus", "12", "--gpus-per-node", "8", "--global-batch", "8",
                 "--seq-len", "512")
    assert result.exit_code == 1 and "whole number of nodes" in result.output
    result = run("search", "--arch-config", config, *JOB, "--schedules", "1F1B,PipeDream")
    assert result.exit_code == 1 and "--schedules" in result.output
    result = run("search", "--arch-config", config, *JOB, "--hand-recompute", "none")
    assert result.exit_code == 1 and "--hand-recompute applies" in result.output


def test_compare_scores_the_published_configurations(tmp_path):
    """LLaMA 3 8B over 8 H100s: torchtitan's FSDP 8 configuration (local batch 2) is scored in
    the same table; the search's best is no slower."""
    result = run_ok("search", "--arch", "llama3-8b", "--gpus", "8", "--global-batch", "16", "--seq-len", "8192",
                    "--micro-batch-sizes", "1,2", "--top", "1", "--compare", "--json", "--out", tmp_path / "b.yaml")
    data = json.loads(result.stdout)
    fsdp = next(row for row in data["compared"] if row["name"] == "torchtitan 8B FSDP 8")
    assert fsdp["degrees"]["zero"] == 3 and fsdp["degrees"]["dp"] == 8 and fsdp["fits"]
    assert "llama3_h100_202412_torchtitan.md" in fsdp["source"]
    assert data["ranked"][0]["iteration_ms"] <= fsdp["iteration_ms"]


def test_chunked_schedules_are_searched_when_asked(tmp_path):
    """--schedules adds interleaved-1F1B (the MILP plans it, "feasible"): its configurations are
    enumerated beside 1F1B's and ranked by the same cost model."""
    result = run_ok("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--schedules", "1F1B,interleaved-1F1B",
                    "--micro-batch-sizes", "1", "--top", "50", "--json", "--out", tmp_path / "best.yaml")
    data = json.loads(result.stdout)
    schedules = {row["degrees"]["schedule"] for row in data["ranked"]}
    assert schedules == {"1F1B", "interleaved-1F1B"}
    chunked = [row for row in data["ranked"] if row["degrees"]["schedule"] == "interleaved-1F1B"]
    assert all(row["degrees"]["chunks"] == 2 and row["degrees"]["pp"] >= 2 for row in chunked)


def test_the_default_space_solves_every_chunk_count_the_bounds_leave(tmp_path):
    """Without --schedules the search is the one --schedules 1F1B,interleaved-1F1B asks (the runtime runs both):
    the same ranking and counts, no interleaved configuration set aside beside its 1F1B twin (§41.chunklp)."""
    args = ("search", "--arch-config", _tiny_config(tmp_path), *JOB, "--micro-batch-sizes", "1", "--top", "50",
            "--json")
    default = json.loads(run_ok(*args, "--out", tmp_path / "a.yaml").stdout)
    named = json.loads(run_ok(*args, "--schedules", "1F1B,interleaved-1F1B", "--out", tmp_path / "b.yaml").stdout)
    # the count of those set aside is gone with the mode that set them aside: none can be
    assert "chunked_set_aside" not in default["counts"] and default["counts"]["complete"]
    assert any(row["degrees"]["schedule"] == "interleaved-1F1B" for row in default["ranked"])
    assert [(row["degrees"], row["iteration_ms"]) for row in default["ranked"]] == \
        [(row["degrees"], row["iteration_ms"]) for row in named["ranked"]]
    # under the default --time-limit the solves run between configurations by the wall clock, each within its
    # share (planner/solve/searchqueue.py): how many ran before the bar fell, and so how many the bound pruned or a
    # share stopped, follow the machine's load; every configuration kept is solved or pruned either way
    clocked = ("wall_s", "solved", "solved_without_plan", "solved_early", "pruned_time", "pruned_bubble", "deferred")
    assert {k: v for k, v in default["counts"].items() if k not in clocked} == \
        {k: v for k, v in named["counts"].items() if k not in clocked}
    assert [c["solved"] + c["pruned_time"] for c in (default["counts"], named["counts"])] == \
        [c["considered"] - c["duplicates"] - c["refused"] - c["pruned_memory"] for c in (default["counts"], named["counts"])]


def test_search_scores_a_framework_config_beside(tmp_path):
    """--from-torchtitan: the file's configuration is scored under the same cost model beside the
    ranking, with what it asks for that is not charged said; another model's file is refused."""
    fixture = Path(__file__).parent / "fixtures" / "configs" / "torchtitan_llama3_8b.toml"
    # the ranking beside it at 1F1B and micro-batch 1 (the file's row is scored whatever the space searched: the same
    # 2789.57 ms as with the whole space, a third of its CPU; §66.suitetime)
    args = ["search", "--arch", "llama3-8b", "--gpus", "64", "--global-batch", "128", "--seq-len", "8192",
            "--runtime", "torchtitan", "--top", "1", "--out", tmp_path / "plan.yaml", "--json", "--schedules", "1F1B",
            "--micro-batch-sizes", "1"]
    result = run_ok(*args, "--from-torchtitan", fixture)
    others = json.loads(result.stdout)["compared"]
    assert [row["name"] for row in others] == [f"torchtitan: {fixture}"]
    assert others[0]["iteration_ms"] > 0
    assert "selective_ac_option" in others[0]["note"]
    refused = run(*args[:2], "llama3-70b", *args[3:], "--from-torchtitan", fixture)
    assert refused.exit_code != 0
    assert "another model than the one searched" in refused.output
