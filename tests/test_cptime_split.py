"""The published-rows harness's split of an iteration by term (scripts/published_rows.py split_terms) under context
parallelism: torch's ring's exchange and its own memory-bound kernels come out of compute as their own terms, the
flash calls are named inside compute, and the parts add up to the iteration."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fixtures.scripts import load_script

from planner.cli import cli
from planner.cost import comm, contextparallel

rows_mod = load_script("published_rows")
BLOCKS = ",".join(f"layers.{i}" for i in range(32))
PARTS = ("compute_s", "tp_comm_s", "cp_exchange_s", "cp_ring_membound_s", "sends_s", "step_and_exposed_dp_s",
         "bubble_s")


@pytest.fixture(scope="module")
def cp2(tmp_path_factory):
    out = tmp_path_factory.mktemp("split") / "l8_s4096_cp2.json"
    result = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "4096", "--cp", "2",
                                      "--micro-batch-size", "1", "--gpu", "h100", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _captured(path, *extra):
    return rows_mod.capture(["--profile", str(path), "--layers-per-stage", "34", "--checkpoint", BLOCKS,
                             "--microbatches", "1", "--mem", "80GB", "--dp", "4", "--cp", "2", "--zero", "3",
                             "--precision", "bf16-mixed", "--runtime", "torchtitan", "--runtime-version", "9dec370",
                             *extra])


def test_the_compiled_rings_exchange_is_the_gathers_and_the_fp32_passes_whole_and_the_parts_add_up(cp2):
    captured = _captured(cp2, "--compile")
    got = rows_mod.split_terms("t", *captured)
    assert sum(got[part] for part in PARTS) == pytest.approx(got["iteration_s"], abs=1e-9)
    # torchtitan 9dec370's compiled ring waits for each exchange where it issues it (framework-facts §37): a block,
    # fully recomputed, all-gathers cp x K/V in its forward and again in the rerun (the backward reuses the rerun's,
    # §30), then sends fp32 dK/dV (2 x the K/V bytes) cp times. K/V as exchanged: 2,048 tokens a rank x 32 heads
    # (repeat_kv: 8 K/V heads widened to the query heads) x 128 x 2 B, K and V: 32 MiB
    kv = 2048 * 32 * 128 * 2 * 2
    assert kv == 32 * 2**20
    link = contextparallel.cp_link(captured[2])
    block = 2 * comm.collective_ms("all-gather", 2 * kv, 2, link) + 2 * comm.send_ms(2 * kv, link)
    assert got["cp_exchange_s"] == pytest.approx(32 * block / 1e3, rel=1e-9)
    # the flash calls inside compute: each block's record, forward twice (the rerun) and backward, from the file
    layers = [layer for layer in json.loads(cp2.read_text())["layers"] if layer.get("context_parallel")]
    assert len(layers) == 32
    core = sum(2 * layer["context_parallel"]["attention_fwd_ms"] + layer["context_parallel"]["attention_bwd_ms"]
               for layer in layers)
    assert got["attention_core_s"] == pytest.approx(core / 1e3, rel=1e-9)
    assert 0 < got["attention_core_s"] < got["compute_s"] and got["cp_ring_membound_s"] > 0


def test_eager_the_ring_overlaps_its_exchange_and_its_merge_runs_unfused(cp2):
    compiled = rows_mod.split_terms("t", *_captured(cp2, "--compile"))
    eager = rows_mod.split_terms("t", *_captured(cp2))
    assert eager["cp_exchange_s"] < compiled["cp_exchange_s"]  # hidden behind the ring's steps, §28
    assert eager["cp_ring_membound_s"] > compiled["cp_ring_membound_s"]  # eager kernels, not inductor's fused ones
    assert eager["attention_core_s"] == compiled["attention_core_s"]


def test_without_a_cp_record_there_is_no_attention_core():
    assert rows_mod._attention_core_ms(None, 1) == 0.0
