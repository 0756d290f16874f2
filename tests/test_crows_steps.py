"""scripts/cp_row_steps.py: the increments between a CP table's rows and the per-later-step term's interval, by hand."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.scripts import load_script

steps = load_script("cp_row_steps")
Row = steps.CpRow


def test_increments_are_consecutive_rows_differences_with_the_ring_steps_added():
    rows = [Row("A", 1, 10.0, 9.0), Row("B", 2, 14.0, 12.0), Row("C", 4, 30.0, 18.0)]
    assert steps.increments(rows) == [("A->B", 1, 4.0, 3.0), ("B->C", 2, 16.0, 6.0)]


def test_delta_interval_is_the_intersection_of_each_rows_band_over_its_later_steps():
    # B (1 later step): [0.85*14 - 12, 1.15*14 - 12] = [-0.1, 4.1]; C (3 later steps): [(25.5 - 18)/3, (34.5 - 18)/3]
    # = [2.5, 5.5]; A at CP 1 takes no delta
    rows = [Row("A", 1, 10.0, 9.0), Row("B", 2, 14.0, 12.0), Row("C", 4, 30.0, 18.0)]
    low, high = steps.delta_interval(rows)
    assert low == pytest.approx(2.5) and high == pytest.approx(4.1)


def test_delta_interval_is_none_when_the_rows_ask_for_disjoint_terms():
    # B allows at most 1.15*10 - 10 = 1.5 s; C needs at least (0.85*40 - 20)/3 = 4.67 s a step
    assert steps.delta_interval([Row("B", 2, 10.0, 10.0), Row("C", 4, 40.0, 20.0)]) is None


def test_main_reads_a_results_folder_and_refuses_a_missing_one(tmp_path, capsys):
    for name in ("C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"iteration_s": 10.0}))
    assert steps.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "C1->C2: +1 ring steps, published +4.48 s, ckplan +0.00 s" in out
    assert steps.main([str(tmp_path / "absent")]) == 2
    (tmp_path / "C7.json").unlink()
    assert steps.main([str(tmp_path)]) == 2
    assert "has no result for C7" in capsys.readouterr().err
