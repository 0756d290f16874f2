"""Defects a user's pass over models and configs no test used found (docs/published-runs.md §41.usertrial4):
each test fails on the commit before its fix."""

from __future__ import annotations

from fixtures.cli import run


def test_search_names_the_flag_a_missing_config_was_given_by(tmp_path):
    """`ckplan search --hf-config missing.json` answered "--arch-config missing.json does not exist": a flag the
    user never gave. The sentence names --hf-config, the flag the path came by."""
    missing = tmp_path / "missing.json"
    for flag in ("--hf-config", "--arch-config"):
        result = run("search", flag, missing, "--gpus", "8", "--global-batch", "64", "--seq-len", "4096")
        assert result.exit_code != 0
        assert f"{flag} {missing} does not exist" in result.output
