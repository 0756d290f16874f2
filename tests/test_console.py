"""Progress of long runs: piped, one line per step; the runs of a comparison counted together."""

import re

from planner import console


def test_piped_progress_prints_one_line_per_step_and_counts_the_runs(capsys):
    with console.StepProgress("compare", runs=2) as progress:
        first = progress.run("round 1, ckplan")
        first(1, 2)
        first(2, 2)
        second = progress.run("round 1, full")
        second(1, 2)
        third = progress.run("round 2, ckplan")  # a run past the planned ones raises the count
        third(2, 2)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["compare: round 1, ckplan: step 1/2 (run 1 of 2)", "compare: round 1, ckplan: step 2/2 (run 1 of 2)",
                     "compare: round 1, full: step 1/2 (run 2 of 2)", "compare: round 2, ckplan: step 2/2 (run 3 of 3)"]


def test_on_an_80_column_terminal_the_plan_and_auto_dp_tables_fit_one_line_a_row(tmp_path, monkeypatch):
    """At 80-100 columns the layer ranges were cut off and each --auto-dp row broke into 8 lines."""
    from fixtures.cli import run_ok

    profile = tmp_path / "l8.json"
    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "4096", "--out", profile)
    monkeypatch.setattr(console.console, "width", 80)
    result = run_ok("solve", "--profile", profile, "--stages", "4", "--out", tmp_path / "p.yaml")
    table_lines = [line for line in result.output.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and all(len(line) <= 80 for line in table_lines), result.output
    # the whole layer range (a tight table, with the reserved columns, drops the cells' inner spaces)
    assert re.search(r"│ ?tok_embeddings–layers\.\d+ ", result.output) and "…" not in "".join(table_lines)
    # the --auto-dp table on LLaMA 3.2 1B: its cells as wide as 8B's (peaks of 2-3 digits a stage), its 8 solves a
    # tenth of 8B's, whose stages sit at the cap (§66.suitetime)
    small = tmp_path / "l1.json"
    run_ok("profile", "--arch", "llama3.2-1b", "--seq-len", "4096", "--out", small)
    result = run_ok("solve", "--profile", small, "--stages", "4", "--auto-dp", "--dp", "2", "--out",
                    tmp_path / "a.yaml")
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert len(rows) == 8 and all(len(line) <= 80 for line in rows), result.output  # ZeRO 0-3 x offload, one line each
    assert "  ZeRO 2, group 2, offload no: " in result.output and "refused by" in result.output
