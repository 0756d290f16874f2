"""torch.compile as each runtime's record says it (RuntimeFacts.compiles_model): only torchtitan has a
setting that compiles the model; under every other runtime --compile is refused in one sentence that
names the runtime and what it runs instead, by evaluate, solve, search and the config readers, and
`ckplan launch` refuses a plan scored compiled (its runtime runs eager)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fixtures.cli import run, run_ok
from fixtures.tiny_compiled import tiny_profile

from planner import io
from planner.cost import runtimes
from planner.errors import UserError

EAGER = [runtime for runtime in runtimes.VERSIONS if runtime != "torchtitan"]
CONFIGS = Path(__file__).parent / "fixtures" / "configs"


# ---------------------------------------------------------------- the records


@pytest.mark.parametrize("runtime, version", [(r, v) for r, vs in runtimes.VERSIONS.items() for v in vs])
def test_only_torchtitan_compiles_the_model_and_the_others_say_what_they_run(runtime, version):
    record = runtimes.facts(runtime, version)
    assert record.compiles_model == (runtime == "torchtitan")
    assert bool(record.runs_instead) == (not record.compiles_model)
    # the source names the file it was read from and the version
    source = record.sources["compiles_model"]
    assert ".py" in source and (runtime == "ckplan" or any(ch.isdigit() for ch in source))


@pytest.mark.parametrize("runtime", EAGER)
@pytest.mark.parametrize("components", ["model,loss", "model", "loss"])
def test_compile_under_a_runtime_that_does_not_compile_is_one_sentence(runtime, components):
    from types import SimpleNamespace

    loss = None if components == "model,loss" else components == "loss"
    training = SimpleNamespace(runtime=runtime, runtime_version=None, compile="model" in components, compile_loss=loss,
                               float8=False, fp8_all_gather=False, context_parallel=1, cp_comm=None,
                               chunked_cross_entropy=False, mtp_layers=0, expert_tp=None)
    refused = runtimes.refused_settings(training)
    record = runtimes.facts(runtime)
    assert refused == [f"--compile {components} asks for torch.compile, and {runtime}'s runtime ({record.version}) "
                       f"does not compile the model: it runs {record.runs_instead}; drop --compile, or score with "
                       "--runtime torchtitan"]
    assert runtimes.refused_settings(SimpleNamespace(**(vars(training) | {"runtime": "torchtitan"}))) == []
    assert runtimes.refused_settings(SimpleNamespace(**(vars(training) | {"compile": False, "compile_loss": None}))) == []


# ---------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_profile(tmp_path_factory.mktemp("p"), compiled=True)[1]


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("runtime", EAGER)
def test_evaluate_refuses_compile_naming_the_runtime(tiny_path, runtime):
    result = run("evaluate", "--profile", tiny_path, "--layers-per-stage", "4", "--ckpt-per-stage", "0",
                 "--microbatches", "1", "--mem", "80GB", "--runtime", runtime, "--compile")
    assert result.exit_code != 0
    assert f"--compile model,loss asks for torch.compile, and {runtime}'s runtime" in _said(result)
    assert runtimes.facts(runtime).runs_instead in _said(result)
    assert len(result.output.strip().splitlines()) <= 4  # one sentence, wrapped


def test_evaluate_without_a_runtime_is_ckplans_which_refuses_compile(tiny_path):
    result = run("evaluate", "--profile", tiny_path, "--layers-per-stage", "4", "--ckpt-per-stage", "0",
                 "--microbatches", "1", "--mem", "80GB", "--compile", "loss")
    assert result.exit_code != 0 and "--compile loss asks for torch.compile, and ckplan's runtime" in _said(result)
    ok = run_ok("evaluate", "--profile", tiny_path, "--layers-per-stage", "4", "--ckpt-per-stage", "0",
                "--microbatches", "1", "--mem", "80GB", "--runtime", "torchtitan", "--compile")
    assert "compiles the loss" in _said(ok)


def test_solve_refuses_compile_and_writes_no_plan(tiny_path, tmp_path):
    out = tmp_path / "plan.yaml"
    result = run("solve", "--profile", tiny_path, "--stages", "1", "--microbatches", "1", "--mem", "80GB",
                 "--runtime", "megatron", "--compile", "model", "--out", out)
    assert result.exit_code != 0 and "--compile model asks for torch.compile, and megatron's runtime" in _said(result)
    assert not out.exists()


def test_search_refuses_compile_and_writes_no_plan(tmp_path):
    from test_launchers import _tiny_config

    out = tmp_path / "best.yaml"
    result = run("search", "--arch-config", _tiny_config(tmp_path), "--gpus", "8", "--global-batch", "8", "--seq-len",
                 "512", "--runtime", "deepspeed", "--top", "1", "--out", out, "--compile")
    assert result.exit_code != 0 and "deepspeed's runtime" in _said(result) and "engine.compile()" in _said(result)
    assert not out.exists()


# ---------------------------------------------------------------- the config readers


def test_no_megatron_flag_says_compile():
    """Megatron-LM d98e8a64 has no argument that torch.compiles the model: its reader never sets the
    setting (no assignment to `.compile` or `.compile_loss` in planner/models/configs/megatron*.py)."""
    configs = Path(__file__).resolve().parents[1] / "planner" / "models" / "configs"
    for path in configs.glob("megatron*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assert not any(isinstance(t, ast.Attribute) and t.attr in ("compile", "compile_loss") for t in targets)


def test_a_torchtitan_toml_says_compile_and_is_scored_compiled():
    from planner.commands.evaluate_config import predict
    from planner.models.configs import torchtitan

    job = torchtitan.from_mapping({"model": {"name": "llama3", "flavor": "8B"}, "compile": {"enable": True,
                                   "components": ["model"]}, "training": {"seq_len": 1024, "local_batch_size": 1}},
                                  "t.toml")
    scored = predict(job, gpus=8, gpu_name="h100")
    assert (scored.setup.training.compile, scored.setup.training.compile_loss) == (True, False)


# ---------------------------------------------------------------- launch


def test_launch_refuses_a_plan_scored_compiled(tmp_path):
    """A plan whose setup compiles (an older plan file, or one edited by hand) is refused before any
    process starts: ckplan's runtime runs eager, so the plan's compiled predictions would not hold."""
    from export_plans import write

    _, plan, path = write(tmp_path, [4, 6], set())
    for training in ({"compile": True}, {"compile_loss": True}):
        compiled = plan.model_copy(update={"setup": plan.setup.model_copy(
            update={"training": plan.setup.training.model_copy(update=training)})})
        io.save_plan(compiled, path)
        result = run("launch", path, "--steps", "1", "--warmup-steps", "0")
        assert result.exit_code != 0
        assert "ckplan's runtime runs each stage's layers eager" in _said(result)
    from planner.runtime.checks import check_runnable

    with pytest.raises(UserError, match="solve without --compile"):
        check_runnable(compiled)
    check_runnable(plan)  # the same plan uncompiled passes this check
