"""scripts/asynctp_credit.py: AsyncTP's saving, published against ckplan, and one block's terms by hand."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.scripts import load_script

credit = load_script("asynctp_credit")


def test_pairs_ratio_and_missing():
    published = {"T9": 27.43, "T10": 25.11, "T11": 2.8, "A1": 2.5}
    ckplan = {"T9": 24.0, "T10": 20.0, "T11": 2.4}  # A1 not run: its pair is named, not scored
    rows, missing = credit.pair_rows(published, ckplan)
    assert [r["pair"] for r in rows] == ["T9/T10"]
    assert rows[0]["published_speedup"] == pytest.approx(27.43 / 25.11)
    assert rows[0]["ckplan_speedup"] == pytest.approx(1.2)
    assert missing == ["A4/A5", "T11/A1", "A2/A3", "M15/M16"]


def test_block_terms_by_hand():
    # tp 2, 400 MB tensors at 100 GB/s: a ring moves half of it, 2 ms; a peer copy moves tp's share, 2 ms.
    # all-gather + matmul: own chunk (1 ms) beside the copy (2 ms), then the peer's chunk: 3 ms, plus the
    # local copy 0.5, less the matmuls' whole 2: 1.5 ms. matmul + reduce-scatter: the peer's chunk (1),
    # its copy (2): 3 ms; own chunk meanwhile; plus the partials' sum 0.5, less 2: 1.5 ms.
    fused = {"whole_ms": 2.0, "chunk_ms": 1.0, "copy_ms": 0.5}
    collectives = [
        {"kind": "all-gather", "tensor_bytes": 4e8, "fwd": 1, "bwd": 0, "recompute": 1, "fused": fused},
        {"kind": "reduce-scatter", "tensor_bytes": 4e8, "fwd": 1, "bwd": 0, "recompute": 1, "fused": fused},
        {"kind": "reduce-scatter", "tensor_bytes": 4e8, "fwd": 0, "bwd": 1, "recompute": 0, "fused": None},
    ]
    terms = credit.block_terms(collectives, 2, 100.0)
    assert terms["fwd"] == pytest.approx((4.0, 3.0))
    assert terms["recompute"] == pytest.approx((4.0, 3.0))
    assert terms["bwd"] == pytest.approx((2.0, 2.0))  # unfused: its ring time either way


def test_main_refuses_bad_input(tmp_path, capsys):
    assert credit.main(["pairs", str(tmp_path / "none")]) == 2
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"layers": [{"name": "layers.0", "collectives": []}]}))
    assert credit.main(["block", str(profile), "layers.0", "8", "354.9"]) == 2
    assert credit.main(["block", str(profile), "layers.0", "eight", "354.9"]) == 2
    assert credit.main([]) == 2
    err = capsys.readouterr().err
    assert "not a folder" in err and "no layer layers.0" in err and "whole number" in err


def test_block_terms_copy_rate_moves_only_the_fused_copies():
    # the peer copies at 200 GB/s: 1 ms each; the ring (NCCL) stays at the link's 100 GB/s
    fused = {"whole_ms": 2.0, "chunk_ms": 1.0, "copy_ms": 0.5}
    collectives = [{"kind": "all-gather", "tensor_bytes": 4e8, "fwd": 1, "bwd": 0, "recompute": 0, "fused": fused}]
    # own chunk 1 ms beside the 1 ms copy, then the peer's chunk: 2 ms, + 0.5 - 2
    assert credit.block_terms(collectives, 2, 100.0, 200.0)["fwd"] == pytest.approx((2.0, 0.5))
    assert credit.main(["block", "p.json", "layers.0", "8", "1", "2", "3"]) == 2  # one link rate, one copy rate


def test_block_refuses_a_missing_profile_and_bad_rates(tmp_path, capsys):
    assert credit.main(["block", str(tmp_path / "none.json"), "layers.0", "8", "354.9"]) == 2
    assert credit.main(["block", str(tmp_path / "none.json"), "layers.0", "1", "354.9"]) == 2
    assert credit.main(["block", str(tmp_path / "none.json"), "layers.0", "8", "0"]) == 2
    err = capsys.readouterr().err
    assert "not a readable profile" in err and "at least 2" in err
