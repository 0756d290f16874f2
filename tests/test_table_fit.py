"""Tables fit 80 and 120 columns without cutting a number: at 80 columns an LLM plan kept its
layer ranges whole and lost `% cap` and `time/mb` past the edge; at 120 an export's `time/mb`
read "314 m". Text gives way first (layer ranges fold), then the columns go into two tables."""

from __future__ import annotations

import io as stdio

import pytest
from fixtures.cli import run_ok
from rich.console import Console

from planner import console, io
from planner.units import format_bytes, format_ms

COLUMNS = ["stage", "layers", "ckpt", "peak", "reserved", "nccl", "cap", "% cap", "fits", "time/mb"]
ROWS = [[str(i), f"model.layers.{10 * i}–model.layers.{10 * i + 9}", f"{i}/10", "234 GiB", "276 GiB", "1.06 GiB",
         "279 GiB", "98.8%", "yes", f"{314.25 + i:.2f} ms"] for i in range(8)]


def _render(renderable, width: int) -> list[str]:
    out = Console(width=width, file=stdio.StringIO(), highlight=False)
    out.print(renderable)
    return out.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_every_number_is_whole_at_any_width(monkeypatch, width):
    monkeypatch.setattr(console.console, "width", width)
    lines = _render(console.table("a plan", COLUMNS, ROWS, right_from=2), width)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    for row in ROWS:
        for cell in row[2:]:
            assert cell in text, (cell, text)
    for header in COLUMNS:
        assert header in text
    assert "…" not in text


def test_a_table_that_fits_is_one_table_one_line_a_row(monkeypatch):
    monkeypatch.setattr(console.console, "width", 160)
    lines = _render(console.table("a plan", COLUMNS, ROWS, right_from=2), 160)
    assert len([line for line in lines if line.startswith("│")]) == len(ROWS)
    assert "model.layers.0–model.layers.9" in "\n".join(lines)


@pytest.fixture(scope="module")
def llm_plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llm")
    run_ok("profile", "--arch", "llama3-70b", "--seq-len", "4096", "--out", folder / "p.json")
    run_ok("solve", "--profile", folder / "p.json", "--stages", "8", "--microbatches", "16", "--mem", "300GB",
           "--out", folder / "plan.yaml")
    return folder / "plan.yaml"


@pytest.mark.xdist_group("llm_plan")  # one worker profiles and solves the 70B plan once for both
@pytest.mark.parametrize("width", [80, 120])
def test_an_llm_plan_and_its_export_keep_every_column_at(llm_plan, tmp_path, monkeypatch, width):
    monkeypatch.setattr(console.console, "width", width)
    plan = io.load_plan(llm_plan)
    solved = run_ok("solve", "--profile", llm_plan.parent / "p.json", "--stages", "8", "--microbatches", "16",
                    "--mem", "300GB", "--out", tmp_path / "plan.yaml")
    exported = run_ok("export", llm_plan, "--to", "torchtitan", "--out", tmp_path / "tt")
    for result in (solved, exported):
        tables = [line for line in result.output.splitlines() if line[:1] in "┏┃┡│└"]
        assert tables and all(len(line) <= width for line in tables), result.output
        assert "% cap" in result.output and "time/mb" in result.output and "…" not in "".join(tables)
    for stage in plan.stages:
        assert format_ms(stage.predicted.time_ms) in solved.output
        assert format_bytes(stage.predicted.peak_bytes) in solved.output
