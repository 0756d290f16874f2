"""What each published MI300X attention figure would make of a row (issue 35, docs/published-runs.md §42.mi300x): the
row's profile remade with the MI300X record's attention rates replaced by one source's forward / backward TFLOP/s,
then evaluated. A bracket of what the sources say, never a rate to charge: none of them is the kernel the rows ran
(torch 2.9.0.dev20250811's SDPA on AOTriton 0.10b, docs/framework-facts.md §166-§167, §472).

    PYTHONPATH=. python scripts/mi300x_attention_bracket.py one ROW SOURCE       # one row, one source: prints seconds
    PYTHONPATH=. python scripts/mi300x_attention_bracket.py table --only M12,F2  # every source, a process each

A source that publishes only one direction keeps the record's figure for the other (said in its label)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_rows  # noqa: E402  (the harness beside this script)

CK = (353.22, 194.43)  # attention_published.MI300X_FLASH_TFLOPS (ROCm/flash-attention#142), non-causal
CK_CAUSAL = (324.29445095593644, 179.2200232167771)  # the record's: CK x AITER's causal / non-causal medians
# label: (forward, backward TFLOP/s, where it is published) — framework-facts §167, §472, §879
SOURCES: dict[str, tuple[float, float, str]] = {
    "ck-causal": (*CK_CAUSAL, "CK FlashAttention-2's non-causal figure x the causal mask's cost on MI300X at 8,192 "
                              "tokens (AITER's nine pairs' median, ROCm/aiter 0403bcdf): the record's"),
    "ck": (*CK, "CK FlashAttention-2, non-causal, 1 x 16,384, head dim 128, ROCm 6.3.2 (ROCm/flash-attention#142): "
                "the record's before §68.mi300x"),
    "aiter-asm": (522.68, 436.13, "AITER's assembly v3 kernels, causal, 1 x 8,192, 32 / 8 heads, head dim 128, bwd a16 "
                                  "(ROCm/aiter op_tests/cpp/mha/README.md, 0403bcdf): AOTriton 0.11b's, after the rows"),
    "triton-fwd": (119.4, CK_CAUSAL[1], "Primus-Turbo's Triton forward before its tuning, causal, 2 x 8,192 MHA, "
                                        "head dim 128 (AMD-AGI/Primus-Turbo#266); the backward the record's (none "
                                        "published)"),
    "aotriton-2024-bwd": (CK_CAUSAL[0], 19.9, "AOTriton's backward on LLaMA 3 8B's shapes at torch 2.5.0.dev20240907 "
                                              "(pytorch/pytorch#135431); the forward the record's (none published)"),
}


def patched_gpu(fwd_tflops: float, bwd_tflops: float):
    """The MI300X record with its attention rates replaced by `fwd_tflops` / `bwd_tflops` (its by-length table
    cleared, so every length reads them)."""
    from planner.models import gpus

    record = gpus.GPUS["mi300x"]
    return dataclasses.replace(record, attention_efficiency=(fwd_tflops / record.bf16_tflops,
                                                             bwd_tflops / record.bf16_tflops), attention_by_seq=())


def one(row_id: str, source: str) -> float:
    """The row's iteration (s) with the MI300X record's attention at `source`'s rates: its profile made in this
    process from the patched record, then evaluated."""
    from click.testing import CliRunner

    from planner.cli import cli
    from planner.models import gpus

    if source not in SOURCES:
        raise published_rows.HarnessError(f"no source {source!r}; choose one of {', '.join(SOURCES)}")
    table = published_rows.load_table()
    row = next((r for r in table.rows if r.id == row_id), None)
    if row is None:
        raise published_rows.HarnessError(f"no row {row_id} in scripts/published_rows.toml")
    if not row.profile or "mi300x" not in table.profiles[row.profile]:
        raise published_rows.HarnessError(f"row {row_id} runs no MI300X profile; the bracket moves only the MI300X's")
    fwd, bwd, _ = SOURCES[source]
    gpus.GPUS["mi300x"] = patched_gpu(fwd, bwd)  # the dict archs re-exports: every gpu() lookup reads it
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / f"{row.profile}.json"
        made = CliRunner().invoke(cli, ["profile", *table.profiles[row.profile], "--out", str(path)])
        if made.exit_code:
            raise published_rows.HarnessError(f"profile {row.profile} failed: {made.output.strip()[-300:]}")
        _, _, _, cost = published_rows.capture(["--profile", str(path), *row.args])
    return cost.iteration_ms / 1e3


def table(rows: list[str]) -> str:
    lines = ["| row | source | fwd / bwd TFLOP/s | iteration s | published s | ratio |", "|---|---|---|---|---|---|"]
    published = {r.id: r.time_s for r in published_rows.load_table().rows}
    for row in rows:
        for source, (fwd, bwd, _) in SOURCES.items():
            done = subprocess.run([sys.executable, __file__, "one", row, source], capture_output=True, text=True)
            if done.returncode:
                raise published_rows.HarnessError((done.stderr or done.stdout).strip().splitlines()[-1])
            seconds = float(done.stdout.split()[-1])
            lines.append(f"| {row} | {source} | {fwd:g} / {bwd:g} | {seconds:.4f} | {published[row]:.3f} | "
                         f"{seconds / published[row]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one_p = sub.add_parser("one")
    one_p.add_argument("row")
    one_p.add_argument("source")
    table_p = sub.add_parser("table")
    table_p.add_argument("--only", required=True, help="rows, comma-separated")
    args = parser.parse_args(argv)
    try:
        if args.command == "one":
            print(f"{one(args.row, args.source):.6f}")
        else:
            print(table([r for r in args.only.split(",") if r]))
    except published_rows.HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
