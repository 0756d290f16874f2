"""What could hold torchtitan's 405B at CP 8 (row C8) above ckplan: each candidate's bytes a rank at the CP rows'
shapes, by hand from the code ckplan read (docs/published-runs.md §31.c8mem, docs/framework-facts.md §139), beside
the published reserves' steps between rows and, where a harness output folder is given, ckplan's.

usage: PYTHONPATH=<checkout> python scripts/cp_memory_candidates.py [HARNESS_OUT]

A candidate that grows only with CP must also keep C5-C7 (the 405B at CP 1, 2, 4) and C1-C4 (the 8B at CP 1-8, whose
K/V a rank are twice the 405B's) where they are measured: the table prints each candidate's step between rows.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

GIB = 2**30
# (row, model, sequence, cp, tp, published reserved GiB): scripts/published_rows.toml, torchtitan
# benchmarks/llama3_h100_202412_torchtitan.md (31a17bfd) Tables 2 and 6
ROWS = (("C1", "8b", 32768, 1, 1, 83.9), ("C2", "8b", 65536, 2, 1, 84.2), ("C3", "8b", 131072, 4, 1, 84.0),
        ("C4", "8b", 262144, 8, 1, 84.5), ("C5", "405b", 32768, 1, 8, 75.3), ("C6", "405b", 65536, 2, 8, 75.9),
        ("C7", "405b", 131072, 4, 8, 77.1), ("C8", "405b", 262144, 8, 8, 84.9))
# hidden, query heads, K/V heads, vocabulary (planner/models/archs.py: meta-llama's config.json)
MODELS = {"8b": (4096, 32, 8, 128256), "405b": (16384, 128, 8, 128256)}


def candidates(model: str, seq: int, cp: int, tp: int) -> dict[str, int]:
    """Each candidate's bytes on rank cp - 1 of a CP group (one sequence a microbatch, bf16 activations)."""
    hidden, heads, _, vocab = MODELS[model]
    tokens, head_dim = seq // cp, hidden // heads
    q = tokens * heads // tp * head_dim * 2
    kv = 2 * q  # K and V repeated to the query heads (9dec370's repeat_kv), each as wide as Q
    ring = cp > 1
    return {
        # charged (planner/cost/cpring.py, contextparallel.py)
        "gathered K/V (cp x K/V)": cp * kv if ring else 0,
        "compiled ring's backward peak, (cp + 4.5) K/V + 5 Q": int((cp + 4.5) * kv + 5 * q) if ring else 0,
        "rotary table, one a stage": seq * head_dim // 2 * 8,
        "eager loss's fp32 log-softmax (last rank)": tokens * (vocab // tp) * 4,
        # not charged
        "lse + flash softmax_d, fp32 (not charged)": 2 * tokens * heads // tp * 4 if ring else 0,
        "a block's ring collectives under record_stream (off at 9dec370)": (cp * kv + kv + cp * 4 * kv) if ring else 0,
        "a [tokens, hidden] fp32 tensor (no such tensor under SP)": tokens * hidden * 4,
    }


def ckplan_rows(folder: Path) -> dict[str, tuple[float, float]]:
    """(the largest reserved, the largest allocated peak) over ranks, GiB, from the harness's JSON per row."""
    out = {}
    for row, *_ in ROWS:
        path = folder / f"{row}.json"
        if path.exists():
            stages = json.loads(path.read_text())["stages"]
            out[row] = (max(s["reserved_bytes"] for s in stages) / GIB, max(s["peak_bytes"] for s in stages) / GIB)
    return out


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        sys.stderr.write("usage: cp_memory_candidates.py [HARNESS_OUT]\n")
        return 2
    ours = ckplan_rows(Path(argv[0])) if argv else {}
    table = {row: candidates(model, seq, cp, tp) for row, model, seq, cp, tp, _ in ROWS}
    names = list(table["C8"])
    print("row  published  " + ("ckplan reserved / allocated  " if ours else "") + " | ".join(
        f"c{i}" for i in range(len(names))))
    previous = None
    for row, model, _seq, _cp, _tp, published in ROWS:
        mine = f"{ours[row][0]:6.2f} / {ours[row][1]:6.2f}        " if row in ours else ""
        cells = " | ".join(f"{table[row][n] / GIB:6.2f}" for n in names)
        step = ""
        if previous and previous[1] == model:
            step = f"   step: published {published - previous[2]:+.1f}, candidates " + " ".join(
                f"{(table[row][n] - table[previous[0]][n]) / GIB:+.2f}" for n in names)
        print(f"{row}   {published:5.1f}     {mine}{cells}{step}")
        previous = (row, model, published)
    for i, name in enumerate(names):
        print(f"c{i}: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
