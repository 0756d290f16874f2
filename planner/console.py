"""The one console: tables, progress bars and errors all go through here."""

from __future__ import annotations

import os

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Piped into a file or a log there is no terminal to fit: rich would fall back to 80
# columns and wrap every wide table; COLUMNS, when set, still decides.
_PIPED_WIDTH = 160

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)
for _each in (console, err_console):
    if not _each.is_terminal and "COLUMNS" not in os.environ:
        _each.width = _PIPED_WIDTH


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {message}", soft_wrap=True)


def info(message: str) -> None:
    console.print(message, soft_wrap=True)


def table(title: str, columns: list[str], rows: list[list[str]], *, right_from: int = 1) -> Table:
    """A table whose columns from `right_from` on are numbers (right-aligned)."""
    tbl = Table(title=title, title_justify="left", header_style="bold")
    # the first column names the row (a layer, a stage, a strategy): never cut it short
    name_width = min(max((len(row[0]) for row in rows), default=0), 40)
    for idx, name in enumerate(columns):
        tbl.add_column(name, justify="right" if idx >= right_from else "left",
                       **({"no_wrap": True, "min_width": name_width} if idx == 0 else {}))
    for row in rows:
        tbl.add_row(*row)
    return tbl


def bar(fraction: float, width: int = 20) -> str:
    """A text bar for 'used / cap'; past 100% it turns red."""
    filled = min(width, int(round(max(fraction, 0.0) * width)))
    colour = "red" if fraction > 1.0 else ("yellow" if fraction > 0.9 else "green")
    return f"[{colour}]{'█' * filled}{'·' * (width - filled)}[/] {fraction * 100:5.1f}%"


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
