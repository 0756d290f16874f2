"""`ckplan profile`: not built yet."""

import click

from planner.errors import UserError


@click.command("profile", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args) -> None:
    """Not built yet."""
    raise UserError("ckplan profile is not built yet")
