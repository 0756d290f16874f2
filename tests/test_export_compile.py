"""Exports write what a plan was scored with: the runtime record (its header line, values quoted), and
torch.compile where the target has a key for it (torchtitan's compile.enable and compile.components,
TOML and Python alike); where it has none (Megatron-LM, DeepSpeed, ColossalAI) a compiled plan is
refused in one sentence, no file written (its re-score would charge compiled memory to an eager
runtime). Round trips: the torchtitan TOML read back by `--from-torchtitan`'s reader compiles
what the plan was scored compiled; the Megatron-LM arguments read back by `--from-megatron`'s say no
compile (Megatron-LM has no argument for it)."""

from __future__ import annotations

import ast

import pytest
from fixtures.cli import run, run_ok
from test_launchers import _tiny_config

from planner import io
from planner.units import format_bytes

TOML = ("--torchtitan-version", "0.2.2")
PYTHON = ("--torchtitan-base", "torchtitan.models.llama3.config_registry:llama3_debugmodel")
# --compile as given -> (compile.enable, compile.components) under the newest torchtitan record,
# which compiles the loss; 9dec370's does not, so its bare --compile charged the loss eager
COMPILES = [
    ((), (False, None), None),
    (("--compile",), (True, ["model", "loss"]), None),
    (("--compile", "model"), (True, ["model"]), None),
    (("--compile", "loss"), (True, ["loss"]), None),
    (("--compile",), (True, ["model"]), "9dec370"),
]


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    """A tiny LLaMA-style analytic profile whose blocks record their compiled figures."""
    tmp = tmp_path_factory.mktemp("compiled")
    out = tmp / "p.json"
    run_ok("profile", "--arch-config", _tiny_config(tmp), "--seq-len", "512", "--micro-batch-size", "1", "--compiled",
           "--out", out)
    return out


_SOLVED: dict = {}


def _plan(tmp_path, profile_path, *flags, version=None):
    """The plan `solve` writes for the flags, under torchtitan (at `version`), copied into tmp_path
    (each set of flags solved once per session: a solve takes seconds)."""
    import shutil

    key = (profile_path, flags, version)
    if key not in _SOLVED:
        solved = profile_path.parent / f"plan{len(_SOLVED)}.yaml"
        run_ok("solve", "--profile", profile_path, "--stages", "2", "--microbatches", "2", "--mem", "80GB",
               "--precision", "bf16-mixed", "--runtime", "torchtitan",
               *(("--runtime-version", version) if version else ()), *flags, "--out", solved)
        _SOLVED[key] = solved
    plan = tmp_path / "plan.yaml"
    shutil.copy(_SOLVED[key], plan)
    return plan


def _export(plan, target, *extra):
    """(the file written, its text, what the command said)."""
    out = plan.with_name(f"out{len(extra)}.{target}" + (".toml" if extra == TOML else ""))
    result = run_ok("export", plan, "--to", target, "--out", out, *extra)
    return out, out.read_text(), " ".join(result.output.split())


@pytest.mark.parametrize("flags, written, version", COMPILES,
                         ids=["eager", "compile", "compile model", "compile loss", "9dec370 compile"])
def test_torchtitan_toml_writes_compile_and_reads_back_the_same(tmp_path, profile_path, flags, written, version):
    from planner.models.configs import torchtitan

    plan_path = _plan(tmp_path, profile_path, *flags, version=version)
    out, text, _ = _export(plan_path, "torchtitan", *TOML)
    enable, components = written
    section = text[text.index("[compile]"):].split("\n\n")[0].splitlines()
    assert section == ["[compile]", f"enable = {str(enable).lower()}"] + (
        [f"components = {components}".replace("'", '"')] if components else [])
    job_file = out.with_name("job.toml")  # merged into a job file that names the model, as the export asks
    job_file.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n' + text)
    job = torchtitan.read(job_file)  # the reader of --from-torchtitan
    plan = io.load_plan(plan_path)
    assert job.modelled.compile == plan.setup.training.compile
    loss_read = job.modelled.compile if job.modelled.compile_loss is None else job.modelled.compile_loss
    assert loss_read == ("loss" in (components or []))
    assert (job.pp, job.schedule, job.micro_batch_size) == (2, "1F1B", 1)
    assert [s.status for s in job.settings if s.name.startswith("compile.")] == ["modelled"] * (1 + bool(components))


@pytest.mark.parametrize("flags, written, version", COMPILES[:4], ids=["eager", "compile", "compile model",
                                                                       "compile loss"])
def test_torchtitan_python_config_sets_compile(tmp_path, profile_path, flags, written, version):
    _, text, _ = _export(_plan(tmp_path, profile_path, *flags), "torchtitan", *PYTHON)
    function = next(node for node in ast.parse(text).body
                    if isinstance(node, ast.FunctionDef) and node.name == "ckplan_config")
    set_ = {ast.unparse(node.targets[0]): ast.literal_eval(node.value) for node in function.body
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]).startswith("config.compile.")}
    enable, components = written
    assert set_ == {"config.compile.enable": enable} | ({"config.compile.components": components} if components else {})
    compile_config = pytest.importorskip("torchtitan.config").CompileConfig  # torchtitan's own type takes them
    assert compile_config(**{name.rsplit(".", 1)[1]: value for name, value in set_.items()}).enable is enable


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "colossalai"])
@pytest.mark.parametrize("flags, said", [(("--compile", "model"), "the model (--compile model)"),
                                         (("--compile", "loss"), "the loss (--compile loss)")])
def test_a_target_without_a_compile_setting_refuses_a_compiled_plan_in_one_sentence(tmp_path, profile_path, target,
                                                                                      flags, said):
    from planner.cost import runtimes

    plan = _plan(tmp_path, profile_path, *flags)
    out = tmp_path / "out.txt"
    result = run("export", plan, "--to", target, "--out", out)
    name = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "colossalai": "ColossalAI"}[target]
    assert result.exit_code != 0 and not out.exists()
    assert (f"this plan was scored with torch.compile of {said}, and {name} has no setting that compiles the model: "
            f"it runs {runtimes.facts(target).runs_instead}, so the plan's compiled memory and time would not hold "
            f"there; solve with --runtime {target} (without --compile) and export that plan") in " ".join(
                result.output.split())
    _, plain, said = _export(_plan(tmp_path, profile_path), target)  # the same plan eager is exported
    assert "torch.compile" not in plain and "torch.compile" not in said


def test_a_9dec370_plan_compiling_only_the_loss_compiled_nothing_and_exports_anywhere(tmp_path, profile_path):
    """torchtitan 9dec370's record runs the loss eager: `--compile loss` there charged nothing
    compiled, so a target without compile takes the plan, re-scored as the target's newest record
    (the plan's runtime version is torchtitan's, not the target's)."""
    _, text, _ = _export(_plan(tmp_path, profile_path, "--compile", "loss", version="9dec370"), "megatron")
    assert "CKPLAN_MEGATRON_ARGS" in text
    assert text.splitlines()[1].startswith('# Scored as runtime = "torchtitan", runtime_version = "9dec370"; this '
                                           'export re-scored as runtime = "megatron", runtime_version = "d98e8a64"')


def test_megatron_arguments_read_back_without_compile(tmp_path, profile_path):
    from planner.models.configs import megatron

    plan = _plan(tmp_path, profile_path)
    _, text, _ = _export(plan, "megatron")
    script = plan.with_name("train.sh")
    # launched as its last line says, with the vocabulary the export leaves to the tokenizer
    script.write_text(text + 'torchrun pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" --vocab-size 8000\n')
    job = megatron.read(script)  # the reader of --from-megatron
    assert (job.modelled.compile, job.modelled.compile_loss) == (False, None)
    assert (job.pp, job.micro_batch_size) == (2, 1)


@pytest.mark.parametrize("target, extra, scored_as", [
    ("torchtitan", TOML, 'Scored as runtime = "torchtitan", runtime_version = "b5bcd76c" (ckplan\'s records'),
    ("megatron", (), 'Scored as runtime = "torchtitan", runtime_version = "b5bcd76c"; this export re-scored as runtime '
                     '= "megatron", runtime_version = "d98e8a64", read at Megatron-LM d98e8a64 (2026-08-22) (ckplan\'s'),
    ("deepspeed", (), 'Scored as runtime = "torchtitan", runtime_version = "b5bcd76c"; this export re-scored as '
                      'runtime = "deepspeed", runtime_version = "edaa7221", read at DeepSpeed edaa7221 (2026-08-22) ('),
    ("colossalai", (), 'Scored as runtime = "torchtitan", runtime_version = "b5bcd76c"; this export re-scored as '
                       'runtime = "colossalai", runtime_version = "hf-4.46" (ckplan\'s'),
])
def test_every_export_names_the_runtime_record_the_plan_was_scored_as(tmp_path, profile_path, target, extra,
                                                                      scored_as):
    _, text, _ = _export(_plan(tmp_path, profile_path), target, *extra)
    assert text.splitlines()[1].startswith(f"# {scored_as}")


def test_an_older_records_version_is_named(tmp_path, profile_path):
    _, text, _ = _export(_plan(tmp_path, profile_path, version="9dec370"), "torchtitan", *TOML)
    assert text.splitlines()[1].startswith('# Scored as runtime = "torchtitan", runtime_version = "9dec370" (')


def test_the_export_rescores_a_compiled_plan_as_it_was_solved(tmp_path, profile_path):
    """solve scored the plan's layers compiled (their recorded kept bytes); the export's score of the
    plan as solved is that, not the eager layers of the profile file it reads."""
    plan_path = _plan(tmp_path, profile_path, "--compile", "model")
    plan = io.load_plan(plan_path)
    _, text, _ = _export(plan_path, "torchtitan", *TOML)
    said = [line.rsplit("(plan: ", 1)[1].rstrip(")") for line in text.splitlines() if "(plan: " in line]
    assert said == [format_bytes(stage.predicted.peak_bytes) for stage in plan.stages]
    eager = io.load_plan(_plan(tmp_path, profile_path))
    assert [s.predicted.peak_bytes for s in plan.stages] != [s.predicted.peak_bytes for s in eager.stages]


def test_a_quoted_array_expansion_is_a_word_per_element():
    """The export's own usage line, `pretrain_gpt.py ... "${CKPLAN_MEGATRON_ARGS[@]}"`: bash passes each
    element as its own word, and so does the reader (an element with a blank stays one word)."""
    from planner.models.configs.bashargs import read_script

    script = 'A=(\n    --num-layers 4\n    # a comment\n    --hidden-size 8\n    "x y"\n)\npython pretrain_gpt.py "${A[@]}" --z\n'
    assert read_script(script, "t.sh").args == ["--num-layers", "4", "--hidden-size", "8", "x y", "--z"]
    assert read_script('A=()\npython pretrain_gpt.py "${A[@]}" --q\n', "t.sh").args == ["--q"]


@pytest.mark.parametrize("zero, strategy, group", [(1, None, None), (2, "optim_grads", None),
                                                   (3, "optim_grads_params", None), (1, None, 2)])
def test_megatron_export_of_a_one_stage_zero_plan_reads_back_as_that_zero(tmp_path, profile_path, zero, strategy,
                                                                          group):
    """A one-stage plan under ZeRO 2 or 3 was exported with --use-distributed-optimizer alone (ZeRO 1), and
    re-scored as ZeRO 3: a DeepSeek-V2-Lite plan on 8 H100s said 55.4 GiB, and the file read back by
    --from-megatron scored 59.9 GiB. ZeRO 2 and 3 are written as Megatron FSDP, which the reader reads as
    that ZeRO, with the checkpoint format Megatron-LM asserts for it (arguments.py at d98e8a64). Shard groups
    are written as --num-distributed-optimizer-instances, which the reader charged as one instance."""
    import json

    from planner.models.configs import megatron

    plan = tmp_path / "plan.yaml"
    run_ok("solve", "--profile", profile_path, "--stages", "1", "--dp", "4", "--zero", str(zero), "--microbatches",
           "2", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "megatron",
           *(("--shard-group", str(group)) if group else ()), "--out", plan)
    run_ok("export", plan, "--to", "megatron", "--out", tmp_path / "args.sh")
    text = (tmp_path / "args.sh").read_text()
    assert ("--use-megatron-fsdp" in text) == (strategy is not None)
    assert (f"--data-parallel-sharding-strategy {strategy}" in text) == (strategy is not None)
    assert ("--ckpt-format fsdp_dtensor" in text) == (strategy is not None)
    assert ("--num-distributed-optimizer-instances 2" in text) == (group is not None)
    script = tmp_path / "train.sh"
    script.write_text(text + 'torchrun --nproc_per_node 4 pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" '
                             "--vocab-size 8000\n")
    assert megatron.read(script).zero == zero  # the reader of --from-megatron
    summary = json.loads(run_ok("evaluate", "--from-megatron", script, "--json").stdout)
    assert summary["zero"] == zero
    assert summary["ranks"][0]["peak_bytes"] == io.load_plan(plan).stages[0].predicted.peak_bytes
