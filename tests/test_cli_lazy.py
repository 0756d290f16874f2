"""planner.cli imports a command's module when the command is asked for: `ckplan --help` lists
every command without importing one, `ckplan launch` imports launch's module alone."""

import os
import pathlib
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from planner import cli as cli_module
from planner.cli import COMMANDS, cli

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_each_listed_sentence_is_what_click_lists_of_the_command_itself():
    for name, (module, sentence) in COMMANDS.items():
        command = cli.commands[name]
        assert sys.modules[module].command is command
        stand_in = click.Command(name, help=sentence)
        for limit in range(10, 400, 7):
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), (name, limit)


def test_help_lists_every_command_the_same_before_and_after_their_import(monkeypatch):
    every = set(cli.commands)
    assert every == set(COMMANDS) and len(cli.commands) == len(COMMANDS) == 9
    loaded = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert loaded.exit_code == 0
    fresh = cli_module._Commands({name: module for name, (module, _) in COMMANDS.items()})
    monkeypatch.setattr(cli, "commands", fresh)
    lazy = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert lazy.output == loaded.output and not any(fresh.loaded(name) for name in COMMANDS)
    for name in COMMANDS:
        assert f"\n  {name} " in lazy.output


def test_the_mapping_loads_on_look_up_alone():
    commands = cli_module._Commands({"launch": "planner.commands.launch"})
    assert "launch" in commands and "solve" not in commands and list(commands) == ["launch"]
    assert commands.loaded("launch") is None and commands.get("solve") is None
    assert commands["launch"] is sys.modules["planner.commands.launch"].command is commands.loaded("launch")
    extra = click.Command("extra")
    commands["extra"] = extra
    assert list(commands) == ["launch", "extra"] and len(commands) == 2 and commands["extra"] is extra
    del commands["launch"]
    assert list(commands) == ["extra"]
    with pytest.raises(KeyError):
        commands["launch"]


def _imported(done: subprocess.CompletedProcess) -> list[str]:
    """The modules a process imported, from its PYTHONPROFILEIMPORTTIME lines."""
    return [line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]


def test_the_installed_ckplan_imports_only_the_command_it_runs():
    """The `ckplan` entry point pip installed beside this Python, as its own process: `ckplan
    --help` lists every command and imports no command's module; `ckplan launch --help` imports
    launch's alone; neither imports torch or pydantic."""
    ckplan = pathlib.Path(sys.executable).parent / "ckplan"
    assert ckplan.is_file(), f"{ckplan}: ckplan is not installed in this Python's environment (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONPROFILEIMPORTTIME": "1"}
    listed = subprocess.run([str(ckplan), "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert listed.returncode == 0, listed.stderr
    for name in COMMANDS:
        assert f"\n  {name} " in listed.stdout
    imported = _imported(listed)
    assert "planner.cli" in imported and not [name for name in imported if name.startswith("planner.commands.")]
    one = subprocess.run([str(ckplan), "launch", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert one.returncode == 0 and "--enforce-cap" in one.stdout, one.stderr
    imported = _imported(one)
    assert [name for name in imported if name.startswith("planner.commands.")] == ["planner.commands.launch"]
    assert not {"torch", "pydantic"} & set(imported + _imported(listed))
