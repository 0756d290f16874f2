"""planner.cli imports a command's module when the command is asked for: `ckplan --help` lists
every command without importing one, `ckplan launch` imports launch's module alone."""

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


def test_a_new_process_imports_only_the_command_it_runs():
    """In a fresh Python (this one imported every command): `--help` imports no command's module,
    `launch --help` launch's alone; neither imports torch or pydantic."""
    code = """
import sys
from planner.cli import cli
def ran(*args):
    try:
        cli.main(list(args), prog_name="ckplan", standalone_mode=False)
    except SystemExit:
        pass
    return sorted(name for name in sys.modules if name.startswith("planner.commands."))
print(ran("--help"), ran("launch", "--help"), "torch" in sys.modules, "pydantic" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[] ['planner.commands.launch'] False False"
