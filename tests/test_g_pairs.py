"""scripts/g_pairs.py: the G rows' pairs (docs/published-runs.md §39.gpair)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import g_pairs  # noqa: E402


def test_host_share_by_hand():
    # G1 / G33: 0.1268 / 0.1441; the device 8 / 3.35 faster, the host 37.08 / 13.48 slower
    ratio, g, h = 0.1268 / 0.1441, 8.0 / 3.35, 37.08 / 13.48
    assert g_pairs.host_share_at_most(ratio) == pytest.approx((ratio - 1 / g) / (h - 1 / g))
    assert g_pairs.host_share_at_most(ratio, device=1e12) == pytest.approx(ratio / h)
    assert g_pairs.host_share_at_most(1 / g) == pytest.approx(0.0)  # a step only the device's: no host at all


def test_the_schedules_by_hand():
    # interleaved with equal chunks: M x V + P - 1 chunk-microbatches (4 x 3 + 3)
    assert g_pairs.g2_ms(1.0, 0.0) == pytest.approx(15.0)
    # 1F1B of 2/4/4/2 blocks: under the closed form, every stage once and M - 1 of the slowest (12 + 3 x 4)
    assert g_pairs.g1_ms(1.0, 0.0) <= 24.0
    # a head on the last stage costs G2 four times (one a microbatch, on the critical rank) and G1 less
    ratios = [g_pairs.g1_ms(1.0, h) / g_pairs.g2_ms(1.0, h) for h in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert ratios == sorted(ratios, reverse=True)


def test_the_published_h100_pair_is_beyond_any_head(capsys):
    b, h, left = g_pairs.asked(144.1, 91.8)
    assert h == 0.0 and b == pytest.approx(91.8 / 15.0) and left > 0  # 1.570 > 1.511, equal blocks and a free head
    b, h, left = g_pairs.asked(126.8, 106.0)  # the same configs on GB200
    assert h > 0 and left == pytest.approx(0.0, abs=1e-6)


def test_rows_without_the_folders_is_one_sentence(tmp_path, capsys):
    assert g_pairs.main(["rows", str(tmp_path / "nope"), str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
