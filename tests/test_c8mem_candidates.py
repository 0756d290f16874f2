"""scripts/cp_memory_candidates.py: each candidate's bytes at C8's shape by hand (docs/published-runs.md §31.c8mem)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

MIB = 2**20
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "cp_memory_candidates.py"


def _script():
    spec = importlib.util.spec_from_file_location("cp_memory_candidates", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_c8s_candidates_by_hand():
    # 405B at TP 8: 16 query heads a rank of 128, 32,768 tokens a rank: Q 128 MiB, K and V repeated 256 MiB
    got = _script().candidates("405b", 262144, 8, 8)
    assert got["gathered K/V (cp x K/V)"] == 8 * 256 * MIB
    assert got["compiled ring's backward peak, (cp + 4.5) K/V + 5 Q"] == 12.5 * 256 * MIB + 5 * 128 * MIB
    assert got["rotary table, one a stage"] == 262144 * 64 * 8 == 128 * MIB
    assert got["eager loss's fp32 log-softmax (last rank)"] == 32768 * 16032 * 4  # 2,004 MiB
    assert got["lse + flash softmax_d, fp32 (not charged)"] == 2 * 32768 * 16 * 4 == 4 * MIB
    # the gathered K/V, its input, and 8 fp32 dK/dV sends and receives of 2 K/V each: 10,496 MiB
    assert got["a block's ring collectives under record_stream (off at 9dec370)"] == (8 + 1 + 32) * 256 * MIB
    assert got["a [tokens, hidden] fp32 tensor (no such tensor under SP)"] == 32768 * 16384 * 4 == 2048 * MIB
    # CP 1 (C5): no ring
    assert _script().candidates("405b", 32768, 1, 8)["gathered K/V (cp x K/V)"] == 0


def test_the_table_reads_a_harness_folder(tmp_path, capsys):
    stage = {"reserved_bytes": 70 * 2**30, "peak_bytes": 64 * 2**30}
    (tmp_path / "C8.json").write_text(json.dumps({"stages": [stage, {**stage, "reserved_bytes": 71 * 2**30}]}))
    assert _script().main([str(tmp_path)]) == 0
    line = next(text for text in capsys.readouterr().out.splitlines() if text.startswith("C8"))
    assert "71.00 /  64.00" in line and "step: published +7.8" in line
    assert _script().main(["a", "b"]) == 2
