"""Every export quotes what it copies from a model, a profile or a path: hostile layer names
and a hostile plan folder leave each generated file parseable, with no statement or command
beyond the export's own, and the names still readable (escaped) in it."""

import ast
import shutil
import subprocess

import pytest
import tomllib
from export_plans import llm_profile, make_plan
from fixtures.cli import run, run_ok

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
    ("torchtitan", "_torchtitan.py", ["--torchtitan-base", "my_models.configs:eight_layers"]),
    ("torchtitan", "torchtitan.toml", ["--torchtitan-version", "0.2.0"]),
    ("megatron", "megatron.sh", []),
])
def test_hostile_names_stay_data(hostile, target, suffix, extra):
    folder, names, sentinels = hostile
    plan = folder / "plan.yaml"
    run_ok("export", str(plan), "--to", target, *extra)
    text = (folder / _name(suffix)).read_text()
    if suffix.endswith(".py"):
        assert_no_call_but_the_exports(text)
    elif suffix.endswith(".toml"):
        tomllib.loads(text)
    else:
        bash = shutil.which("bash")
        subprocess.run([bash, "-c", 'source "$1"', "bash", str(folder / _name(suffix))], check=True,
                       timeout=30, cwd=folder, capture_output=True)
    assert not list(sentinels.iterdir()) and not list(folder.glob("P*"))  # nothing ran
    for line in text.splitlines():  # the escaped names never broke a line out of a comment
        assert "touch" not in line or line.lstrip().startswith("#") or "'" in line or '"' in line
    if target == "deepspeed":  # it lists every layer by name
        assert all(one_line(name) in text for name in names)


def _name(suffix: str) -> str:
    """The export's file beside plan.yaml: torchtitan's Python config an importable plan_torchtitan.py."""
    return f"plan{suffix}" if suffix.startswith("_") else f"plan.{suffix}"


def _exports(folder):
    """Every export written beside plan.yaml in `folder`."""
    return list(folder.glob("plan.*.*")) + list(folder.glob("plan_torchtitan.py"))


def test_torchtitan_base_must_be_python_names(hostile):
    folder, _, _ = hostile
    from fixtures.cli import run

    result = run("export", str(folder / "plan.yaml"), "--to", "torchtitan", "--torchtitan-base",
                 "os; os.system('x'):f")
    assert result.exit_code == 1 and "--torchtitan-base MODULE:FUNCTION" in result.output


def test_one_line_escapes_every_line_break_and_keeps_the_rest():
    assert one_line("a\nb\rc\u2028d\x85e") == "a\\nb\\rc\\u2028d\\x85e"
    assert one_line("layers.0 ünï 'q' \"dq\" # $") == "layers.0 ünï 'q' \"dq\" # $"


# ---------------------------------------------------------------- hostile values, not only names

import json  # noqa: E402

import yaml  # noqa: E402

from planner.emit import facts, megatron  # noqa: E402
from planner.models import archs  # noqa: E402

TARGETS = [  # (--to, the file's ending, extra options): every exporter, both torchtitan forms
    ("megatron", "megatron.sh", []),
    ("torchtitan", "_torchtitan.py", ["--torchtitan-base", "my_models.configs:eight_layers"]),
    ("torchtitan", "torchtitan.toml", ["--torchtitan-version", "0.2.0"]),
    ("colossalai", "colossalai.py", []),
    ("deepspeed", "deepspeed.py", []),
]
# what a hostile profile may carry where a value belongs: commands for the shell and Python, a
# newline that ends a bash array, and values of the wrong type
HOSTILE_VALUES = ["$(touch {d}/PWNED)", "`touch {d}/PWNED`", "1\n)\ntouch {d}/PWNED\n(",
                  "__import__('os').system('touch {d}/PWNED')", [1, 2], {"a": 1}, 1.5, True, -3, 10**30]


def analytic_assumptions(num_layers: int = 8, **model) -> dict:
    """An analytic profile's assumptions for the export tests' 8-block profile: Qwen2.5-7B's
    dimensions (GQA, q/k/v biases, rope 1e6, eps 1e-6), 8 layers deep, at 1024 tokens."""
    facts_ = archs.arch("qwen2.5-7b").facts() | {"num_layers": num_layers} | model
    return {"arch": "qwen2.5-7b", "seq_len": 1024, "tp": 1, "sp": False, "model": facts_}


def hostile_plan(tmp_path, assumptions: dict):
    """A plan on the export tests' profile carrying `assumptions`, its sha pinned (as an attacker
    who edits both files would)."""
    profile = llm_profile().model_copy(update={"assumptions": assumptions})
    io.save_profile(profile, tmp_path / "llm.json")
    plan = make_plan(profile, tmp_path / "llm.json", [4, 3, 3], {"layers.2"})
    io.save_plan(plan, tmp_path / "plan.yaml")
    return tmp_path / "plan.yaml"


def source(script, cwd) -> list[str]:
    """The script sourced by bash, and the arguments its array holds."""
    bash = shutil.which("bash")
    done = subprocess.run([bash, "-c", 'source "$1" && printf "%s\\0" "${CKPLAN_MEGATRON_ARGS[@]}"', "bash",
                           str(script)], check=True, timeout=30, cwd=cwd, capture_output=True)
    return done.stdout.decode().split("\0")[:-1]


def _fields_written(target: str) -> list[str]:
    """The recorded facts each exporter copies into its file: Megatron-LM the whole model, the
    others the parallel degrees, the sequence length and (torchtitan) the architecture's name."""
    if target == "megatron":
        return ["seq_len", "tp", "sp", "capacity_factor",
                *(f"model.{name}" for name in facts.ModelFacts.model_fields)]
    return ["seq_len", "tp", "sp", "arch"] if target == "torchtitan" else ["seq_len", "tp", "sp"]


def _valid(assumptions: dict) -> bool:
    try:
        facts.Facts.model_validate(assumptions)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("target, suffix, extra", TARGETS)
def test_every_field_an_exporter_writes_refuses_a_hostile_value_in_one_sentence(tmp_path, target, suffix, extra):
    """Each field, each hostile value: refused in one sentence naming the field, nothing written;
    where the value happens to be valid there (a bool flag's True, a float factor), the export is
    written and sourced or parsed, and nothing runs."""
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    refused = 0
    for field in _fields_written(target):
        for value in HOSTILE_VALUES:
            value = value.format(d=sentinels) if isinstance(value, str) else value
            assumptions = analytic_assumptions()
            where, _, name = field.rpartition(".")
            (assumptions[where] if where else assumptions)[name] = value
            folder = tmp_path / f"{target}-{suffix}"
            folder.mkdir(exist_ok=True)
            for old in _exports(folder):
                old.unlink()
            plan = hostile_plan(folder, assumptions)
            result = run("export", str(plan), "--to", target, *extra)
            if _valid(assumptions):
                written = _exports(folder)
                for path in written:
                    if path.suffix == ".sh":
                        source(path, folder)
                    elif path.suffix == ".py":
                        assert_no_call_but_the_exports(path.read_text())
                assert result.exit_code == 0 or len(result.output.strip().splitlines()) <= 3, result.output
                continue
            refused += 1
            assert result.exit_code == 1, (field, value, result.output)
            assert f"the profile's recorded {field}" in result.output, (field, result.output)
            assert len(result.output.strip().splitlines()) <= 3, result.output  # one sentence, wrapped
            assert not _exports(folder), field  # nothing written
    assert not list(sentinels.iterdir())  # nothing ran
    assert refused >= 6 * len(_fields_written(target))


def test_a_hostile_arch_name_is_only_looked_up(tmp_path):
    sentinels = tmp_path / "s"
    sentinels.mkdir()
    plan = hostile_plan(tmp_path, analytic_assumptions() | {"arch": f"x'); __import__('os').system('touch {sentinels}/P')#"})
    result = run("export", str(plan), "--to", "torchtitan")
    assert result.exit_code == 1 and "--torchtitan-base MODULE:FUNCTION" in result.output
    assert not list(sentinels.iterdir())


@pytest.mark.parametrize("field, value", [("stages", "$(touch PWNED)"), ("microbatches", "6; import os"),
                                          ("micro_batch_size", [1]), ("schedule", "1F1B\n)\ntouch PWNED\n("),
                                          ("precision", {"a": 1}), ("zero", "1 $(touch PWNED)"), ("dp", 1.5)])
def test_a_plan_with_a_hostile_setup_value_exports_nothing(tmp_path, field, value):
    plan_path = hostile_plan(tmp_path, analytic_assumptions())
    data = yaml.safe_load(plan_path.read_text())
    part = next(part for part in data["setup"].values() if field in part)
    part[field] = value
    plan_path.write_text(yaml.safe_dump(data))
    for target, _, extra in TARGETS:
        result = run("export", str(plan_path), "--to", target, *extra)
        assert result.exit_code == 1 and field in result.output, result.output
    assert not list(tmp_path.glob("plan.*.*")) and not list(tmp_path.glob("PWNED"))


def test_megatron_arguments_round_trip_through_bash_word_for_word(tmp_path):
    """A MoE model with dense layers, latent attention, a capacity factor and rope scaling: every
    flag the shape writes, sourced, is the argument Megatron-LM receives, and nothing else runs."""
    model = archs.arch("deepseek-v2-lite").facts() | {"num_layers": 8, "dense_layers": [0, 1]}
    assumptions = analytic_assumptions(**model) | {"capacity_factor": 1.25, "arch": "deepseek-v2-lite"}
    profile = llm_profile().model_copy(update={"assumptions": assumptions})
    lines = [line for line in megatron.shape_arguments(profile) if not line.startswith("#")]
    script = tmp_path / "args.sh"
    script.write_text("CKPLAN_MEGATRON_ARGS=(\n" + "\n".join(f"    {line}" for line in lines) + "\n)\n")
    words = source(script, tmp_path)
    flags = dict(zip(words, words[1:]))
    assert flags["--moe-layer-freq"] == "([0]*2+[1]*6)" and flags["--moe-expert-capacity-factor"] == "1.25"
    assert flags["--rotary-base"] == "10000" and flags["--norm-epsilon"] == "1e-06"
    assert flags["--num-experts"] == "64" and flags["--kv-lora-rank"] == "512"
    assert sum(word.startswith("--") for word in words) == len(lines)  # one flag a line, no word split
    assert not list(tmp_path.glob("P*"))


@pytest.mark.parametrize("value", ["$(touch P)", "a b", "x;y", "l\nm", "'q'", '"d"', "*", "~", "a\\b", "$HOME", "!x"])
def test_a_word_is_one_bash_word_whatever_it_holds(tmp_path, value):
    script = tmp_path / "w.sh"
    script.write_text(f"CKPLAN_MEGATRON_ARGS=(\n    {megatron.arg('--flag', value)}\n)\n")
    assert source(script, tmp_path) == ["--flag", value]
    assert not list(tmp_path.glob("P"))


def test_non_numbers_in_an_argument_are_one_sentence():
    from planner.errors import UserError

    for value in ([1], None, True, float("nan")):
        with pytest.raises(UserError, match="Megatron-LM argument"):
            megatron.word(value)
    assert megatron.word(1e-06) == "1e-06" and megatron.word(8.0) == "8" and megatron.word(1000000) == "1000000"


def test_profile_facts_are_read_typed():
    from planner.errors import UserError

    profile = llm_profile().model_copy(update={"assumptions": analytic_assumptions()})
    known = facts.read(profile)
    assert known.model.rope_theta == 1e6 and known.model.norm_eps == 1e-6 and known.tp == 1
    broken = analytic_assumptions() | {"tp": "2; import os"}
    with pytest.raises(UserError, match="the profile's recorded tp is '2; import os': input should be a valid integer"):
        facts.read(profile.model_copy(update={"assumptions": broken}))
    assert json.dumps(analytic_assumptions())  # plain JSON, as a profile stores it


# ---------------------------------------------------------------- launch files (planner/emit/launchers.py)


@pytest.mark.parametrize("target, suffix", [("torchrun", "torchrun.sh"), ("slurm", "slurm.sh")])
def test_launch_scripts_pass_a_hostile_plan_path_as_one_argument(hostile, tmp_path, target, suffix):
    """The scripts run under bash with stand-ins for torchrun, srun and scontrol that record their
    arguments: the plan's path (a folder with a newline and commands in its name) arrives whole, as
    one argument, and nothing else ran."""
    folder, _, sentinels = hostile
    plan = folder / "plan.yaml"
    run_ok("export", str(plan), "--to", target, "--gpus-per-node", "1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "args"
    for tool in ("torchrun", "srun"):
        (bin_dir / tool).write_text(f'#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done >> "{record}"\n')
        (bin_dir / tool).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-a\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1", "SLURM_JOB_NODELIST": "node-a",
           "SLURM_JOB_ID": "7"}
    subprocess.run([shutil.which("bash"), str(folder / f"plan.{suffix}")], check=True, timeout=30, cwd=folder,
                   env=env, capture_output=True)
    args = record.read_bytes().split(b"\0")
    assert str(plan).encode() in args
    assert not list(sentinels.iterdir()) and not list(folder.glob("P*"))


def test_trainjob_keeps_a_hostile_plan_path_one_string(hostile):
    folder, _, sentinels = hostile
    plan = folder / "plan.yaml"
    run_ok("export", str(plan), "--to", "kubernetes", "--gpus-per-node", "1", "--image", "img:1\nkind: Pod")
    manifest = yaml.safe_load((folder / "plan.trainjob.yaml").read_text())
    assert manifest["kind"] == "TrainJob" and manifest["spec"]["trainer"]["image"] == "img:1\nkind: Pod"
    assert manifest["spec"]["trainer"]["args"][-1] == str(plan)
    assert isinstance(manifest["spec"]["trainer"]["numNodes"], int)
