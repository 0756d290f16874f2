"""DeepSpeed's own published runs in the harness (§25.dsrows) and ZeRO 3's re-gather rule
(planner/cost/deepspeed_zero3.py), checked against a literal walk of DeepSpeed's trace."""

from __future__ import annotations

import json

import pytest
from fixtures.scripts import load_script

from planner.cost import deepspeed_zero3 as z3
from planner.cost.deepspeed_zero3 import Submodule


def _walk_keeps(block: list[Submodule], j: int, max_reuse: int, *, stop_at_equal: bool) -> bool:
    """partitioned_param_coordinator.__params_to_release as written (v0.6.2 358-378), over the backward's
    trace of one checkpointed block: recompute in order, then backward in reverse; submodule j's
    parameters are released after its recompute unless the walk from the next module sees them."""
    trace = list(block) + list(reversed(block))
    traversed = 0
    for module in trace[j + 1:]:
        if traversed > max_reuse or (stop_at_equal and traversed >= max_reuse):
            break
        if module is block[j]:
            return True
        traversed += module.numel
    return False


@pytest.mark.parametrize("stop_at_equal", [False, True])
@pytest.mark.parametrize("max_reuse", [0, 5, 6, 7, 20, 21, 22, 100])
def test_kept_to_backward_is_the_coordinators_walk(max_reuse, stop_at_equal):
    block = [Submodule("a", (1,)), Submodule("b", (4, 1)), Submodule("c", (3,)), Submodule("d", (2,))]
    expected = [_walk_keeps(block, j, max_reuse, stop_at_equal=stop_at_equal) for j in range(len(block))]
    assert z3.kept_to_backward(block, max_reuse_numel=max_reuse, stop_at_equal=stop_at_equal) == expected


def test_kept_to_backward_by_hand():
    # after a: 2 x (5 + 3 + 2) = 20; after b: 10; after c: 4; d: 0
    block = [Submodule("a", (1,)), Submodule("b", (4, 1)), Submodule("c", (3,)), Submodule("d", (2,))]
    assert z3.kept_to_backward(block, max_reuse_numel=10) == [False, True, True, True]
    assert z3.kept_to_backward(block, max_reuse_numel=10, stop_at_equal=True) == [False, False, True, True]
    assert z3.kept_to_backward(block, max_reuse_numel=3) == [False, False, False, True]


def test_gathered_numel_counts_a_third_gather_and_skips_persistent_parameters():
    block = [Submodule("a", (1,)), Submodule("b", (4, 1)), Submodule("c", (3,)), Submodule("d", (2,))]
    # threshold 1: a (1) and b's bias (1) persistent, never gathered; b 4, c 3, d 2 gathered
    # at 10: b, c, d kept to their backward (a is not, but is persistent): (4 + 3 + 2) x 2, no third
    assert z3.gathered_numel(block, max_reuse_numel=10, persistence_threshold=1) == (18, 0)
    # at 3: b and c gathered a third time
    assert z3.gathered_numel(block, max_reuse_numel=3, persistence_threshold=1) == (18 + 7, 7)


def test_gpt_block_is_megatrons_twelve_h_squared():
    block = z3.gpt_block(8, 32)
    assert [m.name for m in block] == ["input_layernorm", "query_key_value", "dense", "post_attention_layernorm",
                                       "dense_h_to_4h", "dense_4h_to_h"]
    assert sum(m.numel for m in block) == 12 * 64 + 13 * 8  # 12 h^2 + 13 h


def test_the_azure_rows_keep_what_their_distance_allows():
    # 175B (h 12288) at the recipes' 3e9: twice the 1.36e9 after the QKV is 2.72e9, all kept to the backward;
    # 530B (h 20480): only the last linear; at DeepSpeed's default 1e9 the 175B's too
    big, small = z3.gpt_block(12288, 4 * 12288), z3.gpt_block(20480, 4 * 20480)
    assert z3.kept_to_backward(big, max_reuse_numel=3_000_000_000)[1:] == [True] * 5
    assert z3.kept_to_backward(small, max_reuse_numel=3_000_000_000) == [False] * 5 + [True]
    assert z3.kept_to_backward(big, max_reuse_numel=z3.MAX_REUSE_DISTANCE_DEFAULT) == [False] * 5 + [True]


def test_the_deepspeed_rows_are_the_blogs_tflops_turned_into_seconds():
    table = load_script("published_rows").load_table()
    rows = {r.id: r for r in table.rows if r.group == "deepspeed"}
    assert sorted(rows) == ["DS1", "DS2", "DS3", "DS4"]

    def seconds(batch, seq, layers, hidden, gpus, tflops, vocab=50304):
        flops = 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
        return flops / (gpus * tflops * 1e12)

    assert rows["DS1"].time_s == pytest.approx(seconds(256 * 32, 512, 96, 12288, 256, 204.49), abs=1e-3)
    assert rows["DS2"].time_s == pytest.approx(seconds(512 * 8, 1024, 105, 20480, 512, 170.42), abs=1e-3)
    assert rows["DS3"].time_s == pytest.approx(seconds(1024 * 8, 1024, 105, 20480, 1024, 171.37), abs=1e-3)
    assert rows["DS4"].time_s == pytest.approx(seconds(1024 * 8, 1024, 128, 25600, 1024, 165.36), abs=1e-3)
    for row in rows.values():
        assert "--runtime deepspeed" in " ".join(row.args) and "--zero 3" in " ".join(row.args)


def test_the_deepspeed_table_says_time_and_fit_after_the_other_tables(tmp_path):
    rows_mod, table_mod = load_script("published_rows"), load_script("published_rows_table")
    gib = 2**30
    row = rows_mod.Row(id="DSX", label="DSX", group="deepspeed", source="s", time_s=100.0, memory_bytes=None,
                       memory_kind=None, static_bytes=None, profile=None, args=[])

    def write(folder, seconds, peak, reserved, fits):
        folder.mkdir()
        stage = {"peak_bytes": peak * gib, "reserved_bytes": reserved * gib, "after_step_bytes": 0,
                 "cap_bytes": 78 * gib, "fits": fits}
        (folder / "DSX.json").write_text(json.dumps({"id": "DSX", "iteration_s": seconds, "stages": [stage],
                                                     "args": []}))

    write(tmp_path / "before", 80.0, 70, 90, False)
    write(tmp_path / "after", 90.0, 60, 70, True)
    text = table_mod.tables([row], [tmp_path / "before", tmp_path / "after"])
    assert text.splitlines()[-5:] == [
        "| row | published s | ckplan s (ratio) | within 15% | fits (ckplan's allocated / reserved peak + NCCL "
        "buffers, GiB, worst rank, of the cap) |",
        "|---|---|---|---|---|",
        "| DSX | 100.000 | 80.000 (0.800) → 90.000 (0.900) | yes | yes (60.0 / 70.0 + 0.0 of 78.0) |",
        "",
        "Time: 1 of 1 rows within 15%. Fit by ckplan's reckoning: 1 of 1 (all ran).",
    ]
