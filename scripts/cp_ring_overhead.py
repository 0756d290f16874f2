"""What torch's ring costs a CP row beyond its flash calls in ckplan, beside what a published ring measured
(docs/published-runs.md §42.cplong; docs/framework-facts.md §491).

A ring's overhead factor is its attention's whole time over its flash calls' time: ckplan's is a row's
(attention core + exposed exchange + the ring's memory-bound kernels) / attention core, from `published_rows.py
split` (each flash call at the causal rate of the rank's s / cp tokens, §64). zhuzilin/ring-flash-attention's
README (01c8baf5) times the same load balance (its `zigzag_ring`: a rank holds chunks r and 2cp - 1 - r, torch's
`_RoundRobinLoadBalancer`) on 8 GPUs, 8,192 tokens a GPU, LLaMA 3.1 8B's heads (32 query, 8 K/V, head dim 128),
causal, bf16 (benchmark/benchmark_kvpacked_func.py, 556ddaae), against "theoretic flash_attn": one flash call over
a GPU's own 8,192 tokens, causal, iterations / 8 (a ring makes 8 x the pairs of that call, its README's note): the
same base ckplan charges a ring step at. Its factor is theoretic / ring iterations a second.

What a row asks of the ring, were its whole gap (published - ckplan) the ring's own overhead: (ckplan's ring time +
gap) / attention core. Only the 8B rows (C2-C4: one microbatch, no pipeline) are asked; the 405B rows' gap passes
through the 1F1B bubble and is printed as ckplan's factor only.

    PYTHONPATH=. python scripts/cp_ring_overhead.py PROFILE_DIR [--only C2,C3,C4] [--also ROW=PROFILE.json ...]

PROFILE_DIR: the rows' profiles (`published_rows.py profiles --only C2,C3,C4 --work PROFILE_DIR`). `--also C4=P.json`
costs row C4's arguments on another profile (a `ckplan profile` of the same model at another length, e.g. the
published ring's 8,192 tokens a rank: `--seq-len 65536 --cp 8`), for ckplan's factor at that chunk.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_rows import HarnessError, capture, load_table, split, split_terms  # noqa: E402

# zhuzilin/ring-flash-attention README.md at 01c8baf5, the batch api's table (iterations a second): (theoretic
# flash_attn, i.e. flash_attn's own iterations / 8, zigzag_ring), 8 GPUs, 8,192 tokens a GPU
ZIGZAG_PUBLISHED = {
    "8xH800, forward + backward": (154.7 / 8, 17.4),
    "8xA100, forward + backward": (94.7 / 8, 10.6),
    "8xH800, forward only": (591.5 / 8, 63.0),
    "8xA100, forward only": (373.4 / 8, 38.2),
}
ASKED_ROWS = ("C2", "C3", "C4")  # one microbatch, no pipeline: the gap is the iteration's own
DEFAULT_ROWS = ("C2", "C3", "C4", "C6", "C7", "C8")


def published_factor(theoretic_per_s: float, ring_per_s: float) -> float:
    """A published ring's time over its flash calls' (the base ring's iterations a second over the ring's)."""
    return theoretic_per_s / ring_per_s


def ring_factor(terms: dict) -> float:
    """ckplan's ring time (flash calls, exposed exchange, memory-bound kernels) over its flash calls, from a split."""
    core = terms["attention_core_s"]
    return (core + terms["cp_exchange_s"] + terms["cp_ring_membound_s"]) / core


def asked_factor(terms: dict, published_s: float) -> float:
    """The ring factor a row's published time asks, its whole gap laid on the ring's own overhead."""
    core = terms["attention_core_s"]
    gap = published_s - terms["iteration_s"]
    return (core + terms["cp_exchange_s"] + terms["cp_ring_membound_s"] + gap) / core


def split_on(row, profile: Path) -> dict:
    """The row's split with its arguments costed on `profile` in place of its own."""
    return split_terms(row.id, *capture(["--profile", str(profile)] + list(row.args)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", type=Path)
    parser.add_argument("--only", default=",".join(DEFAULT_ROWS))
    parser.add_argument("--also", action="append", default=[], metavar="ROW=PROFILE")
    args = parser.parse_args(argv)
    if not args.profiles.is_dir():
        print(f"{args.profiles} is not a folder: make the profiles with published_rows.py profiles --only "
              f"{args.only} --work {args.profiles}", file=sys.stderr)
        return 2
    table = {row.id: row for row in load_table().rows}
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in table or not name.startswith("C")]
    if unknown:
        print(f"not a CP row of scripts/published_rows.toml: {', '.join(unknown)}", file=sys.stderr)
        return 2
    also = [item.partition("=") for item in args.also]
    bad = [f"{name}={path}" for name, _, path in also if name not in table or not Path(path).is_file()]
    if bad:
        print(f"--also takes ROW=PROFILE.json with a row of scripts/published_rows.toml and a profile file: "
              f"{', '.join(bad)}", file=sys.stderr)
        return 2
    for label, (theoretic, ring) in ZIGZAG_PUBLISHED.items():
        print(f"published zigzag ring, {label}: {published_factor(theoretic, ring):.3f}")
    for name in names:
        try:
            terms = split(table[name], args.profiles)
        except HarnessError as error:
            print(f"{name}: {error}", file=sys.stderr)
            return 2
        if not terms["attention_core_s"]:
            print(f"{name}: no ring (CP 1)")
            continue
        line = f"{name}: ckplan's ring {ring_factor(terms):.3f}"
        if name in ASKED_ROWS:
            line += f", the published {table[name].time_s:g} s asks {asked_factor(terms, table[name].time_s):.3f}"
        print(line)
    for name, _, path in also:
        terms = split_on(table[name], Path(path))
        print(f"{name} on {path}: ckplan's ring {ring_factor(terms):.3f}" if terms["attention_core_s"]
              else f"{name} on {path}: no ring")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
