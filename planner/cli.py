"""The `ckplan` command line. Commands live in planner/commands/, one module each;
heavy imports (torch, pulp) happen inside the commands so `--help` is instant."""

from __future__ import annotations

import sys

import click

from planner import __version__
from planner.errors import UserError


class _Group(click.Group):
    """Turns a UserError anywhere below into one clean line and exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            raise click.ClickException("interrupted; no output was written") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckplan")
def cli() -> None:
    """Plan activation checkpointing and pipeline stages under memory caps, and run the plan.

    \b
      ckplan profile model.py             measure every pipeline layer
      ckplan profile --arch llama3-70b ...  the same from a published architecture (no GPU)
      ckplan solve --mem 24GB --stages 4  choose stages + checkpointed layers (exact solver)
      ckplan launch plan.yaml             run the plan and compare with its prediction
      ckplan calibrate plan.yaml          fit sends, per-action cost and core sharing; solve then uses them
      ckplan evaluate --layers-per-stage 19,20,20,21 --ckpt-per-stage 19,19,19,13
                                          score a hand configuration beside ckplan's plan
      ckplan export plan.yaml --to megatron   the plan as ColossalAI/Megatron/torchtitan/DeepSpeed config
      ckplan search --arch llama3-70b --gpus 64 --global-batch 512 --seq-len 8192
                                          every degree searched, each with its plan: the fastest ranked
    """


def _register() -> None:
    from planner.commands import (
        calibrate,
        compare,
        evaluate,
        export,
        launch,
        profile,
        search,
        solve,
        validate,
    )

    for module in (profile, solve, evaluate, export, launch, validate, compare, calibrate, search):
        cli.add_command(module.command)


_register()


def main() -> None:
    cli(prog_name="ckplan")


if __name__ == "__main__":
    sys.exit(main())
