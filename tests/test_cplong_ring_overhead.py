"""scripts/cp_ring_overhead.py: a ring's time over its flash calls', ckplan's and a published ring's, by hand."""

from __future__ import annotations

import pytest

from tests.fixtures.scripts import load_script

overhead = load_script("cp_ring_overhead")


def test_published_factor_is_the_base_calls_rate_over_the_rings():
    # the README's 8xH800 forward + backward: flash_attn 154.7 it/s over 8 = 19.3375 against the ring's 17.4
    assert overhead.published_factor(154.7 / 8, 17.4) == pytest.approx(19.3375 / 17.4)
    assert overhead.published_factor(20.0, 16.0) == 1.25


def test_ring_factor_adds_the_exchange_and_the_memory_bound_kernels_to_the_flash_calls():
    terms = {"attention_core_s": 10.0, "cp_exchange_s": 0.5, "cp_ring_membound_s": 0.25, "iteration_s": 12.0}
    assert overhead.ring_factor(terms) == pytest.approx(10.75 / 10.0)


def test_asked_factor_lays_the_whole_gap_on_the_ring():
    # gap 25 - 20 = 5 s on a ring of 10 + 0.5 + 0.5 s: (11 + 5) / 10
    terms = {"attention_core_s": 10.0, "cp_exchange_s": 0.5, "cp_ring_membound_s": 0.5, "iteration_s": 20.0}
    assert overhead.asked_factor(terms, 25.0) == pytest.approx(1.6)
    # a row ckplan charges slow asks less than its own ring
    assert overhead.asked_factor(terms, 19.0) == pytest.approx(1.0)


def test_main_prints_each_rows_factors_from_its_split(tmp_path, capsys, monkeypatch):
    splits = {"C1": {"attention_core_s": 0.0, "cp_exchange_s": 0.0, "cp_ring_membound_s": 0.0, "iteration_s": 8.0},
              "C3": {"attention_core_s": 10.0, "cp_exchange_s": 1.0, "cp_ring_membound_s": 1.0, "iteration_s": 22.6},
              "C8": {"attention_core_s": 50.0, "cp_exchange_s": 10.0, "cp_ring_membound_s": 5.0, "iteration_s": 200.0}}
    monkeypatch.setattr(overhead, "split", lambda row, work: splits[row.id])
    assert overhead.main([str(tmp_path), "--only", "C1,C3,C8"]) == 0
    out = capsys.readouterr().out
    assert "published zigzag ring, 8xH800, forward + backward: 1.111" in out
    assert "C1: no ring (CP 1)" in out
    # C3 published 30.6 s: gap 8 s on 12 s of ring over 10 s of calls
    assert "C3: ckplan's ring 1.200, the published 30.6 s asks 2.000" in out
    assert "C8: ckplan's ring 1.300\n" in out


def test_main_refuses_a_missing_folder_and_a_row_that_is_not_a_cp_row(tmp_path, capsys):
    assert overhead.main([str(tmp_path / "absent")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert overhead.main([str(tmp_path), "--only", "M15"]) == 2
    assert "not a CP row of scripts/published_rows.toml: M15" in capsys.readouterr().err


def test_also_costs_a_rows_arguments_on_another_profile_and_refuses_a_missing_one(tmp_path, capsys, monkeypatch):
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    seen = []

    def fake(row, path):
        seen.append((row.id, path))
        return {"attention_core_s": 4.0, "cp_exchange_s": 1.0, "cp_ring_membound_s": 1.0, "iteration_s": 9.0}

    monkeypatch.setattr(overhead, "split", lambda row, work: fake(row, work))
    monkeypatch.setattr(overhead, "split_on", fake)
    assert overhead.main([str(tmp_path), "--only", "C4", "--also", f"C4={profile}"]) == 0
    assert seen == [("C4", tmp_path), ("C4", profile)]
    assert f"C4 on {profile}: ckplan's ring 1.500" in capsys.readouterr().out
    assert overhead.main([str(tmp_path), "--also", f"C4={tmp_path / 'none.json'}"]) == 2
    assert "--also takes ROW=PROFILE.json" in capsys.readouterr().err
