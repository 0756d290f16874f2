"""A fine-tuning model whose first layers are frozen and take the batch (tests/fixtures/frozen_front.py: Linear 8-16
and 16-16 frozen, 16-16 and 16-2 trained, 4 rows a microbatch): nothing before the third layer needs a gradient, so
torch's pipelining runs no backward through the first two, and a stage needing none receives and sends no gradient
(framework-facts §730, §731)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.cli import run_ok
from test_costmodel import stage_of

from planner import io
from planner.cost import costmodel, rules
from planner.cost.layers import layer_costs

FRONT_FILE = Path(__file__).parent / "fixtures" / "frozen_front.py"
ROWS, FP32 = 4, 4


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    folder = tmp_path_factory.mktemp("front")
    (folder / "front.py").write_text(FRONT_FILE.read_text())
    run_ok("profile", folder / "front.py", "--micro-batch-size", str(ROWS), "--threads", "1", "--repeats", "1",
           "--warmup", "0", "--out", folder / "p.json")
    return folder, io.load_profile(folder / "p.json")


def test_the_profile_records_which_inputs_need_a_gradient(front):
    """The batch needs none, nor the frozen layers' outputs; the first trained layer's output does. A layer running no
    backward keeps nothing, and its transient is its forward's peak with its input: layer 0 its output 4 x 16 and
    the batch's 4 x 8 floats, layer 1 its output and input, 4 x 16 each (addmm allocates its output alone)."""
    _, profile = front
    assert [layer.input_requires_grad for layer in profile.layers] == [False, False, False, True]
    assert [layer.act_bytes for layer in profile.layers[:2]] == [0, 0]
    assert [layer.transient_bytes for layer in profile.layers[:2]] == [(ROWS * 16 + ROWS * 8) * FP32,
                                                                       2 * ROWS * 16 * FP32]
    costs = layer_costs(profile)
    assert [(c.input_grad, c.output_grad) for c in costs] == [(False, False), (False, False), (False, True),
                                                              (True, True)]


def test_a_stage_needing_no_gradient_has_no_gradient_buffers(front):
    """2 stages, 4 microbatches (1F1B): a stage whose output needs no gradient gets no receive buffer for one (a
    trained output 4 of 4 x 16 floats), and one whose input needs none sends none: its 4 receive buffers alone."""
    folder, profile = front
    setup = io.load_plan(_solved(folder)).setup
    costs = {c.name: c for c in layer_costs(profile)}
    out_bytes = ROWS * 16 * FP32
    assert rules.last_layer_buffer_bytes(costs["1"], 0, setup) == 0
    assert rules.last_layer_buffer_bytes(costs["2"], 0, setup) == 4 * out_bytes
    assert rules.first_layer_buffer_bytes(costs["2"], 1, setup) == 4 * out_bytes
    assert rules.first_layer_buffer_bytes(costs["3"], 1, setup) == (4 + 1) * out_bytes  # and the gradient sent


def _solved(folder: Path, *args: str) -> Path:
    plan = folder / f"plan{'-'.join(args)}.yaml"
    if not plan.exists():
        run_ok("solve", "--profile", folder / "p.json", "--mem", "100MiB", "--stages", "2", "--microbatches", "4",
               *args, "--out", plan)
    return plan


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_charge_a_frozen_front_as_the_score_does(front, solver):
    """Each solver's plan predicts, stage by stage, the peak and time stage_cost scores its split at."""
    folder, profile = front
    plan = io.load_plan(_solved(folder, "--solver", solver))
    for stage in plan.stages:
        scored = stage_of(profile, plan.setup, stage.index, stage.layers, stage.checkpointed)
        assert stage.predicted.peak_bytes == scored.peak_bytes
        assert stage.predicted.time_ms == pytest.approx(scored.time_ms)


@pytest.mark.slow
def test_a_frozen_first_stage_holds_what_is_charged(front):
    """Stages [0, 1] | [2, 3] launched on gloo. Stage 0 runs no backward: its peak is a forward of layer 1 with
    2 outputs in flight, its input and its output (4 x 256 B), the 4 x 128 B batch and its 416 frozen weights: 3,200 B
    measured. The plan charges 256 B more: layer 1 closes the stage, so its output is charged as the stage output
    waiting in fwd_cache and again in its forward's peak (transient_bytes: a layer inside a stage needs it there).
    Before, the stage was charged 4 gradient receive buffers, the layers' backward transients and a step scratch."""
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from planner.schema import StagePlan

    folder, profile = front
    solved = io.load_plan(_solved(folder))
    stages = [StagePlan(index=0, layers=["0", "1"]), StagePlan(index=1, layers=["2", "3"])]
    plan = solved.model_copy(update={"stages": with_predictions(stages, costmodel.evaluate(stages, profile,
                                                                                            solved.setup))})
    io.save_plan(plan, folder / "cut.yaml")
    report = run_plan(io.load_plan(folder / "cut.yaml"), plan_file=folder / "cut.yaml", steps=1, warmup_steps=0)
    first = report.stages[0]
    assert first.measured.static_bytes == first.predicted.static_bytes == (144 + 272) * FP32
    assert first.measured.peak_bytes == 416 * FP32 + 4 * ROWS * 8 * FP32 + 4 * ROWS * 16 * FP32
    assert first.predicted.peak_bytes == first.measured.peak_bytes + ROWS * 16 * FP32


def _cut(folder: Path, profile, zero: int, first: list[str]) -> Path:
    """The plan solved at dp 2 and ZeRO `zero`, cut after the layers `first`, with the cost model's predictions."""
    from planner.cost.assembly import with_predictions
    from planner.schema import StagePlan

    solved = io.load_plan(_solved(folder, "--dp", "2", "--zero", str(zero)))
    stages = [StagePlan(index=0, layers=first), StagePlan(index=1, layers=[str(i) for i in range(len(first), 4)])]
    plan = solved.model_copy(update={"stages": with_predictions(stages, costmodel.evaluate(stages, profile,
                                                                                            solved.setup))})
    path = folder / f"cut-z{zero}-{len(first)}.yaml"
    io.save_plan(plan, path)
    return path


FROZEN_STAGE_ZERO3_PEAK = (416 * FP32 // 2  # the 2 frozen layers' shards (dp 2)
                           + (272 + 272 + 144) * FP32  # layer 1's copy-out: its all-gather output, its weights, layer 0's output
                           + 2 * ROWS * 16 * FP32  # 2 stage outputs waiting in fwd_cache (1F1B's warm-up)
                           + ROWS * 16 * FP32 + 4 * ROWS * 8 * FP32)  # layer 1's input, the 4 microbatches of the batch


def test_a_layer_running_no_backward_has_no_fsdp2_backward_moments(front):
    """A wholly frozen stage (0, 1 | 2, 3) at dp 2, ZeRO 3: FSDP2 gathers its layers for their forwards alone. Its peak
    is layer 1's copy-out (layer 0's all-gather output still referenced, framework-facts §733), by hand 4,864 B, what
    ckplan's runtime measures (the slow test below); it was charged a backward's moments, 5,280."""
    folder, profile = front
    stage = io.load_plan(_cut(folder, profile, 3, ["0", "1"])).stages[0]
    assert stage.predicted.static_bytes == 416 * FP32 // 2
    assert stage.predicted.peak_bytes == FROZEN_STAGE_ZERO3_PEAK == 4864


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_the_solvers_charge_fsdp2_over_a_frozen_front_as_the_score_does(front, solver, zero):
    """At dp 2 under ZeRO 2/3 the frozen layers' FSDP2 moments: each solver's plan, stage by stage, at the score's."""
    folder, profile = front
    plan = io.load_plan(_solved(folder, "--dp", "2", "--zero", str(zero), "--solver", solver))
    for stage in plan.stages:
        scored = stage_of(profile, plan.setup, stage.index, stage.layers, stage.checkpointed)
        assert stage.predicted.peak_bytes == scored.peak_bytes


# (ZeRO, stage 0's layers, stage 0's static by hand, what the plan charges over the measured peak)
SHARDED = [
    # the shards (dp 2) of every weight, of layer 2's gradient and Adam's m and v, its 2 step counts (4 B each)
    # and, under ZeRO 2, every layer's weights whole (gathered in the forward, frozen ones too)
    (2, ["0", "1", "2"], (416 + 272) * FP32 + (416 + 272) * FP32 // 2 + 272 * (4 + 8) // 2 + 2 * 4, 0),
    (3, ["0", "1", "2"], (416 + 272) * FP32 // 2 + 272 * (4 + 8) // 2 + 2 * 4, ROWS * 16 * FP32),
    # never resharded (no backward, so no post-backward): the weights whole and their shards
    (2, ["0", "1"], 416 * FP32 + 416 * FP32 // 2, 2 * ROWS * 16 * FP32),
    (3, ["0", "1"], 416 * FP32 // 2, 0),
]


@pytest.mark.slow
@pytest.mark.parametrize(("zero", "first", "static", "over"), SHARDED)
def test_ckplans_runtime_shards_frozen_layers_as_charged(front, zero, first, static, over):
    """dp 2 on gloo: every layer its own FSDP2 unit, frozen or not, and a wholly frozen stage sharded (mesh.py
    data_parallel), as the cost model charges them. Before, the frozen layers joined the stage's root unit (ZeRO 3
    stage 0, 0, 1, 2: 11,080 B measured, 9,672 charged) and a frozen stage was not sharded (1,664 B static, 832
    charged). Stage 0's static is exact and its peak charged at most `over` above: ZeRO 3's 256 B is layer 2's
    output gradient, both the receive buffer and in its profiled backward transient; ZeRO 2's 512 B on a frozen
    stage the 2 microbatches' outputs charged beside the all-gathers of a forward, which only the first forward
    runs (its units never resharded). Each trains as one process does."""
    from planner.runtime.launcher import run_plan
    from planner.runtime.reference import against_reference

    folder, profile = front
    path = _cut(folder, profile, zero, first)
    plan = io.load_plan(path)
    report = run_plan(plan, plan_file=path, steps=1, warmup_steps=0)
    stage = report.stages[0]
    assert stage.measured.static_bytes == stage.predicted.static_bytes == static
    assert stage.predicted.peak_bytes - stage.measured.peak_bytes == over
    if first == ["0", "1"] and zero == 3:
        assert stage.measured.peak_bytes == FROZEN_STAGE_ZERO3_PEAK
    diffs = against_reference(plan, report, plan_file=path, seed=0)
    assert diffs and all(diff.ok for diff in diffs), diffs


@pytest.mark.parametrize("frozen", [(0, 2), (0, 2, 3)])
def test_data_parallel_makes_every_layer_a_unit_frozen_or_not(frozen):
    """Under ZeRO 3 over 2 ranks (torch's fake process group: the units are the wrapping, whatever the backend), each
    layer with parameters is its own FSDP2 unit, a frozen one too, and a stage none of whose parameters trains is
    sharded (each rank holds half of each weight); before, frozen layers joined the root unit and such a stage stayed
    whole (framework-facts §732, §733). A layer without parameters is no unit."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import FSDPModule
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.runtime.mesh import Layout, data_parallel, device_mesh
    from planner.runtime.stagemodule import StageModule

    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 2)]
    for index in frozen:
        layers[index].requires_grad_(False)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        module = StageModule([(str(i), layer) for i, layer in enumerate(layers)])
        wrapped, _ = data_parallel(module, zero=3, mesh=device_mesh(Layout(stages=1, dp=2, shard=2), "cpu"))
        assert isinstance(wrapped, FSDPModule)
        assert [isinstance(layer, FSDPModule) for layer in layers] == [True, False, True, True]
        assert layers[0].weight.to_local().shape == (8, 8) and not layers[0].weight.requires_grad
    finally:
        dist.destroy_process_group()
