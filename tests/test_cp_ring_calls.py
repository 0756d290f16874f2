"""What a rank of a causal, load-balanced context-parallel ring computes per step (planner/profiler/analytic_cp.py
ring_calls), checked against a brute-force causal mask, and the attention time the analytic profile charges for
it: every call at the efficiency of the rank's own s / cp tokens (analytic_time._attention)."""

from __future__ import annotations

import pytest

from planner.models import archs
from planner.profiler import analytic_cp
from planner.profiler.formulas import Shape
from planner.profiler.roofline import attention_efficiency

H100 = archs.gpu("h100")


def _rank_tokens(seq_len: int, cp: int, rank: int) -> tuple[list[int], list[int]]:
    """The load balancer's two chunks of rank `rank`: chunk r and chunk 2cp - 1 - r of 2cp."""
    chunk = seq_len // (2 * cp)
    first = list(range(rank * chunk, (rank + 1) * chunk))
    second = list(range((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk))
    return first, second


def test_ring_calls_by_hand_at_32_tokens_over_4_ranks():
    # s / cp = 8 tokens a rank, chunks of 4: step 0 causal 8 x 8, then 8 x 4 (i <= rank) or 4 x 8 (i > rank)
    assert [(c.step, c.queries, c.keys, c.causal) for c in analytic_cp.ring_calls(32, 4, 0)] == \
        [(0, 8, 8, True), (1, 4, 8, False), (2, 4, 8, False), (3, 4, 8, False)]
    assert [(c.queries, c.keys) for c in analytic_cp.ring_calls(32, 4, 1)] == [(8, 8), (8, 4), (4, 8), (4, 8)]
    assert [(c.queries, c.keys) for c in analytic_cp.ring_calls(32, 4, 3)] == [(8, 8), (8, 4), (8, 4), (8, 4)]
    # every call 2 x 4^2 = 32 pairs: a causal call's over the rank's 8 tokens (8 x 8 / 2)
    assert {c.pairs for r in range(4) for c in analytic_cp.ring_calls(32, 4, r)} == {32}


@pytest.mark.parametrize("seq_len, cp", [(16, 2), (32, 4), (64, 8), (48, 3)])
def test_each_later_call_is_exactly_the_causal_pairs_between_the_rank_and_the_keys_it_holds(seq_len, cp):
    # brute force: at step i rank r holds the K/V of rank (r - i) mod cp; the pairs a causal mask keeps between
    # r's queries and those keys are a full rectangle of the call's queries x keys (none on a diagonal)
    for rank in range(cp):
        first, second = _rank_tokens(seq_len, cp, rank)
        queries = first + second
        for call in analytic_cp.ring_calls(seq_len, cp, rank)[1:]:
            source = _rank_tokens(seq_len, cp, (rank - call.step) % cp)
            keys = source[0] + source[1]
            kept = {(q, k) for q in queries for k in keys if k <= q}
            rows, cols = {q for q, _ in kept}, {k for _, k in kept}
            assert len(kept) == len(rows) * len(cols) == call.queries * call.keys == call.pairs
            assert rows == (set(queries) if call.step <= rank else set(second))
            assert cols == (set(source[0]) if call.step <= rank else set(keys))


@pytest.mark.parametrize("seq_len, cp", [(16, 2), (32, 4), (64, 8)])
def test_every_rank_computes_the_same_pairs_the_whole_causal_mask_splits_to_it(seq_len, cp):
    # the brute-force causal pairs of a rank's queries against the whole sequence (k <= q) are the ring's pairs
    # plus the half of its step-0 diagonal flash's count leaves out (s / cp tokens, halved: s / 2cp)
    for rank in range(cp):
        first, second = _rank_tokens(seq_len, cp, rank)
        brute = sum(q + 1 for q in first + second)
        ring = sum(call.pairs for call in analytic_cp.ring_calls(seq_len, cp, rank))
        assert ring == seq_len**2 // (2 * cp)
        assert brute == ring + seq_len // (2 * cp)


def test_the_rank_attention_runs_at_its_own_chunks_length():
    # LLaMA 3 8B at 8,192 tokens over CP 4: a rank's flash work is 4 x 2 x 1024^2 pairs x 32 heads x 128, the very
    # FLOPs of pytorch/benchmark c0409aaf's 2,048-token row on H100 (batch 8 x 16 heads, causal), so its time is
    # that row's: forward 0.51504 ms, backward 1.97437 ms (planner/models/gpus.py _SDPA_H100_MS), not the
    # 8,192-token row's rate (which would give 0.4607 ms)
    arch = archs.arch("llama3-8b")
    record = analytic_cp.exchange(arch, Shape(seq_len=8192, micro_batch_size=1, cp=4), H100, None)
    assert 4 * 8192 // 4 * 8192 * 4096 // 2 == 4 * 2048**2 * 128 * 16 * 8 // 2
    assert record.attention_fwd_ms == pytest.approx(0.51504, rel=1e-9)
    assert record.attention_bwd_ms == pytest.approx(1.97437, rel=1e-9)
    whole = 4 * 2048**2 * 128 * 16 * 8 / 2 / (H100.bf16_tflops * 1e12 * attention_efficiency(H100, 8192)[0]) * 1e3
    assert whole == pytest.approx(0.4607, abs=1e-4)


def test_past_the_longest_published_length_the_rate_is_the_longest_ones():
    # the CP rows' chunks (s / cp = 32,768 at every C1-C8 row) lie past 16,384, the longest length published:
    # their rate is 16,384's with or without CP, so those rows do not move
    assert attention_efficiency(H100, 262144 // 8) == attention_efficiency(H100, 262144) == \
        attention_efficiency(H100, 16384)
