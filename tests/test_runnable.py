"""The ZeRO stages a runtime runs (planner/cost/runnable.py): DeepSpeed's PipelineEngine asserts ZeRO below 2
beside a pipeline and shards over no group smaller than the data-parallel ranks (MiCS removed in 0.19.8), ColossalAI's
HybridParallelPlugin asserts ZeRO 0 or 1 beside a pipeline; the single-setup commands refuse the rest in one
sentence, the whole-job search skips them, and the DeepSpeed export of one stage runs the plain engine."""

from __future__ import annotations

import ast
import json

import pytest
from click.testing import CliRunner
from export_plans import write
from fixtures.tiny_gpt2 import tiny_gpt2_profile

from planner import io
from planner.cli import cli
from planner.cost.runnable import data_parallel_refused
from planner.emit import deepspeed


def _refused(runtime, *, zero, dp=8, shard_group=None, stages=1, version=None, precision="bf16-mixed"):
    return data_parallel_refused(runtime, version, precision=precision, zero=zero, dp=dp, shard_group=shard_group,
                                 stages=stages)


def test_deepspeeds_pipeline_runs_zero_1_at_most_and_its_shard_groups_zero_3_only():
    for zero in (2, 3):
        sentence = _refused("deepspeed", zero=zero, stages=2)
        assert sentence.startswith(f"--zero {zero} with 2 pipeline stages under --runtime deepspeed")
        assert "deepspeed/runtime/pipe/engine.py 76-78" in sentence and sentence.endswith("give --zero 1 or one stage")
        assert _refused("deepspeed", zero=zero, stages=1) is None  # the plain engine
    assert _refused("deepspeed", zero=1, stages=4) is None
    for zero in (1, 2, 3):
        assert "at no ZeRO stage" in _refused("deepspeed", zero=zero, shard_group=4)
        assert _refused("deepspeed", zero=zero, shard_group=8) is None  # the whole group is no smaller group
    # BLOOM's DeepSpeed predates MiCS (its bf16 runs ZeRO 1 whatever the config names)
    assert "at no ZeRO stage" in _refused("deepspeed", zero=1, shard_group=4, version="56c52238")
    assert "give --zero 1" in _refused("deepspeed", zero=3, version="56c52238")


def test_colossalai_pipelines_run_zero_1_at_most_and_the_others_any_stage():
    assert "hybrid_parallel_plugin.py" in _refused("colossalai", zero=2, stages=2)
    assert _refused("colossalai", zero=2, stages=1) is None
    for runtime in ("ckplan", "torchtitan", "megatron"):
        assert _refused(runtime, zero=3, stages=4, shard_group=2) is None


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_gpt2_profile(tmp_path_factory.mktemp("p"), "a100-80g")


def test_evaluate_refuses_zero_2_beside_deepspeeds_pipeline_in_one_sentence(tiny_path):
    base = ["evaluate", "--profile", str(tiny_path), "--ckpt-per-stage", "0", "--microbatches", "4", "--mem", "80GB",
            "--precision", "bf16-mixed", "--runtime", "deepspeed", "--dp", "4"]
    result = CliRunner().invoke(cli, [*base, "--layers-per-stage", "2,2", "--zero", "2"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--zero 2 with 2 pipeline stages under --runtime deepspeed" in result.output
    result = CliRunner().invoke(cli, [*base, "--layers-per-stage", "4", "--zero", "3", "--shard-group", "2"])
    assert result.exit_code != 0 and "at no ZeRO stage" in result.output
    result = CliRunner().invoke(cli, [*base, "--layers-per-stage", "4", "--zero", "3"])
    assert result.exit_code == 0, result.output


def test_the_search_ranks_only_what_deepspeed_runs(tiny_path):
    result = CliRunner().invoke(cli, ["search", "--profile", str(tiny_path), "--gpus", "8", "--global-batch", "16",
                                      "--runtime", "deepspeed", "--mem", "80GB", "--top", "50", "--json"])
    assert result.exit_code == 0, result.output
    ranked = [r["degrees"] for r in json.loads(result.output)["ranked"]]
    assert ranked and json.loads(result.output)["counts"]["refused"] > 0
    assert all(d["zero"] <= 1 for d in ranked if d["pp"] > 1)
    assert all(d["shard_group"] in (None, d["dp"]) for d in ranked)
    assert any(d["zero"] == 3 and d["pp"] == 1 for d in ranked)


def _config(plan, profile) -> tuple[str, dict]:
    text = deepspeed.export(plan, profile, plan_file="plan.yaml").text
    line = next(line for line in text.splitlines() if line.startswith("CKPLAN_DS_CONFIG = "))
    return text, ast.literal_eval(line.removeprefix("CKPLAN_DS_CONFIG = "))


def test_one_stage_exports_the_plain_engine_which_runs_zero_3(tmp_path):
    _, plan, _ = write(tmp_path, [10], {"layers.1", "layers.2"})
    profile = io.load_profile(tmp_path / "llm.json")
    sharded = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 8, "zero": 3})})
    text, config = _config(sharded, profile)
    assert config["zero_optimization"] == {"stage": 3} and "PipelineModule" not in text
    deepspeed_config = pytest.importorskip("deepspeed.runtime.config")
    read = deepspeed_config.DeepSpeedConfig(config)  # DeepSpeed's own reading of the config
    assert read.zero_optimization_stage == 3
    torch = pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile(text, "export.py", "exec"), namespace)
    model = namespace["ckplan_model"]([torch.nn.Linear(2, 2) for _ in range(10)])
    # layers.1 and layers.2 are the profile's layers 2 and 3 (the embedding is 0)
    assert [type(m).__name__ for m in model][:5] == ["Linear", "Linear", "CkplanCheckpointed", "CkplanCheckpointed",
                                                      "Linear"]
    inputs = torch.randn(3, 2, requires_grad=True)
    model(inputs).sum().backward()  # DeepSpeed's own reentrant checkpoint reruns the wrapped layers
    assert all(layer.weight.grad is not None for layer in model.modules() if isinstance(layer, torch.nn.Linear))
    with pytest.raises(ValueError, match="for 10 layers, got 3"):
        namespace["ckplan_model"]([torch.nn.Linear(2, 2)] * 3)


def test_torchtitan_before_its_accumulation_runs_one_microbatch_a_step_on_one_stage():
    from planner.cost.runnable import accumulation_refused

    for version in ("9dec370", "bbb1b616"):
        sentence = accumulation_refused("torchtitan", version, stages=1, microbatches=2)
        assert sentence.startswith("--microbatches 2 on one stage under --runtime torchtitan")
        assert "no gradient accumulation" in sentence and "train.py" in sentence
        assert accumulation_refused("torchtitan", version, stages=1, microbatches=1) is None
        assert accumulation_refused("torchtitan", version, stages=2, microbatches=8) is None  # its pipeline's
    for runtime, version in (("torchtitan", "2c8b5947"), ("torchtitan", "b5bcd76c"), ("megatron", None),
                             ("deepspeed", None), ("colossalai", None), ("ckplan", None)):
        assert accumulation_refused(runtime, version, stages=1, microbatches=4) is None


def test_a_deepspeed_export_of_a_shard_group_plan_is_rounded_to_the_whole_group_and_says_so(tmp_path):
    """A plan solved elsewhere with ZeRO 3 in groups of 4 of 8 ranks: DeepSpeed's config has no smaller group, so the
    export shards over all 8 and its re-score charges that, not the plan's groups."""
    _, plan, _ = write(tmp_path, [10], set())
    profile = io.load_profile(tmp_path / "llm.json")
    grouped = plan.model_copy(update={"setup": plan.setup.model_copy(update={"dp": 8, "zero": 3, "shard_group": 4})})
    exported = deepspeed.export(grouped, profile, plan_file="plan.yaml")
    assert exported.rounded.setup.data_parallel.shard_group is None
    assert any("not in groups of 4" in change and "all 8 ranks" in change for change in exported.rounded.changes)
    assert _config(grouped, profile)[1]["zero_optimization"] == {"stage": 3}
