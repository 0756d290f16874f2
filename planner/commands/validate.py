"""`ckplan validate PLAN`: replay each stage's schedule alone in this process and check
its peak memory against its cap, without starting a pipeline."""

from __future__ import annotations

from pathlib import Path

import click

from planner.errors import UserError


@click.command("validate")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--stage", type=click.IntRange(min=0), default=None,
              help="Replay only this stage [default: every stage, one after another].")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Where to replay [default: the device the profile was measured on].")
@click.option("--force", is_flag=True, help="Replay even if the model file changed since the plan was made.")
@click.option("--seed", type=int, default=0, show_default=True)
def command(plan_path, stage, device, force, seed) -> None:
    """Measure each stage's peak memory under its schedule (in-flight microbatches,
    receive buffers, optimizer state) and exit non-zero if one exceeds its cap."""
    from planner import console, io
    from planner.runtime import validate_plan

    plan = io.load_plan(plan_path)
    device = device or plan.device.type
    with console.StepProgress("validate", unit="stage") as progress:
        checks = validate_plan(plan, plan_file=plan_path, stage=stage, device=device, seed=seed, force=force,
                               on_stages=progress.run(f"replaying {'stage ' + str(stage) if stage is not None else 'every stage'}"))
    console.console.print(check_table(checks, plan))
    over = [check for check in checks if not check.fits]
    if over:
        from planner.units import format_bytes

        worst = max(over, key=lambda check: check.peak_bytes / check.cap_bytes)
        raise UserError(
            f"{len(over)} of {len(checks)} stages exceed their cap; stage {worst.index} needs "
            f"{format_bytes(worst.peak_bytes)} of {format_bytes(worst.cap_bytes)}: checkpoint more layers "
            "there or re-solve with the measured peaks"
        )
    if len(checks) == 1:
        console.info(f"stage {checks[0].index} is within its cap")
    else:
        console.info(f"all {len(checks)} stages are within their caps")


def check_table(checks, plan):
    from planner import console
    from planner.units import format_bytes

    rows = []
    for check in checks:
        predicted = check.predicted_peak_bytes
        error = f"{(check.peak_bytes - predicted) / predicted * 100:+.1f}%" if predicted else "–"
        rows.append([str(check.index), str(check.in_flight),
                     format_bytes(predicted) if predicted else "–", format_bytes(check.peak_bytes), error,
                     format_bytes(check.cap_bytes), console.bar(check.peak_bytes / check.cap_bytes, width=5)])
    columns = ["stage", "in flight", "predicted", "measured", "err", "cap", "measured / cap"]
    return console.table(f"peak memory per stage ({plan.setup.pipeline.schedule}, {plan.setup.pipeline.microbatches} microbatches)",
                         columns, rows)
