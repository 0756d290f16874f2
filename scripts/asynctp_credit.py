"""What AsyncTP saves, published against ckplan (docs/published-runs.md §29.mi300time).

usage:
  PYTHONPATH=<checkout> python scripts/asynctp_credit.py pairs RESULTS
      each vanilla-TP / AsyncTP pair of torchtitan's published runs (PAIRS) the harness holds:
      the published iterations and their ratio beside ckplan's (RESULTS: a `published_rows.py run
      --out` folder holding both rows of a pair; pairs it lacks are left out, and named).
  PYTHONPATH=<checkout> python scripts/asynctp_credit.py block PROFILE LAYER TP GB_PER_S [COPY_GB_PER_S]
      one block's tensor-parallel collectives as ckplan charges them: each collective NCCL's ring time
      (vanilla TP) beside what its fused pipeline adds beyond its matmuls under AsyncTP
      (planner/cost/asynctp.py), per pass, at the link rate given (GB/s one way); COPY_GB_PER_S, a
      what-if: the fused pipelines' peer copies at that rate instead (ckplan charges them at the link's).

Reads only: the harness's table (published figures), its result JSONs, a profile. Nothing is fitted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from planner.cost import asynctp
from planner.cost.comm import Link, collective_ms

# (vanilla TP, AsyncTP) as scripts/published_rows.toml names them: torchtitan benchmarks/asyncTP_llama3_h100_2025-06_
# torchtitan.md (820504e), and Table 4's 2D rows of benchmarks/llama3_h100_202412_torchtitan.md (9dec370)
PAIRS = (("T9", "T10", "70B bf16"), ("A4", "A5", "70B float8 tensorwise"), ("T11", "A1", "8B bf16"),
         ("A2", "A3", "8B float8 tensorwise"), ("M15", "M16", "70B float8 + float8 all-gather, 2024-12"))
PASSES = ("fwd", "bwd", "recompute")


def pair_rows(published: dict[str, float], ckplan: dict[str, float]) -> tuple[list[dict], list[str]]:
    """Each pair both of whose rows ckplan ran: published and ckplan seconds and speed-ups (vanilla /
    AsyncTP); and the pairs left out."""
    rows, missing = [], []
    for vanilla, fused, name in PAIRS:
        if vanilla not in ckplan or fused not in ckplan:
            missing.append(f"{vanilla}/{fused}")
            continue
        rows.append({"pair": f"{vanilla}/{fused}", "what": name,
                     "published": (published[vanilla], published[fused]),
                     "ckplan": (ckplan[vanilla], ckplan[fused]),
                     "published_speedup": published[vanilla] / published[fused],
                     "ckplan_speedup": ckplan[vanilla] / ckplan[fused]})
    return rows, missing


def block_terms(collectives: list[dict], tp: int, gb_per_s: float,
                copy_gb_per_s: float | None = None) -> dict[str, tuple[float, float]]:
    """Per pass, (NCCL's ring time of the pass's collectives, what they add under AsyncTP): a fused
    collective its pipeline's extra (asynctp.fused_extra_ms, its peer copies at copy_gb_per_s where
    given, else the link's), an unfused one its ring time."""
    copy_rate = gb_per_s if copy_gb_per_s is None else copy_gb_per_s
    link = Link(gb_per_s, 0.0, 0.0)  # bandwidth only: latency is microseconds beside these milliseconds
    out = {}
    for which in PASSES:
        vanilla = fused_total = 0.0
        for c in collectives:
            count = c[which]
            if not count:
                continue
            ring = collective_ms(c["kind"], c["tensor_bytes"], tp, link)
            vanilla += count * ring
            f = c.get("fused")
            fused_total += count * (ring if f is None else asynctp.fused_extra_ms(
                c["kind"], c["tensor_bytes"], tp, copy_rate, (f["whole_ms"], f["chunk_ms"], f["copy_ms"], None, None)))
        out[which] = (vanilla, fused_total)
    return out


def _published_and_ckplan(results: Path) -> tuple[dict[str, float], dict[str, float]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import published_rows  # noqa: E402  (scripts/ sibling)

    published = {row.id: row.time_s for row in published_rows.load_table().rows}
    ckplan = {}
    for path in sorted(results.glob("*.json")):
        ckplan[path.stem] = json.loads(path.read_text())["iteration_s"]
    return published, ckplan


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "pairs":
        results = Path(argv[1])
        if not results.is_dir():
            sys.stderr.write(f"{results} is not a folder of harness results.\n")
            return 2
        rows, missing = pair_rows(*_published_and_ckplan(results))
        print("| pair | run | published s (vanilla / AsyncTP) | speed-up | ckplan s | ckplan speed-up |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['pair']} | {r['what']} | {r['published'][0]:.3f} / {r['published'][1]:.3f} | "
                  f"{r['published_speedup']:.3f} | {r['ckplan'][0]:.3f} / {r['ckplan'][1]:.3f} | {r['ckplan_speedup']:.3f} |")
        if missing:
            print(f"not in {results}: {', '.join(missing)}")
        return 0
    if len(argv) >= 5 and argv[0] == "block":
        if len(argv) > 6:
            sys.stderr.write("block takes one link rate and at most one copy rate.\n")
            return 2
        try:
            tp, rates = int(argv[3]), [float(x) for x in argv[4:]]
        except ValueError:
            sys.stderr.write("TP is a whole number and each GB_PER_S a number.\n")
            return 2
        if tp < 2 or min(rates) <= 0:
            sys.stderr.write("TP is at least 2 and each GB_PER_S above 0.\n")
            return 2
        try:
            profile, name = json.loads(Path(argv[1]).read_text()), argv[2]
        except (OSError, ValueError):
            sys.stderr.write(f"{argv[1]} is not a readable profile (JSON).\n")
            return 2
        layers = [layer for layer in profile.get("layers", []) if layer.get("name") == name]
        if not layers or not layers[0].get("collectives"):
            sys.stderr.write(f"{argv[1]} has no layer {name} with tensor-parallel collectives.\n")
            return 2
        terms = block_terms(layers[0]["collectives"], tp, *rates)
        copies = f", peer copies at {rates[1]:g}" if len(rates) > 1 else ""
        print(f"{name} at {rates[0]:g} GB/s{copies}: " + "; ".join(
            f"{which} NCCL {v:.2f} ms, AsyncTP {f:.2f} ms" for which, (v, f) in terms.items()))
        return 0
    sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
