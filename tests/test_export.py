"""`ckplan export` without the frameworks: what each rounding does to a plan, exactly, the
re-score beside the plan, and every refusal."""

from __future__ import annotations

import pytest
from export_plans import MIB, llm_profile, make_plan, write
from fixtures.cli import run

from planner import io
from planner.cost import costmodel
from planner.emit import colossalai, megatron, rounding, torchtitan
from planner.errors import UserError
from planner.models import synthetic

SIZES = [4, 3, 3]  # tok_embeddings + layers.0-2 | layers.3-5 | layers.6-7 + output
CHECKPOINTED = {"layers.1", "layers.2", "layers.3", "layers.6"}


def stage_ckpt(export):
    return [stage.checkpointed for stage in export.rounded.stages]


def test_roles_of_an_llm_profile_and_of_one_without_a_stack():
    roles = rounding.llm_roles(llm_profile(4))
    assert (roles.pre, roles.decoder, roles.post) == (["tok_embeddings"], [f"layers.{i}" for i in range(4)],
                                                      ["output"])
    assert rounding.llm_roles(synthetic.heterogeneous(6)) is None


def test_megatron_one_count_for_all_stages_the_largest(tmp_path):
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED)
    result = megatron.export(plan, profile, plan_file=str(path))
    # per-stage counts [2, 1, 1] -> N = 2: the first 2 decoder layers of every stage
    assert stage_ckpt(result) == [["layers.0", "layers.1"], ["layers.3", "layers.4"], ["layers.6", "layers.7"]]
    assert result.scored.rounded.iteration_ms == costmodel.evaluate(result.rounded.stages, profile,
                                                                    plan.setup).iteration_ms
    assert result.scored.exact.iteration_ms == plan.predicted.iteration_ms
    assert result.scored.rounded.iteration_ms > result.scored.exact.iteration_ms  # two more recomputes
    assert '--pipeline-model-parallel-layout "Et*3|t*3|t*2L"' in result.text
    assert "--recompute-num-layers 2" in result.text and "largest of the plan's per-stage counts [2, 1, 1]" in result.text


def test_megatron_layout_grammar():
    assert megatron.layout([19, 20, 20, 21]) == "Et*19|t*20|t*20|t*21L"
    assert megatron.layout([0, 1, 5]) == "E|t|t*5L"


def test_colossalai_checkpoints_the_first_k_of_each_stage(tmp_path):
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED)
    result = colossalai.export(plan, profile, plan_file=str(path))
    # stage 0 chose layers.1-2; ColossalAI takes its first two, layers.0-1; stages 1 and 2 already first
    assert stage_ckpt(result) == [["layers.0", "layers.1"], ["layers.3"], ["layers.6"]]
    assert "num_layers_per_stage=[3, 3, 2]" in result.text
    assert "num_ckpt_layers_per_stage=[2, 1, 1]" in result.text
    assert any("stage 0 now checkpoints its first k" in change for change in result.rounded.changes)


def _with_norm_profile():
    layers = [synthetic.layer("embed", "Embedding", fwd_ms=0.5, act_mib=0.01, input_mib=0.01, param_count=10)]
    layers += [synthetic.layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=10, input_mib=1, param_count=10)
               for i in range(6)]
    layers += [synthetic.layer("norm", "Norm", fwd_ms=1, act_mib=1, input_mib=1, param_count=10),
               synthetic.layer("head", "Head", fwd_ms=4, act_mib=3, input_mib=1, param_count=10)]
    return synthetic.profile_of(layers, name="normed")


def test_the_head_side_joins_the_last_stage(tmp_path):
    profile = _with_norm_profile()
    io.save_profile(profile, tmp_path / "p.json")
    plan = make_plan(profile, tmp_path / "p.json", [4, 4, 1], set())
    result = megatron.export(plan, profile, plan_file="plan.yaml")
    assert [s.layers for s in result.rounded.stages][1:] == [["blocks.3", "blocks.4", "blocks.5"],
                                                              ["norm", "head"]]
    assert any("moved norm" in change for change in result.rounded.changes)
    emptied = make_plan(profile, tmp_path / "p.json", [7, 1, 1], set())
    with pytest.raises(UserError, match="leaves stage 1 without layers"):
        megatron.export(emptied, profile, plan_file="plan.yaml")


def test_torchtitan_0_2_takes_the_fastest_uniform_setting_that_fits(tmp_path):
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED, cap_mib=68)
    result = torchtitan.export(plan, profile, plan_file=str(path), version="0.2.2")
    roles = rounding.llm_roles(profile)
    # brute force: no checkpointing, every n-th decoder layer of a stage (n = 1..3)
    options = [[[n for i, n in enumerate(rounding.decoder_layers(s, roles), 1) if every and i % every == 0]
                for s in plan.stages] for every in (0, 3, 2, 1)]
    costs = []
    for ckpt in options:
        stages = [s.model_copy(update={"checkpointed": c}) for s, c in zip(plan.stages, ckpt)]
        costs.append(costmodel.evaluate(stages, profile, plan.setup))
    best = min((c for c in costs if c.feasible), key=lambda c: c.iteration_ms)
    assert result.scored.rounded.iteration_ms == best.iteration_ms
    assert result.scored.exact.feasible and result.scored.rounded.feasible
    assert "CHECKPOINTED = {'layers.1', 'layers.2', 'layers.3', 'layers.6'}" in result.text


def test_torchtitan_0_3_is_the_plan_exactly(tmp_path):
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED, runtime="torchtitan")
    result = torchtitan.export(plan, profile, plan_file=str(path), base="m:f")
    assert result.rounded.changes == []
    assert result.scored.rounded.iteration_ms == result.scored.exact.iteration_ms
    assert "['layers.6', 'layers.7', 'norm', 'lm_head']" in result.text
    with_tp = torchtitan.export(plan, profile.model_copy(update={"assumptions": {"tp": 2}}), plan_file=str(path),
                                base="m:f")
    compile(with_tp.text, "export.py", "exec")
    assert "\n    config.parallelism.tensor_parallel_degree = 2\n" in with_tp.text


def test_deepspeed_never_checkpoints_the_first_layer_and_says_when_that_no_longer_fits(tmp_path):
    layers = [synthetic.layer(f"l{i}", f"K{i}", fwd_ms=1, act_mib=100 if i == 0 else 1, input_mib=1,
                              param_count=10) for i in range(4)]
    profile = synthetic.profile_of(layers)
    io.save_profile(profile, tmp_path / "p.json")
    loose = make_plan(profile, tmp_path / "p.json", [2, 2], {"l0"})
    cap_mib = max(loose.stages[0].predicted.peak_bytes, loose.stages[1].predicted.peak_bytes) / MIB + 1
    io.save_plan(make_plan(profile, tmp_path / "p.json", [2, 2], {"l0"}, cap_mib=cap_mib), tmp_path / "plan.yaml")
    result = run("export", str(tmp_path / "plan.yaml"), "--to", "deepspeed")
    assert result.exit_code == 0, result.output
    assert "l0, the model's first layer, runs without checkpointing" in result.output
    assert "NO LONGER FITS" in result.output
    assert "error:" not in result.output and "warning" in result.output.lower()  # written, exit 0: a warning
    text = (tmp_path / "plan.deepspeed.py").read_text()
    assert "WARNING: rounded for DeepSpeed, stage 0 no longer fits" in text
    assert "STAGE_STARTS = [0, 2]" in text and "CHECKPOINTED = []" in text


def test_export_writes_beside_the_plan_and_nothing_else(tmp_path):
    _, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    for target, name in [("megatron", "plan.megatron.sh"), ("colossalai", "plan.colossalai.py"),
                         ("deepspeed", "plan.deepspeed.py")]:
        result = run("export", str(path), "--to", target)
        assert result.exit_code == 0, result.output
        assert (tmp_path / name).read_text().startswith(f"# ckplan plan {path} for ")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["llm.json", "plan.yaml", "plan.megatron.sh", "plan.colossalai.py", "plan.deepspeed.py"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "torchtitan", "--torchtitan-version", "0.1.0"], "use --torchtitan-version 0.2.0 or newer"),
        (["--to", "torchtitan", "--torchtitan-version", "new"], "give a release number"),
        (["--to", "torchtitan"], "--torchtitan-base MODULE:FUNCTION"),
        (["--to", "megatron", "--out", "/proc/no/such.sh"], "cannot write"),
        (["--to", "megatron", "--out", "{plan}"], "is the PLAN this command reads"),
        (["--to", "megatron", "--out", "{profile}"], "is the --profile this command reads"),
    ],
)
def test_export_refuses_in_one_sentence(tmp_path, args, message):
    _, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    profile = str(tmp_path / "llm.json")
    args = [a.format(plan=path, profile=profile) for a in args]
    result = run("export", str(path), *args, *(["--profile", profile] if profile in args else []))
    assert result.exit_code == 1 and message in result.output, result.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written or replaced


def test_export_refuses_a_plan_whose_profile_moved_or_changed(tmp_path):
    profile, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    io.save_profile(profile.model_copy(update={"name": "edited"}), tmp_path / "llm.json")
    assert "changed since the plan was made" in run("export", str(path), "--to", "megatron").output
    (tmp_path / "llm.json").unlink()
    assert "pass it with --profile" in run("export", str(path), "--to", "megatron").output


def test_export_refuses_a_profile_without_a_decoder_stack_for_llm_frameworks(tmp_path):
    profile = synthetic.heterogeneous(4)
    io.save_profile(profile, tmp_path / "p.json")
    io.save_plan(make_plan(profile, tmp_path / "p.json", [2, 2], set()), tmp_path / "plan.yaml")
    result = run("export", str(tmp_path / "plan.yaml"), "--to", "colossalai")
    assert result.exit_code == 1 and "export to deepspeed instead" in result.output
    assert run("export", str(tmp_path / "plan.yaml"), "--to", "deepspeed").exit_code == 0


def test_megatron_arguments_are_a_bash_array_of_flags(tmp_path):
    import subprocess

    _, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    assert run("export", str(path), "--to", "megatron").exit_code == 0
    script = f'source {tmp_path / "plan.megatron.sh"}; printf "%s\\n" "${{CKPLAN_MEGATRON_ARGS[@]}}"'
    args = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    assert args[:6] == ["--num-layers", "8", "--pipeline-model-parallel-size", "3",
                        "--pipeline-model-parallel-layout", "Et*3|t*3|t*2L"]
    assert "--recompute-num-layers" in args and not any(arg.startswith("#") for arg in args)


def test_a_gpipe_plan_is_scored_as_the_1f1b_a_framework_runs(tmp_path):
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED, schedule="GPipe")
    result = colossalai.export(plan, profile, plan_file=str(path))
    assert result.rounded.setup.pipeline.schedule == "1F1B" and plan.setup.pipeline.schedule == "GPipe"
    one_f_one_b = plan.setup.model_copy(update={"schedule": "1F1B", "runtime": "colossalai"})
    assert result.scored.rounded.peak_bytes_per_stage == costmodel.evaluate(
        result.rounded.stages, profile, one_f_one_b).peak_bytes_per_stage
    assert any("runs a 1F1B schedule, not GPipe" in change for change in result.rounded.changes)
    titan = torchtitan.export(plan, profile, plan_file=str(path), base="m:f")
    assert titan.rounded.setup.pipeline.schedule == "GPipe" and 'pipeline_parallel_schedule = "GPipe"' in titan.text


def test_export_refuses_a_plan_that_is_not_for_this_profile_or_fits_nowhere(tmp_path):
    _, plan, path = write(tmp_path, SIZES, CHECKPOINTED)
    io.save_profile(llm_profile(12), tmp_path / "other.json")
    result = run("export", str(path), "--to", "megatron", "--profile", str(tmp_path / "other.json"))
    assert result.exit_code == 1 and "is not the profile" in result.output  # refused by the pin, before scoring
    io.save_plan(plan.model_copy(update={"solver": plan.solver.model_copy(update={"status": "infeasible"})}), path)
    result = run("export", str(path), "--to", "megatron")
    assert result.exit_code == 1 and "records no feasible plan" in result.output


def test_export_refuses_a_plan_charged_for_bf16_throughout(tmp_path):
    _, plan, path = write(tmp_path, SIZES, CHECKPOINTED)
    io.save_plan(plan.model_copy(update={"setup": plan.setup.model_copy(update={"precision": "bf16"})}), path)
    for target in ("megatron", "torchtitan", "colossalai", "deepspeed"):
        result = run("export", str(path), "--to", target, "--out", str(tmp_path / f"out-{target}"))
        assert result.exit_code == 1 and "--precision bf16-mixed" in result.output, result.output
        assert "Traceback" not in result.output and not (tmp_path / f"out-{target}").exists()


def test_export_refuses_a_profile_the_plan_was_not_made_from(tmp_path):
    """The same architecture profiled otherwise (here: renamed) re-scored a plan silently."""
    profile, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    other = tmp_path / "other.json"
    io.save_profile(profile.model_copy(update={"name": "at another sequence length"}), other)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("export", str(path), "--to", "megatron", "--profile", str(other))
    assert result.exit_code == 1 and "is not the profile" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    moved = tmp_path / "moved.json"
    (tmp_path / "llm.json").rename(moved)  # the right profile, moved: --profile finds it
    assert run("export", str(path), "--to", "megatron", "--profile", str(moved)).exit_code == 0


def test_export_prints_one_table_when_nothing_was_rounded(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli

    def output(path, target, *extra):
        result = CliRunner().invoke(cli, ["export", str(path), "--to", target, *extra], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return result.output

    # nothing checkpointed, 1F1B, solved for torchtitan's runtime: torchtitan says it exactly
    _, _, path = write(tmp_path, [4, 3, 3], set(), runtime="torchtitan")
    text = output(path, "torchtitan", "--torchtitan-base", "m:f")
    assert "Rounded: nothing" in (tmp_path / "plan_torchtitan.py").read_text()
    assert text.count("the plan, exactly") == 1 and "the plan, exactly as torchtitan runs it" in text
    _, _, path = write(tmp_path, [4, 3, 3], set())  # solved for ckplan's runtime
    # Megatron-LM says it exactly too, but its pipeline holds no per-microbatch receive buffers:
    # the same plan scored for its runtime, said, in two tables
    text = output(path, "megatron")
    assert "rounded: scored for megatron's runtime, not ckplan's" in text
    assert "the plan, exactly" in text and "as Megatron-LM runs it" in text
    _, _, path = write(tmp_path, SIZES, CHECKPOINTED)  # ColossalAI moves the checkpoints: both tables
    text = output(path, "colossalai")
    assert "the plan, exactly" in text and "as ColossalAI runs it" in text and "exactly as ColossalAI" not in text


def _llama_export(tmp_path, name: str) -> dict[str, str]:
    """The Megatron-LM flags exported for a plan of an analytic profile of `name` (seq 4096, tp 4 + SP)."""
    import re

    from fixtures.cli import run_ok

    profile, plan = tmp_path / "a.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", name, "--seq-len", "4096", "--tp", "4", "--sp", "--out", str(profile))
    run_ok("solve", "--profile", str(profile), "--stages", "4", "--microbatches", "8", "--precision", "bf16-mixed",
           "--out", str(plan))
    run_ok("export", str(plan), "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    return dict(re.findall(r"^\s+(--[\w-]+) ?(.*)$", text, flags=re.M))


def test_megatron_export_carries_the_model_shape(tmp_path):
    """The analytic profile read every shape field from the config; the export reproduces the model."""
    flags = _llama_export(tmp_path, "llama3-8b")
    assert {key: flags[key] for key in ("--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                                        "--num-query-groups", "--seq-length", "--max-position-embeddings",
                                        "--normalization", "--position-embedding-type")} == {
        "--hidden-size": "4096", "--ffn-hidden-size": "14336", "--num-attention-heads": "32",
        "--num-query-groups": "8", "--seq-length": "4096", "--max-position-embeddings": "8192",
        "--normalization": "RMSNorm", "--position-embedding-type": "rope"}
    assert {"--group-query-attention", "--swiglu", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights"} <= set(flags)
    assert "--add-qkv-bias" not in flags and "--kv-channels" not in flags
    (tmp_path / "q").mkdir()
    qwen = _llama_export(tmp_path / "q", "qwen2.5-7b")
    assert "--add-qkv-bias" in qwen and qwen["--num-query-groups"] == "4"


def test_megatron_export_of_a_profile_without_its_architecture_says_to_give_the_shape(tmp_path):
    _, _, path = write(tmp_path, SIZES, CHECKPOINTED)
    run("export", str(path), "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    assert "--hidden-size" not in text.replace("# the model's shape (--hidden-size", "")
    assert "this profile does not record its architecture" in text


def test_torchtitan_refuses_a_base_config_of_another_depth(tmp_path):
    """A 32-layer base (LLaMA 3 8B) for a 28-layer plan (Qwen2.5-7B) was accepted without a word."""
    from fixtures.cli import run_ok

    profile, plan = tmp_path / "q.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", "qwen2.5-7b", "--seq-len", "1024", "--out", str(profile))
    run_ok("solve", "--profile", str(profile), "--stages", "4", "--out", str(plan))
    result = run("export", str(plan), "--to", "torchtitan", "--torchtitan-base",
                 "torchtitan.models.llama3.config_registry:llama3_8b")
    assert result.exit_code == 1 and "has 32 decoder layers and this plan 28" in result.output
    assert not (tmp_path / "plan_torchtitan.py").exists()


def test_a_plan_solved_for_ckplans_runtime_is_rescored_for_torchtitans(tmp_path):
    """ckplan's runtime steps with foreach Adam (sqrt(v) a new tensor a parameter); torchtitan's
    AdamW is fused since 2025-02-24 and allocates none: the same plan peaks lower at its step there,
    which the export says before anything it rounds."""
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED)
    result = torchtitan.export(plan, profile, plan_file=str(path), base="m:f")
    assert result.rounded.changes[0].startswith("scored for torchtitan's runtime, not ckplan's")
    titan = costmodel.evaluate(plan.stages, profile, plan.setup.model_copy(update={"runtime": "torchtitan"}))
    assert max(titan.peak_bytes_per_stage) <= max(result.scored.exact.peak_bytes_per_stage)


def test_torchtitan_without_a_pipeline_accumulates_the_plans_microbatches(tmp_path):
    """One stage: torchtitan runs local_batch_size in one forward and accumulates gradients over
    global_batch_size // (local x dp) of them (train.py at 238fa9953e4a). The export wrote
    local_batch_size = microbatches x micro-batch, one forward 6 times the plan's activations; ckplan's
    own reader of torchtitan TOMLs reads the export back as the plan's 6 microbatches of 1."""
    import json
    import re

    import tomllib

    _, _, path = write(tmp_path, [10], set(), runtime="torchtitan")
    out = tmp_path / "job.toml"
    assert run("export", path, "--to", "torchtitan", "--torchtitan-version", "0.2.2", "--out", out).exit_code == 0
    text = out.read_text()
    training = tomllib.loads(text)["training"]
    assert (training["local_batch_size"], training["global_batch_size"]) == (1, 6)
    job = re.sub(r"module_fqns_per_model_part = \[.*?\n\]\n", "", text, flags=re.S)
    job = '[model]\nname = "llama3"\nflavor = "8B"\n' + job.replace("[training]\n", "[training]\nseq_len = 1024\n")
    (tmp_path / "merged.toml").write_text(job)
    result = run("evaluate", "--from-torchtitan", tmp_path / "merged.toml", "--gpus", "1", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["micro_batch_size"], summary["microbatches"]) == (1, 6)
    python = run("export", path, "--to", "torchtitan", "--torchtitan-base", "m:f", "--out", tmp_path / "t.py")
    assert python.exit_code == 0, python.output
    lines = (tmp_path / "t.py").read_text()
    assert "config.training.local_batch_size = 1\n" in lines and "config.training.global_batch_size = 6\n" in lines
    # a pipeline splits the local batch itself: unchanged
    _, _, piped = write(tmp_path, SIZES, set(), runtime="torchtitan")
    assert run("export", piped, "--to", "torchtitan", "--torchtitan-version", "0.2.2", "--out", out).exit_code == 0
    assert "global_batch_size" not in out.read_text()
    assert tomllib.loads(out.read_text())["training"]["local_batch_size"] == 6


def test_torchtitan_0_2_says_its_uniform_setting_in_words(tmp_path):
    """selective_ac_option = "3" was said 'every 3th decoder layer'."""
    profile, plan, path = write(tmp_path, SIZES, CHECKPOINTED, cap_mib=85)
    result = torchtitan.export(plan, profile, plan_file=str(path), version="0.2.2")
    assert 'selective_ac_option = "2"' in result.text
    assert ("one [activation_checkpoint] for all stages: one decoder layer in every 2 a rank builds checkpointed"
            in result.rounded.changes)
