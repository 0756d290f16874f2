"""Exports of plans whose ranks hold several pipeline stages (interleaved 1F1B, ZB, ZBV,
DualPipeV): each framework's configuration lists the P·V stages, names the schedule or rounds
it to one the framework runs, and the rounding is re-scored (costmodel.evaluate, as every plan).

The hand case: P = 2 ranks x V = 2 chunks, pipeline stages of 2, 3, 1, 4 layers:
    stage 0: tok_embeddings, layers.0     stage 1: layers.1-3
    stage 2: layers.4                     stage 3: layers.5-7, output
decoder layers per stage 1, 3, 1, 3; checkpointed layers.1, layers.2 (stage 1) and layers.4
(stage 2): per-stage counts 0, 2, 1, 0. Loop placement (interleaved-1F1B, ZB): rank 0 holds
stages 0 and 2, rank 1 stages 1 and 3; V placement (ZBV, DualPipeV): rank 0 holds 0 and 3,
rank 1 holds 1 and 2.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import sys
import types
from pathlib import Path

import pytest
from export_plans import llm_profile, write_chunked
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import costmodel
from planner.emit import colossalai, deepspeed, megatron, rounding, torchtitan
from planner.errors import UserError
from planner.schema import StagePlan

SIZES = [2, 3, 1, 4]
RECOMPUTE = {"layers.1": "full", "layers.2": "full", "layers.4": "full"}
DECODERS = [["layers.0"], ["layers.1", "layers.2", "layers.3"], ["layers.4"], ["layers.5", "layers.6", "layers.7"]]
LAYOUT = "Et|t*3|t|t*3L"


def _stages(plan):
    return costmodel.pipeline_stages(plan.stages, plan.setup)


def test_pipeline_stages_undo_the_placement(tmp_path):
    for schedule, ranks in (("interleaved-1F1B", [[0, 2], [1, 3]]), ("ZBV", [[0, 3], [1, 2]])):
        _, plan, _ = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule=schedule)
        stages = _stages(plan)
        assert [s.layers for s in stages][1:3] == [DECODERS[1], DECODERS[2]]
        assert [[stages[k].layers for k in mine] for mine in ranks] == [r.chunks for r in plan.stages]
        assert [s.checkpointed for s in stages] == [[], ["layers.1", "layers.2"], ["layers.4"], []]
        assert costmodel.ranks_of(stages, plan.setup) == [r.model_copy(update={"predicted": None})
                                                          for r in plan.stages]


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_interleaved_layout_lists_the_virtual_stages_in_pipeline_order(tmp_path):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="interleaved-1F1B")
    result = megatron.export(plan, profile, plan_file=str(path))
    assert f'--pipeline-model-parallel-layout "{LAYOUT}"' in result.text
    assert "--num-layers-per-virtual-pipeline-stage" not in result.text  # not uniform
    # one N for every virtual stage: the largest count, 2, the first 2 decoder layers of each
    assert "--recompute-num-layers 2" in result.text
    assert [s.checkpointed for s in result.rounded.stages] == [["layers.0"], ["layers.1", "layers.2"], ["layers.4"],
                                                              ["layers.5", "layers.6"]]
    assert result.rounded.setup.pipeline.schedule == "interleaved-1F1B"
    ranks = costmodel.ranks_of(result.rounded.stages, result.rounded.setup)
    assert result.scored.rounded == costmodel.evaluate(ranks, profile, result.rounded.setup)
    assert not any("schedule" in change for change in result.rounded.changes)


def test_megatron_uniform_virtual_stages_name_the_simpler_flag(tmp_path):
    profile, plan, path = write_chunked(tmp_path, [3, 2, 2, 3], {}, schedule="interleaved-1F1B")
    text = megatron.export(plan, profile, plan_file=str(path)).text
    assert '"Et*2|t*2|t*2|t*2L"' in text and "--num-layers-per-virtual-pipeline-stage 2" in text
    assert "--recompute-granularity" not in text


@pytest.mark.parametrize("schedule", ["ZBV", "DualPipeV"])
def test_megatron_runs_a_v_as_interleaved_stages_replaced_in_a_loop(tmp_path, schedule):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule=schedule)
    result = megatron.export(plan, profile, plan_file=str(path))
    assert f'"{LAYOUT}"' in result.text  # the same pipeline stages
    assert any(f"has no {schedule} schedule" in c and "re-placed from a V" in c for c in result.rounded.changes)
    setup = result.rounded.setup
    assert (setup.pipeline.schedule, setup.pipeline.chunks) == ("interleaved-1F1B", 2)
    # re-placed: rank 0 now holds stages 0 and 2 (layers.0 and layers.4), rank 1 stages 1 and 3
    ranks = result.rounded.ranks()
    assert [r.chunks[1][0] for r in ranks] == ["layers.4", "layers.5"]
    assert result.scored.rounded == costmodel.evaluate(ranks, profile, setup)
    assert result.scored.exact == costmodel.evaluate(plan.stages, profile, plan.setup)


def test_megatron_zb_keeps_its_chunks_as_interleaved(tmp_path):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZB")
    result = megatron.export(plan, profile, plan_file=str(path))
    assert any("has no ZB schedule" in c and "re-placed" not in c for c in result.rounded.changes)
    assert f'"{LAYOUT}"' in result.text


def test_megatron_refuses_microbatches_its_interleaving_cannot_group(tmp_path):
    profile, plan, path = write_chunked(tmp_path, SIZES, {}, schedule="ZBV", microbatches=5)
    with pytest.raises(UserError, match="groups of the pipeline size"):
        megatron.export(plan, profile, plan_file=str(path))


def test_megatron_core_reads_the_layout_as_the_plans_ranks_and_chunks(tmp_path):
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    _, _, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZBV")
    assert run("export", str(path), "--to", "megatron").exit_code == 0
    args = dict(re.findall(r"^\s+(--[\w-]+)(?: (.+))?$", (tmp_path / "plan.megatron.sh").read_text(), flags=re.M))
    config = TransformerConfig(
        num_layers=int(args["--num-layers"]), hidden_size=64, num_attention_heads=4,
        pipeline_model_parallel_size=int(args["--pipeline-model-parallel-size"]), pipeline_dtype=torch.bfloat16,
        pipeline_model_parallel_layout=shlex.split(args["--pipeline-model-parallel-layout"])[0],
        recompute_granularity=args["--recompute-granularity"], recompute_method=args["--recompute-method"],
        recompute_num_layers=int(args["--recompute-num-layers"]),
    )
    assert config.virtual_pipeline_model_parallel_size == 2
    layout = config.pipeline_model_parallel_layout
    parallel_state.set_virtual_pipeline_model_parallel_world_size(2)
    try:
        ids = [[layout.get_layer_id_list(pp_rank=r, vp_stage=c) for c in range(2)] for r in range(2)]
    finally:
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    # Megatron's rank r, virtual stage c runs pipeline stage c·P + r: interleaved, a loop
    assert ids == [[[0], [4]], [[1, 2, 3], [5, 6, 7]]]


# ---------------------------------------------------------------- torchtitan


@pytest.mark.parametrize(("schedule", "name"), [("interleaved-1F1B", "Interleaved1F1B"), ("ZB", "InterleavedZeroBubble"),
                                                ("ZBV", "ZBVZeroBubble"), ("DualPipeV", "DualPipeV")])
def test_torchtitan_names_the_schedule_and_lists_the_pipeline_stages(tmp_path, schedule, name):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule=schedule,
                                        microbatches=4, runtime="torchtitan")
    result = torchtitan.export(plan, profile, plan_file=str(path), base="m:f")
    assert f'pipeline_parallel_schedule = "{name}"' in result.text
    assert result.rounded.changes == [] and result.scored.rounded == result.scored.exact
    parts = ast.literal_eval(result.text.split("MODULE_FQNS_PER_MODEL_PART = ")[1].split("\n]\n")[0] + "\n]")
    assert parts == [["tok_embeddings", "layers.0"], DECODERS[1], DECODERS[2], DECODERS[3] + ["norm", "lm_head"]]
    toml = torchtitan.export(plan, profile, plan_file=str(path), version="0.2.2").text
    assert f'pipeline_parallel_schedule = "{name}"' in toml


@pytest.mark.parametrize("schedule", ["interleaved-1F1B", "ZB", "ZBV", "DualPipeV"])
def test_torchtitan_places_the_stages_on_the_plans_ranks(tmp_path, schedule):
    """torchtitan's own stage-to-rank mapping puts each rank's chunks where the plan has them."""
    pytest.importorskip("torchtitan")
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule=schedule)
    result = torchtitan.export(plan, profile, plan_file=str(path), base="m:f")
    name = re.search(r'pipeline_parallel_schedule = "(\w+)"', result.text).group(1)
    assert get_schedule_class(name) is not None
    parts = torchtitan.fqns_per_stage(result.rounded, rounding.llm_roles(profile), "lm_head")
    for rank, mine in enumerate(plan.stages):
        held = [parts[k] for k in _get_pp_rank_to_stage_indices_mapping(rank, 2, name, 4)]
        assert [[n for n in part if n.startswith("layers.")] for part in held] == \
            [[n for n in chunk if n.startswith("layers.")] for chunk in mine.chunks]


def test_torchtitan_config_runs_a_chunked_plan(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from test_export_frameworks import _load_titan_export

    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZBV")
    text = torchtitan.export(plan, profile, plan_file=str(path), base="ckplan_base:base").text
    config = _load_titan_export(tmp_path, text).ckplan_config()
    assert config.parallelism.pipeline_parallel_schedule == "ZBVZeroBubble"
    assert len(config.parallelism.module_fqns_per_model_part) == 4
    assert sorted(config.activation_checkpoint.layers) == ["layers.1", "layers.2", "layers.4"]


# ---------------------------------------------------------------- ColossalAI


def _colossalai_files(monkeypatch, *relatives: str) -> list:
    """ColossalAI modules loaded from their files (its package import needs CUDA-era
    dependencies), `colossalai.cluster` stubbed."""
    spec = importlib.util.find_spec("colossalai")
    if spec is None:
        pytest.skip("colossalai not installed")
    root = Path(spec.submodule_search_locations[0])
    package = types.ModuleType("colossalai")
    package.__path__ = []
    cluster = types.ModuleType("colossalai.cluster")
    cluster.ProcessGroupMesh = object
    monkeypatch.setitem(sys.modules, "colossalai", package)
    monkeypatch.setitem(sys.modules, "colossalai.cluster", cluster)
    modules = []
    for relative in relatives:
        loader = importlib.util.spec_from_file_location(Path(relative).stem, root / relative)
        modules.append(importlib.util.module_from_spec(loader))
        loader.loader.exec_module(modules[-1])
    return modules


def _plugin_kwargs(text: str) -> dict:
    call = next(node for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "HybridParallelPlugin")
    return {k.arg: k.value for k in call.keywords}


@pytest.mark.parametrize(("schedule", "style", "ks"), [
    ("interleaved-1F1B", "interleaved", [0, 2, 1, 0]),  # entry c·P + r: stage c·P + r
    ("ZB", "interleaved", [0, 2, 1, 0]),
    ("ZBV", "zbv", [0, 2, 0, 1]),  # rank 0 chunk 1 is stage 3, rank 1 chunk 1 stage 2
    ("DualPipeV", "zbv", [0, 2, 0, 1]),
])
def test_colossalai_chunks_by_its_stage_manager_and_checkpoint_config(tmp_path, monkeypatch, schedule, style, ks):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule=schedule)
    result = colossalai.export(plan, profile, plan_file=str(path))
    kwargs = _plugin_kwargs(result.text)
    assert ast.literal_eval(kwargs["pp_style"]) == style and ast.literal_eval(kwargs["num_model_chunks"]) == 2
    assert ast.literal_eval(kwargs["gradient_checkpoint_config"].keywords[0].value) == ks
    assert "num_layers_per_stage" not in kwargs  # the plugin asserts P counts: set on its stage manager
    assert "plugin.stage_manager.num_layers_per_stage = [1, 3, 1, 3]" in result.text
    if schedule in ("ZB", "DualPipeV"):
        assert any(f"has no {schedule} schedule" in c for c in result.rounded.changes)

    stage_manager, grad_ckpt = _colossalai_files(monkeypatch, "pipeline/stage_manager.py",
                                                 "shardformer/shard/grad_ckpt_config.py")
    manager = types.SimpleNamespace(use_zbv=style == "zbv", stage=0, num_model_chunks=2, num_stages=2)
    config = grad_ckpt.PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage=ks)
    for rank, mine in enumerate(plan.stages):
        spans = stage_manager.PipelineStageManager.get_stage_index(manager, [1, 3, 1, 3], stage=rank)
        assert [list(range(*span)) for span in spans] == \
            [[int(n.split(".")[1]) for n in chunk if n.startswith("layers.")] for chunk in mine.chunks]
        held = [sum(n in mine.checkpointed for n in chunk) for chunk in mine.chunks]
        assert [config.get_num_ckpt_layers(rank, 2, len(range(*spans[c])), c, 2) for c in range(2)] == held


def test_colossalai_zbv_builds_its_own_v_schedule(tmp_path, monkeypatch):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZBV")
    kwargs = _plugin_kwargs(colossalai.export(plan, profile, plan_file=str(path)).text)
    v_schedule, = _colossalai_files(monkeypatch, "pipeline/schedule/v_schedule.py")
    nodes = eval(ast.unparse(kwargs["scheduler_nodes"]), {"PipelineGraph": v_schedule.PipelineGraph})
    assert len(nodes) == 2  # one list of nodes per rank
    computed = [[node.type for node in rank if node.type in "FBW"] for rank in nodes]
    assert all(len(kinds) == 3 * 2 * 4 for kinds in computed)  # F, B, W of 2 chunks x 4 microbatches


# ---------------------------------------------------------------- DeepSpeed


def test_deepspeed_merges_each_ranks_consecutive_stages(tmp_path):
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZBV")
    result = deepspeed.export(plan, profile, plan_file=str(path))
    assert [s.layers for s in result.rounded.stages] == [
        ["tok_embeddings", *DECODERS[0], *DECODERS[1]], [*DECODERS[2], *DECODERS[3], "output"]]
    assert (result.rounded.setup.pipeline.schedule, result.rounded.setup.pipeline.chunks) == ("1F1B", 1)
    assert "STAGE_STARTS = [0, 5]" in result.text and "CHECKPOINTED = [2, 3, 5]" in result.text
    assert any("runs one stage per rank (1F1B), not ZBV with 2 chunks" in c for c in result.rounded.changes)
    assert result.scored.rounded == costmodel.evaluate(result.rounded.stages, profile, result.rounded.setup)


# ---------------------------------------------------------------- the command


def test_a_solved_interleaved_plan_exports_to_every_framework(tmp_path):
    path = tmp_path / "llm.json"
    io.save_profile(llm_profile(), path)
    run_ok("solve", "--profile", path, "--stages", "2", "--schedule", "interleaved-1F1B", "--chunks", "2",
           "--mem", "1GiB", "--microbatches", "4", "--out", tmp_path / "plan.yaml")
    plan = io.load_plan(tmp_path / "plan.yaml")
    assert [len(stage.chunks) for stage in plan.stages] == [2, 2]
    for target in ("megatron", "torchtitan", "colossalai", "deepspeed"):
        extra = ["--torchtitan-base", "m:f"] if target == "torchtitan" else []
        result = run("export", tmp_path / "plan.yaml", "--to", target, *extra)
        assert result.exit_code == 0 and "Traceback" not in result.output, (target, result.output)
        assert "iteration: plan" in result.output


def test_rounded_ranks_are_the_plans_ranks_when_nothing_rounds(tmp_path):
    profile, plan, _ = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="interleaved-1F1B")
    rounded = rounding.start(plan, "torchtitan")
    assert [StagePlan.model_validate(r.model_dump()) for r in rounded.ranks()] == \
        [r.model_copy(update={"predicted": None}) for r in plan.stages]


def test_torchtitan_0_2_counts_every_nth_layer_over_the_chunks_a_rank_builds(tmp_path):
    """0.2's selective_ac_option counts blocks with one process-wide counter: over a rank's
    chunks in the order it builds them (its stages in increasing order)."""
    profile, plan, path = write_chunked(tmp_path, SIZES, RECOMPUTE, schedule="ZBV")
    rounded = rounding.start(plan, "torchtitan")
    assert torchtitan._built_by_rank(rounded, rounding.llm_roles(profile)) == [
        DECODERS[0] + DECODERS[3], DECODERS[1] + DECODERS[2]]
    result = torchtitan.export(plan, profile, plan_file=str(path), version="0.2.2")
    assert any("a rank builds" in c or "no checkpointing" in c or "every decoder layer" in c
               for c in result.rounded.changes)
    assert result.scored.rounded == costmodel.evaluate(result.rounded.ranks(), profile, result.rounded.setup)
