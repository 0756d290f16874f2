"""Every export quotes what it copies from a model, a profile or a path: hostile layer names
and a hostile plan folder leave each generated file parseable, with no statement or command
beyond the export's own, and the names still readable (escaped) in it."""

import ast
import shutil
import subprocess

import pytest
import tomllib
from export_plans import llm_profile, make_plan
from fixtures.cli import run_ok

from planner import io
from planner.emit.rounding import one_line

HOSTILE = [
    "tok\nimport os\nos.system('touch {d}/P1')",
    "layers.0 $(touch {d}/P2) `touch {d}/P3`",
    '"""; __import__("os").system("touch {d}/P4") #',
    "layers.2\u2028__import__('os').system('touch {d}/P5')",
    "layers.3\r\n__import__('os').system('touch {d}/P6')",
    "layers.4 ' \" # \\ ]] [[x]] = 1",
    "layers.5\x0b\x0c\x1c\x85 tail",
    "layers.6",
    "layers.7",
    "out\n)\ntouch {d}/P7\n(",
]


@pytest.fixture()
def hostile(tmp_path):
    """A profile whose layers carry the names above, and a plan on it in a folder whose name
    holds a newline and a command."""
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    names = [name.format(d=sentinels) for name in HOSTILE]
    base = llm_profile()
    profile = base.model_copy(update={"layers": [layer.model_copy(update={"name": name})
                                                 for layer, name in zip(base.layers, names)]})
    folder = tmp_path / "plans\n__import__('os').system('touch P8')\n$(touch P9)"  # bash runs in it: P8, P9 there
    folder.mkdir()
    io.save_profile(profile, folder / "llm.json")
    plan = make_plan(profile, folder / "llm.json", [4, 3, 3], {names[2], names[5]})
    io.save_plan(plan, folder / "plan.yaml")
    return folder, names, sentinels


def assert_no_call_but_the_exports(text: str) -> None:
    """The Python parses, and no call of system/exec/eval/__import__ is in it."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            assert name not in ("system", "exec", "eval", "__import__"), ast.unparse(node)


@pytest.mark.parametrize("target, suffix, extra", [
    ("deepspeed", "deepspeed.py", []),
    ("colossalai", "colossalai.py", []),
    ("torchtitan", "torchtitan.py", ["--torchtitan-base", "my_models.configs:eight_layers"]),
    ("torchtitan", "torchtitan.toml", ["--torchtitan-version", "0.2.0"]),
    ("megatron", "megatron.sh", []),
])
def test_hostile_names_stay_data(hostile, target, suffix, extra):
    folder, names, sentinels = hostile
    plan = folder / "plan.yaml"
    run_ok("export", str(plan), "--to", target, *extra)
    text = (folder / f"plan.{suffix}").read_text()
    if suffix.endswith(".py"):
        assert_no_call_but_the_exports(text)
    elif suffix.endswith(".toml"):
        tomllib.loads(text)
    else:
        bash = shutil.which("bash")
        subprocess.run([bash, "-c", 'source "$1"', "bash", str(folder / f"plan.{suffix}")], check=True,
                       timeout=30, cwd=folder, capture_output=True)
    assert not list(sentinels.iterdir()) and not list(folder.glob("P*"))  # nothing ran
    for line in text.splitlines():  # the escaped names never broke a line out of a comment
        assert "touch" not in line or line.lstrip().startswith("#") or "'" in line or '"' in line
    if target == "deepspeed":  # it lists every layer by name
        assert all(one_line(name) in text for name in names)


def test_torchtitan_base_must_be_python_names(hostile):
    folder, _, _ = hostile
    from fixtures.cli import run

    result = run("export", str(folder / "plan.yaml"), "--to", "torchtitan", "--torchtitan-base",
                 "os; os.system('x'):f")
    assert result.exit_code == 1 and "--torchtitan-base MODULE:FUNCTION" in result.output


def test_one_line_escapes_every_line_break_and_keeps_the_rest():
    assert one_line("a\nb\rc\u2028d\x85e") == "a\\nb\\rc\\u2028d\\x85e"
    assert one_line("layers.0 ünï 'q' \"dq\" # $") == "layers.0 ünï 'q' \"dq\" # $"
