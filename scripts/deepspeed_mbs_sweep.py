"""DeepSpeed's Azure runs at every micro-batch size the blog plotted, against ckplan (issue 35,
docs/published-runs.md §68.dsrows).

The blog (DeepSpeed docs/_posts/2022-07-26-deepspeed-azure.md, edaa7221) prints the TFLOPs/GPU of the rows DS2-DS4
(mbs 8) in its text and labels; its Figures 6 (530B) and 7 (1T) plot the same runs at micro-batch 1, 2, 4 and 8 on
512 and 1,024 GPUs, unlabelled but for the peaks. Each bar's height is read here off the figure's pixels
(docs/assets/images/530b-trend.png and 1t-trend.png, 1650 x 990, the same axes: the bars stand on row 785), scaled
by the labelled bars (530B: 170.42 at 595 px, 171.37 at 598; 1T: 165.36 at 577 — 3.49 px a TFLOP/s, ±0.15 TFLOP/s
for a half pixel), and turned into seconds by the formula the blog prints and Megatron-DeepSpeed 62bc4562's
training.py (788-793) computes: 24 x 4 (checkpointed) x B s l h^2 (1 + s/6h + V/16lh) / (GPUs x TFLOP/s).

Every point runs the DS2 / DS4 row's arguments (scripts/published_rows.toml) with its own --dp and its own profile's
--micro-batch-size: the same settings the rows are, one knob moved. The slope between two micro-batch sizes is what
one more sample a GPU costs; ckplan's slope against the published one says whether a gap grows with the tokens
(compute) or stays with the step (a fixed cost a step).

    PYTHONPATH=. python scripts/deepspeed_mbs_sweep.py published           # the figure's times, nothing run
    PYTHONPATH=. python scripts/deepspeed_mbs_sweep.py run --work DIR      # ckplan at each point (profiles in DIR)
    PYTHONPATH=. python scripts/deepspeed_mbs_sweep.py run --work DIR --also "--shard-bandwidth 70"  # a what-if
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import published_rows  # noqa: E402  (the harness beside this script)

ZERO_ROW = 785  # the figures' bars stand on pixel row 785 (their last coloured row is 784)
# (model, GPUs, micro-batch) -> the bar's top pixel row; the labelled bars calibrate the scale
TOPS = {("530b", 512, 1): 561, ("530b", 512, 2): 367, ("530b", 512, 4): 228, ("530b", 512, 8): 190,
        ("530b", 1024, 1): 558, ("530b", 1024, 2): 423, ("530b", 1024, 4): 280, ("530b", 1024, 8): 187,
        ("1t", 512, 1): 539, ("1t", 512, 2): 387, ("1t", 512, 4): 261, ("1t", 512, 8): 259,
        ("1t", 1024, 1): 517, ("1t", 1024, 2): 381, ("1t", 1024, 4): 293, ("1t", 1024, 8): 208}
LABELS = {("530b", 512, 8): 170.42, ("530b", 1024, 8): 171.37, ("1t", 1024, 8): 165.36}  # the blog's text
MODELS = {"530b": dict(layers=105, hidden=20480, row="DS2", profile="ds_gpt530b_mbs8"),
          "1t": dict(layers=128, hidden=25600, row="DS4", profile="ds_gpt1t_mbs8")}
SEQ, VOCAB = 1024, 50304  # run-1t.sh's --seq-length; GPT-2's vocabulary padded to 128 (Megatron's default)


def px_per_tflops() -> float:
    """Pixels a TFLOP/s: the mean over the labelled bars."""
    return sum((ZERO_ROW - TOPS[key]) / tflops for key, tflops in LABELS.items()) / len(LABELS)


def tflops(key: tuple[str, int, int]) -> float:
    """The bar's TFLOPs/GPU: its label where the blog prints one, else its height at px_per_tflops."""
    return LABELS.get(key, (ZERO_ROW - TOPS[key]) / px_per_tflops())


def flops_per_sample(layers: int, hidden: int, seq: int = SEQ, vocab: int = VOCAB) -> float:
    """Megatron-DeepSpeed's throughput_calculator a sample, activation checkpointing on (factor 4)."""
    return 24 * 4 * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def published_s(key: tuple[str, int, int]) -> float:
    """The iteration the bar stands for: a GPU's micro-batch of samples at the bar's TFLOP/s."""
    model, _gpus, mbs = key
    return flops_per_sample(MODELS[model]["layers"], MODELS[model]["hidden"]) * mbs / (tflops(key) * 1e12)


def points(table: published_rows.Table, also: str = "") -> tuple[dict[str, list[str]], dict[tuple, published_rows.Row]]:
    """Each bar as a harness row: the DS2 / DS4 row's arguments at the bar's --dp, its own profile's micro-batch,
    then `also` (ckplan evaluate arguments, a what-if: a later option overrides the row's)."""
    base = {row.id: row for row in table.rows}
    profiles, rows = {}, {}
    for key in TOPS:
        model, gpus, mbs = key
        source = base[MODELS[model]["row"]]
        name = re.sub(r"mbs\d+$", f"mbs{mbs}", MODELS[model]["profile"])
        args = list(table.profiles[MODELS[model]["profile"]])
        args[args.index("--micro-batch-size") + 1] = str(mbs)
        profiles[name] = args
        row_args = list(source.args)
        row_args[row_args.index("--dp") + 1] = str(gpus)
        row_args += shlex.split(also)
        rows[key] = published_rows.Row(id=f"{model}-{gpus}-mbs{mbs}", label=f"{model}-{gpus}-mbs{mbs}",
                                       group="deepspeed", source="deepspeed_mbs_sweep", time_s=published_s(key),
                                       memory_bytes=None, memory_kind=None, static_bytes=None, profile=name,
                                       args=row_args)
    return profiles, rows


def report(times: dict[tuple, float | None]) -> str:
    """Per model and GPU count: each micro-batch's published and ckplan seconds, then the slopes between them."""
    lines = []
    for model in MODELS:
        for gpus in (512, 1024):
            keys = [(model, gpus, mbs) for mbs in (1, 2, 4, 8)]
            lines.append(f"{model} on {gpus} GPUs")
            for key in keys:
                ours = times.get(key)
                tail = "" if ours is None else f"  ckplan {ours:8.2f}  ratio {ours / published_s(key):.3f}"
                lines.append(f"  mbs {key[2]}: {tflops(key):7.2f} TFLOP/s  published {published_s(key):8.2f} s{tail}")
            for a, b in zip(keys, keys[1:]):
                step = b[2] - a[2]
                slope = (published_s(b) - published_s(a)) / step
                ours = "" if times.get(a) is None or times.get(b) is None else \
                    f"  ckplan {(times[b] - times[a]) / step:6.2f}"
                lines.append(f"  a sample more, mbs {a[2]}->{b[2]}: published {slope:6.2f} s{ours}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("published")
    run = sub.add_parser("run")
    run.add_argument("--work", type=Path, required=True, help="the profiles' folder (made there where missing)")
    run.add_argument("--also", default="", help="ckplan evaluate arguments added to every point (a what-if)")
    args = parser.parse_args(argv)
    if args.command == "published":
        print(report({}), end="")
        return 0
    try:
        table = published_rows.load_table()
        profiles, rows = points(table, args.also)
        sweep = published_rows.Table(profiles=profiles, rows=list(rows.values()))
        work = args.work.resolve()
        published_rows.make_profiles(sweep, sweep.rows, work, remake=False, jobs=1)
        times = {key: published_rows.run_row(row, work)["iteration_s"] for key, row in rows.items()}
    except published_rows.HarnessError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(report(times), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
