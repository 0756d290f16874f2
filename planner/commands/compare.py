"""`ckplan compare plan.yaml`: ckplan's plan against its baselines, measured on the runtime."""

from __future__ import annotations

from pathlib import Path

import click

from planner.console import bar, console, table, warn
from planner.units import format_bytes, format_ms

DEFAULT_BUDGET_S = 300.0  # five minutes of rounds: a verdict on a quiet machine, a plain "too noisy" on a busy one


@click.command("compare")
@click.argument("plan_file", metavar="PLAN.yaml", type=click.Path(path_type=Path))
@click.option("--steps", type=click.IntRange(min=1), default=6, show_default=True,
              help="Measured training steps per strategy.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True,
              help="Run every strategy at least this many times, round-robin.")
@click.option("--max-rounds", type=click.IntRange(min=1), default=None,
              help="Add rounds until ckplan's verdict against every other strategy is resolved, at most this "
                   "many [default: no limit but --time-budget].")
@click.option("--time-budget", "time_budget_s", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_BUDGET_S,
              show_default=True, help="Seconds of rounds: no round is added that would end past this, judged by "
                                      "the rounds so far; then the comparison says whether the machine was too "
                                      "noisy to tell.")
@click.option("--confidence", type=click.FloatRange(0.5, 1, max_open=True), default=0.95, show_default=True,
              help="Confidence of the speed-up intervals and verdicts.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Comparison JSON [default: <plan>-compare.json beside the plan].")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="PNG bar chart, if matplotlib is installed [default: <plan>-compare.png].")
@click.option("--force", is_flag=True, help="Run even if the model file changed since the profile.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Torch threads per rank [default: the profile's if every rank can have them, else cores / ranks].")
def command(plan_file, steps, warmup_steps, seed, rounds, max_rounds, time_budget_s, confidence, device, out, plot,
            force, threads) -> None:
    """Run ckplan's plan and every baseline in it that fits the caps, with the same steps
    and seed, and print measured iteration time, speed-up over full checkpointing,
    measured peak per stage against the cap, and the error of the predictions.

    Baselines whose stages equal an earlier strategy's are measured once.
    """
    from planner import io
    from planner.measure.compare import run_comparison, verdict_sentence
    from planner.runtime.launcher import rank_server, run_plan

    plan = io.load_plan(plan_file)
    out = out or plan_file.with_name(f"{plan_file.stem}-compare.json")
    plot = plot or plan_file.with_name(f"{plan_file.stem}-compare.png")
    io.check_outputs({"--out": out, "--plot": plot}, inputs={"PLAN.yaml": plan_file})
    _warn_oversubscribed(plan, device, threads)

    from planner.console import StepProgress
    from planner.measure.compare import strategies_to_run_once

    names = strategies_to_run_once(plan)
    started: list[str] = []

    # every round's ranks are forked from one server: torch imported once for the whole comparison
    with StepProgress("compare", runs=rounds * len(names)) as progress, rank_server() as server:
        def run(name: str):
            started.append(name)
            round_ = (len(started) - 1) // len(names) + 1
            return run_plan(plan, plan_file=plan_file, strategy=name, steps=steps, warmup_steps=warmup_steps,
                            device=device, seed=seed, force=force, threads=threads, rank_server=server,
                            on_steps=progress.run(f"round {round_}, {name}"))

        comparison = run_comparison(plan, run, plan_file=plan_file, steps=steps, warmup_steps=warmup_steps,
                                    seed=seed, rounds=rounds, max_rounds=max_rounds, time_budget_s=time_budget_s,
                                    confidence=confidence)
    io.write_atomic(out, comparison.model_dump_json(indent=2) + "\n")
    print_comparison(comparison, plan)
    _calibration_lines(comparison, plan, plan_file)
    _plot(comparison, plan, plot)
    console.print(f"comparison written to {out}")
    console.print(verdict_sentence(comparison), soft_wrap=True)


def print_comparison(comparison, plan) -> None:
    caps = ", ".join(sorted({format_bytes(c) for c in plan.setup.pipeline.mem_caps_bytes}))
    console.print(table(
        f"measured: {comparison.steps} steps after {comparison.warmup_steps} warm-up, {comparison.rounds} round(s), "
        f"seed {comparison.seed}, cap {caps}",
        ["strategy", "iteration", "noise", "busiest rank", "peak/cap per stage", "worst stage", "iter err",
         "peak err (worst)"],
        [[_name(r), format_ms(r.iteration_ms), f"±{r.iteration_spread * 50:.1f}%", format_ms(r.compute_ms),
          " ".join(f"{p * 100:.0f}%" for p in r.peak_over_cap), bar(max(r.peak_over_cap), width=10),
          f"{r.iteration_error * 100:+.1f}%", _worst(r.peak_error)] for r in comparison.strategies],
        wrap=("busiest rank", "peak/cap per stage", "peak err (worst)"),
    ))
    console.print("iteration: median over rounds of each round's median step; noise: half the interquartile range "
                  "of all step times, relative to their median; busiest rank: its own fwd + bwd + step per "
                  "iteration, timed inside the rank (median over rounds); err: measured against the prediction")
    _print_speedups(comparison)
    over = [r.name for r in comparison.strategies if max(r.peak_over_cap) > 1.0]
    if over:
        warn(f"measured peak exceeded the cap for: {', '.join(over)}")


SPEEDUP_COLUMNS = ["strategy", "this vs full ckpt", "ckplan vs this", "ckplan vs this (busiest rank)"]


def _print_speedups(comparison) -> None:
    from planner.measure.compare import REFERENCE

    rows = [[_name(r), "reference" if r.name == REFERENCE else _interval(r.vs_full), _interval(r.ckplan_vs),
             _interval(r.ckplan_vs_compute)] for r in comparison.strategies]
    console.print(table(
        f"speed-ups over {comparison.rounds} paired round(s), {comparison.confidence:.0%} interval and verdict",
        SPEEDUP_COLUMNS, rows, wrap=SPEEDUP_COLUMNS[1:],  # an interval and its verdict may take two lines
    ))
    console.print("a speed-up is the geometric mean over rounds of the two strategies' time ratio in the same round "
                  "(> 1: faster); its interval is Student's t over the paired rounds; 'same' when it lies within 5% "
                  "of 1, 'unresolved' when it crosses 1 and reaches past that")


def _name(result) -> str:
    return result.name if result.same_as is None else f"{result.name} (= {result.same_as})"


def _warn_oversubscribed(plan, device: str, threads: int | None) -> None:
    import os

    ranks, cores = plan.setup.pipeline.stages * plan.setup.data_parallel.dp, os.cpu_count() or 1
    if device == "cpu" and threads and threads * ranks > cores:
        warn(f"--threads {threads} x {ranks} ranks oversubscribe {cores} cores: measured times will be longer "
             "than the profile's")


def _calibration_lines(comparison, plan, plan_file: Path) -> None:
    """Each strategy's measured iteration beside its prediction before and after `ckplan calibrate`."""
    from planner.commands.calibrate import before_after_line
    from planner.measure.compare import strategies_to_run

    stages_of = dict(strategies_to_run(plan))
    for r in comparison.strategies:
        line = before_after_line(plan, plan_file, stages_of[r.name], r.iteration_ms,
                                 threads=r.report.device.threads or 1)
        if line is not None:
            console.print(f"{r.name}: {line}")


def _interval(interval) -> str:
    if interval is None:
        return "—"
    if interval.low is None:
        return f"{interval.ratio:.2f}× (1 round: {interval.verdict})"
    return f"{interval.ratio:.2f}× [{interval.low:.2f}, {interval.high:.2f}] {interval.verdict}"


def _worst(errors: list[float | None]) -> str:
    known = [e for e in errors if e is not None]
    return f"{max(known, key=abs) * 100:+.1f}%" if known else "—"


def _plot(comparison, plan, path: Path) -> None:
    """Measured peak per stage against its cap, and the measured iteration with its spread,
    one colour per strategy in both panels, one bar for strategies that ran the same plan."""
    from planner.emit.charts import pyplot, save_png, strategy_colours

    plt = pyplot()
    if plt is None:
        return
    bars = plotted_strategies(comparison)
    colours = strategy_colours([result.name for result, _ in bars])
    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(bars)
    num_stages = plan.setup.pipeline.stages
    for idx, (result, label) in enumerate(bars):
        peaks = [s.measured.peak_bytes / 2**20 for s in result.report.stages]
        mem_ax.bar([s + idx * width for s in range(num_stages)], peaks, width, label=label,
                   color=colours[result.name])
    for s, cap in enumerate(plan.setup.pipeline.mem_caps_bytes):
        mem_ax.hlines(cap / 2**20, s - width / 2, s + 0.8 - width / 2, colors="red", linestyles="dashed")
    mem_ax.set_xticks([s + 0.4 - width / 2 for s in range(num_stages)], [f"stage {s}" for s in range(num_stages)])
    mem_ax.set_ylabel("measured peak (MiB); dashed: cap")
    mem_ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    labels = [label for _, label in bars]
    middles = [result.iteration_ms for result, _ in bars]
    low, high = zip(*(measured_interval_ms(result) for result, _ in bars))
    time_ax.bar(range(len(bars)), middles, color=[colours[result.name] for result, _ in bars],
                yerr=[[m - lo for m, lo in zip(middles, low)], [hi - m for m, hi in zip(middles, high)]], capsize=4)
    time_ax.set_xticks(range(len(bars)), labels, rotation=30, ha="right", fontsize=8)
    time_ax.set_ylabel("measured iteration (ms); bars: " + ("min-max of the rounds" if comparison.rounds > 1
                                                             else "steps' quartiles"))
    fig.suptitle(chart_title(comparison, plan), fontsize=10)
    save_png(fig, path)
    plt.close(fig)


def plotted_strategies(comparison) -> list[tuple]:
    """(result, label) per distinct plan: strategies that ran the same stages share one bar,
    labelled with every name."""
    names: dict[str, list[str]] = {}
    for result in comparison.strategies:
        names.setdefault(result.same_as or result.name, []).append(result.name)
    return [(result, " = ".join(names[result.name])) for result in comparison.strategies if result.same_as is None]


def measured_interval_ms(result) -> tuple[float, float]:
    """The measured iteration's spread: min and max of the rounds' medians, or with one
    round the quartiles of its steps."""
    import statistics

    if len(result.iteration_ms_rounds) > 1:
        return min(result.iteration_ms_rounds), max(result.iteration_ms_rounds)
    steps = result.report.iteration_ms_all
    if len(steps) < 2:
        return result.iteration_ms, result.iteration_ms
    quartiles = statistics.quantiles(steps, n=4)
    return min(quartiles[0], result.iteration_ms), max(quartiles[2], result.iteration_ms)


def chart_title(comparison, plan) -> str:
    """The model, the caps and the machine the comparison ran on."""
    import os

    device = comparison.strategies[0].report.device
    caps = ", ".join(sorted({format_bytes(c) for c in plan.setup.pipeline.mem_caps_bytes}))
    where = f"{device.name}" + (f", {device.threads} thread(s) per rank on {os.cpu_count()} cores"
                                if device.type == "cpu" else "")
    return (f"{Path(plan.model.file).stem}: {plan.setup.pipeline.stages} stages, cap {caps} per stage, "
            f"{plan.setup.pipeline.microbatches} microbatches; {where}")
