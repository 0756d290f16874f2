"""scripts/cp_gap_rates.py: what one term would have to run at to close the 8B CP rows' gap, by hand."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.scripts import load_script

gap = load_script("cp_gap_rates")
MIB = 2**20


def test_a_block_receives_two_gathers_and_cp_fp32_dkdv_passes():
    # cp 4, K/V 512 MiB as exchanged: the forward's and the backward's all-gather 3 x 512 each, 4 passes of 1,024
    terms = gap.BlockTerms(cp=4, kv_bytes=512 * MIB, exchange_ms=21.0, flash_ms=528.0)
    assert terms.received_bytes == (2 * 3 * 512 + 4 * 1024) * MIB


def test_implied_rate_and_fraction_lay_the_whole_gap_on_one_term():
    # cp 2, K/V 1 GB: 2 x 1 + 2 x 2 = 6 GB a block; a 0.32 s gap over 32 blocks is 10 ms a block
    terms = gap.BlockTerms(cp=2, kv_bytes=10**9, exchange_ms=10.0, flash_ms=100.0)
    rate, fraction = gap.implied(terms, 0.32)
    assert rate == pytest.approx(6e9 / 20e-3 / 1e9)
    assert fraction == pytest.approx(100 / 110)
    assert gap.implied(terms, 0.0) == (pytest.approx(600.0), pytest.approx(1.0))


def test_block_terms_repeat_kv_to_the_query_heads_and_add_the_three_flash_passes():
    # the 8B's proportions: Q 32 heads, K and V 8 heads each (K+V half of Q's bytes): torchtitan 9dec370 repeats them 4x
    record = {"ranks": 4, "q_bytes": 256 * MIB, "kv_bytes": 128 * MIB, "attention_fwd_ms": 100.0,
              "attention_bwd_ms": 250.0}
    terms = gap.block_terms({"layers": [{"context_parallel": None}, {"context_parallel": record}]})
    assert (terms.cp, terms.kv_bytes, terms.flash_ms) == (4, 512 * MIB, 450.0)
    # waited whole on an NVLink CP link: what the block receives moves at the link's few hundred GB/s
    assert 200 < terms.received_bytes / terms.exchange_ms / 1e6 < 500


def test_main_refuses_missing_folders_and_rows(tmp_path, capsys):
    assert gap.main([str(tmp_path / "absent"), str(tmp_path)]) == 2
    (tmp_path / "C1.json").write_text(json.dumps({"iteration_s": 7.0}))
    assert gap.main([str(tmp_path), str(tmp_path)]) == 2
    assert "C2.json" in capsys.readouterr().err
