"""The one console: tables, progress bars and errors all go through here."""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
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


NARROW_COLUMNS = 110  # below this a terminal gets the compact tables: no text bars, fewer columns


def narrow() -> bool:
    """A terminal (or COLUMNS) too narrow for the wide tables."""
    return console.width < NARROW_COLUMNS


def table(title: str, columns: list[str], rows: list[list[str]], *, right_from: int = 1,
          whole: tuple[str, ...] = ("layers",), wrap: tuple[str, ...] = (), width: int | None = None):
    """A table whose columns from `right_from` on are numbers (right-aligned), fitted to `width`
    (the console's) without cutting a number: numbers and the first column are never cut short
    or wrapped; the other text columns, and those named in `wrap`, give way first; then those
    named in `whole` (layer ranges, kept whole while there is room) fold onto a second line; and
    when the numbers alone are still too wide, the columns go into two tables, one under the
    other, each led by the first column."""
    width = width or console.width
    numbers = [(idx == 0 or idx >= right_from) and name not in wrap for idx, name in enumerate(columns)]
    kept = [number or (name in whole and name not in wrap) for number, name in zip(numbers, columns)]
    folded = [name in whole and name not in wrap for name in columns]
    for keep, fold in ((kept, ()), (numbers, folded)):
        built = _table(title, columns, rows, keep, right_from=right_from, width=width, fold=fold)
        if _fits(built, width):
            return built
    return _split(title, columns, rows, numbers, right_from=right_from, width=width)


FOLDED_MIN = 16  # a layer range folded onto more lines keeps this much of a line


def _table(title: str | None, columns: list[str], rows: list[list[str]], keep: list[bool], *, right_from: int,
           width: int, fold=()) -> Table:
    """One table: the columns in `keep` at their widest cell, never wrapped; those in `fold`
    folded onto more lines, at least FOLDED_MIN wide; the others wrap."""
    widths = [max(len(name), *(len(_plain(row[idx])) for row in rows)) if keep[idx] else None
              for idx, name in enumerate(columns)]
    # the kept columns alone, with a space either side and a border each, past the width:
    # one space between cells instead of two
    tight = sum(w or 0 for w in widths) + 3 * len(columns) + 1 > width
    tbl = Table(title=title, title_justify="left", header_style="bold", pad_edge=not (tight or narrow()),
                collapse_padding=tight)
    for idx, (name, cells) in enumerate(zip(columns, widths)):
        if cells is not None:
            shape = {"no_wrap": True, "min_width": cells}
        elif idx < len(fold) and fold[idx]:
            shape = {"overflow": "fold", "min_width": min(FOLDED_MIN, max(len(_plain(row[idx])) for row in rows))}
        else:
            shape = {"overflow": "fold"}
        tbl.add_column(name, justify="right" if idx >= right_from else "left", **shape)
    for row in rows:
        tbl.add_row(*row)
    return tbl


def _fits(tbl: Table, width: int) -> bool:
    """Whether rich can lay `tbl` out in `width` columns without cutting a kept column."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update_width(10**4), tbl).minimum <= width


def _split(title: str, columns: list[str], rows: list[list[str]], numbers: list[bool], *, right_from: int,
           width: int):
    """The columns in two (or more) tables, each led by the first column, each fitting `width`."""
    from rich.console import Group

    groups: list[list[int]] = [[0]]
    for idx in range(1, len(columns)):
        trial = [*groups[-1], idx]
        if len(groups[-1]) > 1 and not _fits(_part(None, columns, rows, numbers, trial, right_from, width), width):
            groups.append([0, idx])
        else:
            groups[-1] = trial
    return Group(*(_part(title if index == 0 else None, columns, rows, numbers, group, right_from, width)
                   for index, group in enumerate(groups)))


def _part(title: str | None, columns: list[str], rows: list[list[str]], numbers: list[bool], group: list[int],
          right_from: int, width: int) -> Table:
    chosen = [columns[idx] for idx in group]
    shifted = next((pos for pos, idx in enumerate(group) if idx >= right_from), len(group))
    return _table(title, chosen, [[row[idx] for idx in group] for row in rows], [numbers[idx] for idx in group],
                  right_from=shifted, width=width)


def bar(fraction: float, width: int = 20) -> str:
    """A text bar for 'used / cap'; past 100% it turns red. On a narrow terminal only the
    percentage, in the bar's colour."""
    filled = min(width, int(round(max(fraction, 0.0) * width)))
    if narrow():
        return percent(fraction)
    return f"[{_colour(fraction)}]{'█' * filled}{'·' * (width - filled)}[/] {fraction * 100:5.1f}%"


def percent(fraction: float) -> str:
    """'used / cap' as a percentage in the bar's colour: where a table has no room for a bar."""
    return f"[{_colour(fraction)}]{fraction * 100:.1f}%[/]"


def _colour(fraction: float) -> str:
    return "red" if fraction > 1.0 else ("yellow" if fraction > 0.9 else "green")


def _plain(cell: str) -> str:
    """A cell's text without rich markup."""
    from rich.text import Text

    return Text.from_markup(cell).plain if "[" in cell else cell


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )


class StepProgress:
    """Training steps (or another `unit`) of one or more runs (`runs`: how many are planned), as they finish:
    on a terminal a bar with the steps done, the run's description and the time left; piped,
    one line per step. `with StepProgress("launch", runs=1) as steps: run_plan(...,
    on_steps=steps.run("ckplan"))`."""

    def __init__(self, label: str, runs: int = 1, unit: str = "step"):
        self.label = label
        self.runs = runs
        self.unit = unit
        self._started = 0  # runs begun
        self._before = 0  # steps of the runs before this one
        self._this_total = 0
        self._bar: Progress | None = None
        self._task = None

    def __enter__(self) -> StepProgress:
        self._bar, self._task = _terminal_bar(self.label, TextColumn(f"{self.unit}s"), TimeElapsedColumn(),
                                              TextColumn("left"), TimeRemainingColumn())
        return self

    def __exit__(self, *exc_info) -> None:
        if self._bar is not None:
            self._bar.stop()

    def run(self, description: str):
        """The on_steps callback of the next run, described as `description`."""
        self._before += self._this_total
        self._this_total = 0
        self._started += 1
        self.runs = max(self.runs, self._started)
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.label}: {description}")

        def on_steps(done: int, total: int) -> None:
            self._this_total = total
            whole = self._before + total * (self.runs - self._started + 1)
            if self._bar is not None:
                self._bar.update(self._task, completed=self._before + done, total=whole)
            else:
                err_console.print(f"{self.label}: {description}: {self.unit} {done}/{total}"
                                  + (f" (run {self._started} of {self.runs})" if self.runs > 1 else ""),
                                  soft_wrap=True)

        return on_steps


def _terminal_bar(label: str, *columns):
    """A started bar on stderr with `label`, its count and `columns`, and its task; (None, None)
    when stderr is no terminal (the progress classes then print plain lines)."""
    if not err_console.is_terminal:
        return None, None
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), *columns,
                   console=err_console, transient=True)
    bar.start()
    return bar, bar.add_task(label, total=None)


PIPED_EVERY_S = 5.0  # piped, a line at most this often within one phase of work


class WorkProgress:
    """Long work in pieces (a profile's layers and timing rounds): on a terminal a bar with what
    runs now, the pieces done and the time; piped, plain lines on stderr, one when a new phase
    of work begins and one every PIPED_EVERY_S within it, so a log shows the work going on.
    `with WorkProgress("profile") as work: work.phase("timing"); work.update(3, 8, "layer 2")`."""

    def __init__(self, label: str, *, clock=time.monotonic):
        self.label = label
        self._clock = clock
        self._bar: Progress | None = None
        self._task = None
        self._said = ("", -PIPED_EVERY_S)  # the last phase said piped, and when

    def __enter__(self) -> WorkProgress:
        self._start = self._clock()
        self._bar, self._task = _terminal_bar(self.label, TimeElapsedColumn())
        return self

    def __exit__(self, *exc_info) -> None:
        if self._bar is not None:
            self._bar.stop()

    def phase(self, what: str) -> None:
        """A piece of work of unknown length begins."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.label}: {what}", total=None, completed=0)
        else:
            self._say(what, what, force=True)

    def update(self, done: int, total: int, what: str) -> None:
        """`done` of `total` pieces are done, the last being `what`."""
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total, description=f"{self.label}: {what}")
            return
        phase = what.split(",")[0].split(" of ")[0]
        self._say(f"{what} ({done}/{total})", phase, force=done == total)

    def _say(self, text: str, phase: str, *, force: bool) -> None:
        now = self._clock()
        last_phase, last_time = self._said
        if force or phase != last_phase or now - last_time >= PIPED_EVERY_S:
            err_console.print(f"{self.label}: {text} [{now - self._start:.0f} s]", soft_wrap=True, markup=False,
                              highlight=False)
            self._said = (phase, now)
