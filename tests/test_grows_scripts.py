"""scripts/golden_runs.py's steady step (the harness's reading of a Megatron-LM golden-values file) and
scripts/decompose_megatron.py's count of block passes on a pipeline's critical path (docs/published-runs.md
§29.grows)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripts import decompose_megatron, golden_runs


def _golden(values: dict) -> dict:
    return {"iteration-time": {"start_step": 1, "end_step": 9, "step_interval": 1, "values": values}}


def test_steady_step_is_the_median_from_the_fourth_step():
    golden = _golden({"1": "nan", "2": 3.5, "3": 0.4, "4": 0.30, "5": 0.10, "6": 0.20, "7": float("nan")})
    assert golden_runs.steady_step_s(golden) == pytest.approx(0.20)  # steps 4, 5, 6: NaN and the warm-up left out
    assert golden_runs.steady_step_s(golden, skip_first=1) == pytest.approx(0.15)  # steps 5, 6
    assert golden_runs.steady_step_s(_golden({"2": 1.0, "3": 1.0})) is None
    assert golden_runs.steady_step_s({}) is None


def _order(stages_per_rank: list[list[int]]):
    return SimpleNamespace(num_ranks=len(stages_per_rank), stages_of=lambda r: stages_per_rank[r])


def _chunk(*kinds: str):
    return [SimpleNamespace(kind=k) for k in kinds], [0] * len(kinds)


def test_critical_block_passes_by_hand():
    block, emb, head = "decoder_block", "embedding", "norm+lm_head"
    # 1F1B, 4 ranks of 2 / 4 / 4 / 2 blocks (row G1), 4 microbatches: (4 + 3) x 4
    uneven = [_chunk(emb, block, block), _chunk(*[block] * 4), _chunk(*[block] * 4), _chunk(block, block, head)]
    assert decompose_megatron.critical_block_passes(uneven, _order([[0], [1], [2], [3]]), 4) == 28
    # interleaved, 4 ranks x 3 chunks of one block (row G2), 4 microbatches: (4 x 3 + 3) x 1
    chunks = [_chunk(block) for _ in range(12)]
    order = _order([[r, r + 4, r + 8] for r in range(4)])
    assert decompose_megatron.critical_block_passes(chunks, order, 4) == 15
    # no pipeline, 12 blocks, 4 microbatches (row G8): 4 x 12
    assert decompose_megatron.critical_block_passes([_chunk(emb, *[block] * 12, head)], _order([[0]]), 4) == 48
    assert decompose_megatron.critical_block_passes([_chunk(emb, head)], _order([[0]]), 4) == 0
