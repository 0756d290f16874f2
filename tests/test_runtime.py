"""Runtime pieces that need no process group: stage modules, checkpointing, plan checks,
the schedule replay of `ckplan validate`."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import MODELS, ROOT
from fixtures.rt_plans import make_plan
from torch.utils.flop_counter import FlopCounterMode

from planner.errors import UserError
from planner.models.modelfile import load_model_file
from planner.runtime import replay_order, unsupported_setup, validate_plan
from planner.runtime.checks import prepare, zero_one_imbalance, zero_one_partition
from planner.runtime.stagemodule import build_stage_module
from planner.schema import StagePlan

TINY = ROOT / "tests" / "fixtures" / "rt_tiny.py"
GPT = MODELS / "gpt.py"
TINY_2 = [["0", "1"], ["2", "3", "4"]]


def _stage(layers, checkpointed=()):
    return StagePlan(index=0, layers=layers, checkpointed=list(checkpointed))


# ---------------------------------------------------------------- stage modules


def test_stage_keeps_only_its_layers_under_their_model_names():
    model_file = load_model_file(GPT)
    stage = build_stage_module(model_file, _stage(["blocks.2", "blocks.3"]), seed=0)
    names = [name for name, _ in stage.named_parameters()]
    assert names and all(name.startswith(("blocks.2.", "blocks.3.")) for name in names)
    torch.manual_seed(0)
    full = dict(model_file.build_model().named_parameters())
    for name, param in stage.named_parameters():
        torch.testing.assert_close(param, full[name])  # same seed, same weights as the whole model


def _backward_flops(layers, checkpointed, width, *, input_grad=True, batch=3):
    stage = build_stage_module(load_model_file(TINY), _stage(layers, checkpointed), seed=0)
    x = torch.randn(batch, width, requires_grad=input_grad)
    out = stage(x)
    with FlopCounterMode(display=False) as counter:
        out.sum().backward()
    return counter.get_total_flops()


# Middle stage "1".."4", batch b=3: Linear(16,16), Linear(16,12), Linear(12,4).
# Backward of Linear(i,o): grad input 2*b*i*o + grad weight 2*b*i*o.
# Recomputing a checkpointed block adds its Linear's forward 2*b*i*o.
PLAIN = 2 * (2 * 3 * (16 * 16 + 16 * 12 + 12 * 4))  # 5952


@pytest.mark.parametrize(("checkpointed", "expected"), [
    ([], PLAIN),
    (["3"], PLAIN + 2 * 3 * 16 * 12),  # 7104
    (["1", "3"], PLAIN + 2 * 3 * 16 * 16 + 2 * 3 * 16 * 12),  # 8640
    # A bare Linear saves only its input and weight: non-reentrant checkpoint stops the
    # recompute as soon as those are rebuilt, before the matmul. No extra FLOPs.
    (["4"], PLAIN),
])
def test_backward_flops_count_exactly_the_checkpointed_layers(checkpointed, expected):
    assert _backward_flops(["1", "2", "3", "4"], checkpointed, 16) == expected


def test_first_stage_recomputes_without_an_input_gradient():
    # Linear(8,16) has no input gradient on the first stage: only 2*b*8*16 for its weight.
    plain = 2 * 3 * 8 * 16 + 2 * (2 * 3 * 16 * 16)  # 3840
    assert _backward_flops(["0", "1"], [], 8, input_grad=False) == plain
    assert _backward_flops(["0", "1"], ["0"], 8, input_grad=False) == plain + 2 * 3 * 8 * 16


# ---------------------------------------------------------------- plan checks


@pytest.mark.parametrize(("stages", "message"), [
    ([["0", "1"], ["2", "3", "x"]], "not pipeline layers"),
    ([["0", "1", "2"], ["2", "3", "4"]], "'2' is in stage 0 and stage 1"),
    ([["0", "1"], ["2", "3"]], "in no stage"),
    ([["0", "2"], ["1", "3", "4"]], "contiguous"),
])
def test_bad_stage_layouts_are_refused(stages, message):
    with pytest.raises(UserError, match=message):
        prepare(make_plan(TINY, stages), plan_file=None)


def test_stale_model_is_refused_naming_both_hashes(tmp_path):
    model = tmp_path / "model.py"
    shutil.copy(TINY, model)
    plan = make_plan(model, TINY_2)
    model.write_text(model.read_text() + "\n# edited\n")
    with pytest.raises(UserError) as info:
        prepare(plan, plan_file=None)
    assert plan.model.sha256 in str(info.value) and str(model) in str(info.value) and "--force" in str(info.value)
    prepare(plan, plan_file=None, force=True)


def test_relative_model_path_resolves_against_the_plan_folder(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    shutil.copy(TINY, tmp_path / "models" / "tiny.py")
    plan = make_plan(tmp_path / "models" / "tiny.py", TINY_2)
    plan.model.file = "models/tiny.py"
    monkeypatch.chdir(ROOT)  # not where models/tiny.py is
    with pytest.raises(UserError, match="not found"):
        prepare(plan, plan_file=None)
    assert prepare(plan, plan_file=tmp_path / "plan.yaml").model_path == tmp_path / "models" / "tiny.py"


def test_1f1b_needs_as_many_microbatches_as_stages():
    with pytest.raises(UserError, match="at least as many microbatches"):
        prepare(make_plan(TINY, [["0"], ["1"], ["2", "3"], ["4"]], microbatches=2), plan_file=None)


def test_unknown_dtype_is_refused_before_running():
    plan = make_plan(TINY, TINY_2)
    plan.dtype = "float7"
    with pytest.raises(UserError, match="'float7' is not a torch dtype"):
        prepare(plan, plan_file=None)


def test_unknown_strategy_lists_what_the_plan_has():
    with pytest.raises(UserError, match="has: ckplan"):
        prepare(make_plan(TINY, TINY_2), plan_file=None, strategy="no-ckpt")


def test_setups_the_runtime_does_not_reproduce_are_named():
    plan = make_plan(TINY, TINY_2)
    assert unsupported_setup(plan) == []
    plan.setup.training.precision, plan.setup.data_parallel.dp, plan.setup.data_parallel.zero = "bf16-mixed", 2, 1
    notes = unsupported_setup(plan)  # data parallelism, ZeRO and offload are run (planner.runtime.mesh)
    assert len(notes) == 1 and "bf16-mixed" in notes[0]


# ---------------------------------------------------------------- validate (replay)


def test_replay_order_follows_the_schedules():
    assert replay_order("1F1B", num_stages=2, num_microbatches=3, stage_index=0) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert replay_order("1F1B", num_stages=2, num_microbatches=3, stage_index=1) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert replay_order("GPipe", num_stages=2, num_microbatches=2, stage_index=1) == [
        ("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_validate_sees_in_flight_microbatches_and_checkpointing():
    """Stage 0 of 1F1B holds 2 microbatches, of GPipe all 3; checkpointing a block keeps
    only its input instead of its internals."""
    names = ["embed"] + [f"blocks.{i}" for i in range(8)] + ["head"]

    def stage0(**kwargs):
        plan = make_plan(GPT, [names[:2], names[2:]], micro_batch_size=1, microbatches=3, **kwargs)
        return validate_plan(plan, plan_file=None, stage=0)[0]

    one_f_one_b, gpipe = stage0(), stage0(schedule="GPipe")
    checkpointed = stage0(checkpointed=[["blocks.0"], []])
    assert (one_f_one_b.in_flight, gpipe.in_flight) == (2, 3)
    assert gpipe.peak_bytes > one_f_one_b.peak_bytes > checkpointed.peak_bytes
    assert one_f_one_b.fits


def test_validate_reports_a_stage_over_its_cap():
    checks = validate_plan(make_plan(TINY, TINY_2, caps=[10**9, 1000]), plan_file=None)
    assert [check.fits for check in checks] == [True, False]


def test_stages_train_in_train_mode_whatever_the_model_was_built_in(tmp_path):
    """A model file returning model.eval() (dropout off) must train as one process trains."""
    model = tmp_path / "eval_model.py"
    model.write_text(
        "import torch\nfrom torch import nn\n"
        "def build_model():\n"
        "    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).eval()\n"
        "def example_batch(n):\n    return torch.randn(n, 4), torch.randn(n, 2)\n"
    )
    stage = build_stage_module(load_model_file(model), _stage(["0", "1"]), seed=0)
    assert all(module.training for module in stage.modules())


def test_validate_runs_a_stage_of_parameter_free_layers():
    """Layer "2" of the tiny model has no parameters: its stage has no optimizer to step."""
    plan = make_plan(TINY, [["0", "1"], ["2"], ["3", "4"]])
    checks = validate_plan(plan, plan_file=None)
    assert [check.index for check in checks] == [0, 1, 2] and all(check.fits for check in checks)


@pytest.mark.parametrize(("fault", "message"), [
    ("raise", r"^stage 1: layer '2' raised RuntimeError: layer 2 was told to fail at line \d+: raise"),
    ("loss", r"^stage 1: loss_fn\(output, target\) raised ValueError: the loss was told to fail at line \d+"),
])
def test_validate_names_the_stage_and_the_user_code_that_raised(monkeypatch, fault, message):
    monkeypatch.setenv("RT_FAULT", fault)
    plan = make_plan(TINY, [["0", "1"], ["2", "3", "4"]])
    with pytest.raises(UserError, match=message):
        validate_plan(plan, plan_file=None, stage=1)


# ---------------------------------------------------------------- building on the meta device

TIED = ROOT / "tests" / "fixtures" / "tied_gpt.py"


def test_a_stage_gets_memory_for_its_own_layers_only_with_one_process_values():
    """A model file with init_layer() is built on meta; a stage's layers get the values the
    whole model gets in one process (each layer seeded on its own), the rest no memory."""
    from planner.runtime.stagemodule import build_layers

    model_file = load_model_file(TIED)
    whole = dict(build_layers(model_file, seed=3))
    stage = dict(build_layers(model_file, seed=3, keep=["blocks.1", "blocks.2"]))
    for name in ("blocks.1", "blocks.2"):
        for (_, one), (_, mine) in zip(whole[name].named_parameters(), stage[name].named_parameters(), strict=True):
            assert torch.equal(one, mine)
    assert all(p.is_meta for name in ("blocks.0", "blocks.3", "head") for p in stage[name].parameters())
    assert not any(p.is_meta for layer in whole.values() for p in layer.parameters())
    assert whole["embed"].tokens.weight is whole["head"].weight  # a shared parameter stays one tensor
    assert not torch.equal(whole["blocks.1"].mlp[0].weight, dict(build_layers(model_file, seed=4))["blocks.1"].mlp[0].weight)


def test_init_layer_errors_name_the_layer(tmp_path):
    from planner.runtime.stagemodule import build_layers

    model = tmp_path / "bad_init.py"
    model.write_text(TIED.read_text().replace("def init_layer(name, layer):",
                                              "def init_layer(name, layer):\n    raise KeyError(name)"))
    with pytest.raises(UserError, match=r"init_layer\('embed'\) raised KeyError: 'embed' at line \d+"):
        build_layers(load_model_file(model), seed=0)


def test_zero_one_partition_gives_whole_tensors_largest_first():
    # three equal tensors over 2 ranks: one rank gets two (8), though 6 would be even
    assert zero_one_partition([4, 4, 4], 2) == [8, 4]
    assert zero_one_partition([5, 1, 1, 1, 1, 1], 2) == [5, 5]


def test_launch_names_the_stage_where_zero_one_holds_more_than_predicted():
    # the bundled GPT, dp 4 in one shard group, fp32 Adam (4 + 4 + 8 B a parameter), each
    # stage predicted as if every rank held an even quarter of the optimizer state: the
    # blocks' tensors split evenly, and so do the embedding stage's (its 524,288-parameter
    # table is under a quarter of 2.9 M); the head's weight, as large, is more than a quarter
    # of its stage of 1.3 M, so the rank holding it keeps (524,288 - 1,314,560 / 4) x 8 B more
    from planner.models.modelfile import pipeline_layers

    plan = make_plan(MODELS / "gpt.py", [["embed", "blocks.0", "blocks.1", "blocks.2"],
                                         ["blocks.3", "blocks.4", "blocks.5", "blocks.6"], ["blocks.7", "head"]])
    plan.setup = plan.setup.model_copy(update={"dp": 4, "zero": 1, "shard_group": 4})
    sizes = {name: sum(p.numel() for p in layer.parameters())
             for name, layer in pipeline_layers(load_model_file(MODELS / "gpt.py").build_model())}
    for stage in plan.stages:
        stage.predicted.static_bytes = sum(sizes[name] for name in stage.layers) * (4 + 4 + 8 // 4)
    notes = zero_one_imbalance(plan, None)
    assert [note.split(":")[0] for note in notes] == ["stage 2"]
    assert "(the largest has 524,288 parameters)" in notes[0]
    # a plan that charged the head whole (as a profile with tensor sizes makes it) says nothing
    plan.stages[2].predicted.static_bytes += (524_288 - 1_314_560 // 4) * 8
    assert zero_one_imbalance(plan, None) == []
    assert zero_one_imbalance(plan.model_copy(update={"setup": plan.setup.model_copy(update={"zero": 2})}), None) == []
