"""`ckplan launch`: not built yet."""

import click

from planner.errors import UserError


@click.command("launch", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args) -> None:
    """Not built yet."""
    raise UserError("ckplan launch is not built yet")
