"""Where a published row's step time goes, by what each kernel class adds to the critical path (issue 35,
docs/published-runs.md §33.bias): the row made (profile and `ckplan evaluate`) once as the tree has it and once with
each class's kernel time stretched by 10%, so a class's share is the iteration's growth over 10% — the part of the
step that class holds on the critical path, with the pipeline's bubble and what overlap hides already in it.

    PYTHONPATH=. python scripts/time_bias.py one ROW MODE --out DIR   # one row at one mode, DIR/ROW.MODE.json
    PYTHONPATH=. python scripts/time_bias.py run --only M8,M9 --out DIR  # each row at every mode, a process each
    PYTHONPATH=. python scripts/time_bias.py table DIR                 # shares per row, and each against the ratio
    PYTHONPATH=. python scripts/time_bias.py gaps DIR                  # what each class alone would have to take

Modes: base (the tree's rates), matmul (BF16 and FP8 GEMMs, roofline.kernel_ms), attention (the flash kernels,
roofline.kernel_ms), membound (every memory-bound byte, membound.achieved_tbps). What no mode stretches (exposed
communication, host time, the optimizer's step where it is charged from the HBM bandwidth directly, launches) is the
rest. The rows, their published figures and arguments are scripts/published_rows.toml's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_rows  # noqa: E402  (the harness beside this script)

STRETCH = 0.10
MODES = ("base", "matmul", "attention", "membound")
SHARES = MODES[1:]


def _stretch(mode: str) -> None:
    """Make the `mode` class's kernels STRETCH slower in every planner module that holds the function."""
    from planner.profiler import membound, roofline

    if mode == "membound":
        original_rate = membound.achieved_tbps
        membound.achieved_tbps = lambda *a, **k: original_rate(*a, **k) / (1 + STRETCH)
        return
    original = roofline.kernel_ms
    prefix = "matmul" if mode == "matmul" else "attention"

    def slower(kernel, gpu):
        found = original(kernel, gpu)
        return found * (1 + STRETCH) if kernel.kind.startswith(prefix) else found

    import planner.cli  # noqa: F401  (the modules evaluate and profile import at load, so each is patched)
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "") or "").startswith("planner") and getattr(module, "kernel_ms", None) is original:
            module.kernel_ms = slower


def one(row_id: str, mode: str, out: Path) -> dict:
    """The row's iteration with `mode`'s class stretched: its profile made in this process, then evaluated."""
    from click.testing import CliRunner

    from planner.cli import cli

    if mode != "base":
        _stretch(mode)
    table = published_rows.load_table()
    row = next((r for r in table.rows if r.id == row_id), None)
    if row is None:
        raise published_rows.HarnessError(f"no row {row_id} in scripts/published_rows.toml")
    with tempfile.TemporaryDirectory() as scratch:
        argv = list(row.args)
        if row.profile:
            path = Path(scratch) / f"{row.profile}.json"
            made = CliRunner().invoke(cli, ["profile", *table.profiles[row.profile], "--out", str(path)])
            if made.exit_code:
                raise published_rows.HarnessError(f"profile {row.profile} failed: {made.output.strip()[-300:]}")
            argv = ["--profile", str(path), *argv]
        _, _, _, cost = published_rows.capture(argv)
    found = {"id": row.id, "mode": mode, "iteration_s": cost.iteration_ms / 1e3, "published_s": row.time_s,
             "group": row.group}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{row.id}.{mode}.json").write_text(json.dumps(found, indent=1))
    return found


def run(rows: list[str], out: Path) -> None:
    for row in rows:
        for mode in MODES:
            if (out / f"{row}.{mode}.json").exists():
                continue
            start = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "one", row, mode, "--out", str(out)],
                                  capture_output=True, text=True)
            said = (done.stderr or done.stdout).strip().splitlines()[-1:] if done.returncode else []
            print(f"{row} {mode}: {'FAILED ' + said[0] if said else 'done'} in {time.monotonic() - start:.0f} s",
                  flush=True)


def shares(out: Path) -> list[dict]:
    """Per row with every mode made: its ratio (ckplan / published) and each class's share of the iteration."""
    found: dict[str, dict[str, dict]] = {}
    for path in sorted(out.glob("*.json")):
        record = json.loads(path.read_text())
        found.setdefault(record["id"], {})[record["mode"]] = record
    rows = []
    for row_id, by_mode in found.items():
        if set(by_mode) != set(MODES):
            continue
        base = by_mode["base"]["iteration_s"]
        share = {mode: (by_mode[mode]["iteration_s"] - base) / (STRETCH * base) for mode in SHARES}
        published = by_mode["base"]["published_s"]
        rows.append({"id": row_id, "ratio": base / published, "iteration_s": base, "published_s": published,
                     **share, "rest": 1 - sum(share.values())})
    return rows


def closing_factors(row: dict) -> dict[str, float | None]:
    """Per class (and the rest): the factor its time on the critical path would have to grow by, alone, for the
    row to take its published time, 1 + (published - ckplan) / (share x ckplan); None for a class with no share. A
    diagnosis of where a gap can sit, never a rate to charge: two rows that share a kernel and need the same factor
    of it point at it; a factor no source supports is no reason to change a rate."""
    gap = row["published_s"] - row["iteration_s"]
    return {name: 1 + gap / (row[name] * row["iteration_s"]) if row[name] > 1e-9 else None
            for name in (*SHARES, "rest")}


def gaps(out: Path) -> str:
    lines = ["| row | ckplan s | published s | gap s | matmul | attention | memory-bound | rest (comm, host, step) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(shares(out), key=lambda r: r["ratio"]):
        cells = [f"x{f:.3f} of {r[name] * r['iteration_s']:.3f} s" if f is not None else "-"
                 for name, f in closing_factors(r).items()]
        lines.append(f"| {r['id']} | {r['iteration_s']:.3f} | {r['published_s']:.3f} | "
                     f"{r['published_s'] - r['iteration_s']:+.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def table(out: Path) -> str:
    rows = shares(out)
    lines = ["| row | ckplan s | ratio | matmul | attention | memory-bound | rest (comm, host, step) |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: r["ratio"]):
        lines.append(f"| {r['id']} | {r['iteration_s']:.3f} | {r['ratio']:.3f} | {r['matmul']:.3f} | "
                     f"{r['attention']:.3f} | {r['membound']:.3f} | {r['rest']:.3f} |")
    if len(rows) > 2:
        ratios = [r["ratio"] for r in rows]
        lines.append("")
        lines.append(f"Pearson r against the ratio ({len(rows)} rows): " + ", ".join(
            f"{name} {pearson([r[name] for r in rows], ratios):+.2f}" for name in (*SHARES, "rest")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_one = sub.add_parser("one")
    p_one.add_argument("row")
    p_one.add_argument("mode", choices=MODES)
    p_one.add_argument("--out", type=Path, required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--only", required=True)
    p_run.add_argument("--out", type=Path, required=True)
    for name in ("table", "gaps"):
        sub.add_parser(name).add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "one":
            print(json.dumps(one(args.row, args.mode, args.out)))
        elif args.command == "run":
            run([w.strip() for w in args.only.split(",") if w.strip()], args.out)
        else:
            print((table if args.command == "table" else gaps)(args.out))
    except published_rows.HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
