"""scripts/deepspeed_mbs_sweep.py: the Azure post's Figures 6 and 7 read off their pixels and turned into seconds
(docs/published-runs.md §68.dsrows), by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import deepspeed_mbs_sweep as sweep  # noqa: E402
import published_rows  # noqa: E402


def test_the_scale_is_the_labelled_bars_pixels_a_tflops():
    # 530B: 785 - 190 = 595 px for 170.42, 785 - 187 = 598 for 171.37; 1T: 785 - 208 = 577 for 165.36
    by_hand = (595 / 170.42 + 598 / 171.37 + 577 / 165.36) / 3  # 3.49137, 3.48953, 3.48936
    assert sweep.px_per_tflops() == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(3.49009, abs=1e-5)
    # an unlabelled bar: 530B on 512 GPUs at micro-batch 1 stands 785 - 561 = 224 px
    assert sweep.tflops(("530b", 512, 1)) == pytest.approx(224 / 3.49009, abs=1e-3)  # 64.18
    assert sweep.tflops(("1t", 1024, 8)) == 165.36  # a labelled bar is its label


def test_a_sample_is_megatron_deepspeeds_checkpointed_formula():
    # 96 x 1024 x 105 x 20480^2 = 98,304 x 105 x 419,430,400 = 4,329,327,034,368,000
    # x (1 + 1024/122,880 + 50,304/34,406,400) = x 1.0097953869 (1024/122,880 = 0.0083333, 50,304/34,406,400 = 0.0014621)
    assert 96 * 1024 * 105 * 20480**2 == 4_329_327_034_368_000
    assert sweep.flops_per_sample(105, 20480) == pytest.approx(4_329_327_034_368_000 * 1.0097953869, rel=1e-10)
    # mbs 8 at the label is the DS2 row's published time, the same derivation
    assert sweep.published_s(("530b", 512, 8)) == pytest.approx(205.222, abs=1e-3)
    assert sweep.published_s(("1t", 1024, 8)) == pytest.approx(401.994, abs=1e-3)
    # 530B at mbs 1 on 512 GPUs: 4.37173e15 / 64.18e12 = 68.11 s
    assert sweep.published_s(("530b", 512, 1)) == pytest.approx(68.11, abs=0.01)


def test_each_point_is_its_row_with_one_knob_moved():
    table = published_rows.load_table()
    profiles, rows = sweep.points(table)
    assert len(rows) == 16 and len(profiles) == 8
    ds4 = next(row for row in table.rows if row.id == "DS4")
    point = rows[("1t", 512, 2)]
    moved = [a for a, b in zip(point.args, ds4.args) if a != b]
    assert len(point.args) == len(ds4.args) and moved == ["512"]
    assert point.args[point.args.index("--dp") + 1] == "512" and point.profile == "ds_gpt1t_mbs2"
    mbs8 = table.profiles["ds_gpt1t_mbs8"]
    assert [a for a, b in zip(profiles["ds_gpt1t_mbs2"], mbs8) if a != b] == ["2"]
    assert profiles["ds_gpt1t_mbs8"] == mbs8
    assert rows[("1t", 1024, 8)].args == ds4.args  # the row itself
