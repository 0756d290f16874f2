"""An untied token embedding alone on its pipeline stage under ZeRO 2 (FSDP2 on gloo, ckplan's runtime;
tests/fixtures/embed_table.py: nn.Embedding 64 x 32, two residual MLPs, a 32 x 64 head). Its one tensor is the
layer's last trained one: foreach_reduce keeps its dense, whole gradient past gloo's reduce-scatter wait (§839), which
gathered._gloo_bytes charges from the profile's last_trained_param_count. A profile made before that field was
recorded (64c3c73a) charged none: stage 0 one table's fp32 bytes under (OLMo 2 tiny: 524,288 B, §67.embedzero)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost.layers import layer_costs

EMBED_FILE = Path(__file__).parent / "fixtures" / "embed_table.py"
VOCAB, DIM, HIDDEN, FP32 = 64, 32, 64, 4


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    folder = tmp_path_factory.mktemp("table")
    (folder / "model.py").write_text(EMBED_FILE.read_text())
    run_ok("profile", folder / "model.py", "--micro-batch-size", "2", "--threads", "1", "--repeats", "1",
           "--warmup", "0", "--out", folder / "p.json")
    raw = json.loads((folder / "p.json").read_text())
    for layer in raw["layers"]:  # as a profile written before the fields were recorded
        del layer["last_trained_param_count"], layer["forward_transient_bytes"]
    (folder / "old.json").write_text(json.dumps(raw))
    run_ok("solve", "--profile", folder / "p.json", "--mem", "100MiB", "--stages", "2", "--microbatches", "4",
           "--dp", "2", "--zero", "2", "--out", folder / "plan.yaml")
    return folder


def test_a_profile_without_the_last_tensor_charges_its_largest(table):
    """Recorded: the embedding's one table (64 x 32), each block's second Linear's bias (32), the head's weight. Not
    recorded: each layer's largest tensor (a block's 64 x 32 weights), which bounds its last; before, 0. So the
    embedding's post-backward charges beside gloo's clone the reduce-scatter's output, half the table (dp 2), and the
    table's gradient: 2,048 x 4 / 2 + 2,048 x 4 = 12,288 B."""
    from test_costmodel import setup as train_setup

    from planner.cost import gloowork

    recorded = [c.last_trained_param_count for c in layer_costs(io.load_profile(table / "p.json"))]
    old = [c.last_trained_param_count for c in layer_costs(io.load_profile(table / "old.json"))]
    assert recorded == [VOCAB * DIM, DIM, DIM, VOCAB * DIM]
    assert old == [VOCAB * DIM, HIDDEN * DIM, HIDDEN * DIM, VOCAB * DIM]
    zero2 = train_setup(2, dp=2, zero=2)
    assert gloowork.reduce_scatter_beside_bytes(VOCAB * DIM, old[0], zero2) == 2048 * FP32 // 2 + 2048 * FP32 == 12288


def test_a_profile_without_the_last_tensor_never_charges_less(table):
    """Stage 0 the embedding alone: the old profile charged 8,192 B (its table) less than the recorded one; now the
    same, and the last stage (its head's one weight also its last) at least as much."""
    plan = io.load_plan(table / "plan.yaml")
    new, old = (_cut(table, name, 1, plan.setup) for name in ("p.json", "old.json"))
    assert old[0] == new[0] and old[1] >= new[1]


def _cut(folder: Path, profile_name: str, cut: int, setup) -> list[int]:
    from planner.cost import costmodel
    from planner.schema import StagePlan

    profile = io.load_profile(folder / profile_name)
    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
    return [stage.peak_bytes for stage in costmodel.evaluate(stages, profile, setup).stages]


def test_a_blocks_forward_holds_its_all_gather_output_beside_its_own_peak(table):
    """A block's forward peak is its residual add: its second Linear's output (2 x 16 x 32 floats, 4,096 B) beside
    the add's, which it keeps; the profile records that 4,096. Its unit's all-gather output (2 x 32 x 64 + 64 + 32
    parameters, 16,768 B) lives through it, so the block's forward moment is that output and 4,096 B beside what it
    keeps: over its charged peak (kept + transient) 16,768 + 4,096 - its transient. Full recompute: its transient
    bounds its forward's, 16,768. Without the field (an older profile) not charged, as before."""
    from test_costmodel import setup as train_setup

    from planner.cost import gathered

    gathered_bytes = (2 * 32 * 64 + 64 + 32) * FP32
    assert gathered_bytes == 16768
    zero2 = train_setup(2, dp=2, zero=2)
    forwards = {}
    for name, option in (("p.json", 0), ("p.json", 1), ("old.json", 0)):
        profile = io.load_profile(table / name)
        block = layer_costs(profile)[1]
        _, forward = gathered.neighbour_moments(block, option, 0, profile=profile, setup=zero2,
                                                units_of=gathered.stage_units(profile, zero2), index=1,
                                                opens=False, closes=True, model_last=False)
        forwards[name, option] = (block.forward_transient_bytes, forward[2:], block.transient_bytes)
    transient = forwards["p.json", 0][2]
    assert forwards["p.json", 0][:2] == (2 * 16 * 32 * FP32, [gathered_bytes + 4096 - transient])
    assert forwards["old.json", 0][:2] == (None, [])
    scratch = transient + layer_costs(io.load_profile(table / "p.json"))[1].recompute_peak_bytes
    assert forwards["p.json", 1][1] == [gathered_bytes]  # its transient and recompute peak, all of its scratch
    assert scratch > transient



def test_a_fake_profile_records_the_forwards_transient_as_the_measured_one(table, tmp_path):
    """The fake profiler counts the same forward extra on fake tensors (fake_wgrad.transient_parts): a block's second
    Linear's output, 2 x 16 x 32 in its dtype (bf16 there: 2,048 B; the measured fp32 profile's 4,096), none for the
    embedding and the head, whose outputs are what they keep."""
    run_ok("profile", table / "model.py", "--fake", "--micro-batch-size", "2", "--out", tmp_path / "f.json")
    fake = io.load_profile(tmp_path / "f.json")
    assert fake.dtype == "bfloat16"
    assert [layer.forward_transient_bytes for layer in fake.layers] == [0, 2 * 16 * 32 * 2, 2 * 16 * 32 * 2, 0]
    measured = io.load_profile(table / "p.json")
    assert [layer.forward_transient_bytes for layer in measured.layers] == [0, 2 * 16 * 32 * FP32, 2 * 16 * 32 * FP32, 0]

# (profile, stage 0's layers, whether from an older profile, which charges no forward moment: 256 B under)
LAUNCHES = [("p.json", 1, False), ("old.json", 1, False), ("p.json", 2, False), ("old.json", 2, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("profile_name", "cut", "bound"), LAUNCHES)
def test_an_embedding_opening_its_stage_is_never_under(table, profile_name, cut, bound):
    """dp 2, ZeRO 2 on gloo, stages [embed] | [blocks, head]: stage 0's peak is the table's reduce-scatter (its
    gradient, the reduce-scatter input, gloo's clone, the output), charged exactly from either profile (from the old
    one, before: 8,192 B under). [embed, blocks.0] | [blocks.1, head]: stage 0's peak is blocks.0's residual add in a
    forward, its all-gather output live (before: 256 B under), exact from the recorded forward transient."""
    import hashlib

    from planner.cost import costmodel
    from planner.cost.assembly import with_predictions
    from planner.runtime.launcher import run_plan
    from planner.schema import StagePlan

    solved = io.load_plan(table / "plan.yaml")
    profile = io.load_profile(table / profile_name)
    names = [layer.name for layer in profile.layers]
    stages = [StagePlan(index=0, layers=names[:cut]), StagePlan(index=1, layers=names[cut:])]
    pinned = solved.profile.model_copy(update={
        "file": profile_name, "sha256": hashlib.sha256((table / profile_name).read_bytes()).hexdigest()})
    plan = solved.model_copy(update={"profile": pinned, "stages": with_predictions(
        stages, costmodel.evaluate(stages, profile, solved.setup))})
    path = table / f"cut{cut}-{profile_name}.yaml"
    io.save_plan(plan, path)
    report = run_plan(io.load_plan(path), plan_file=path, steps=1, warmup_steps=1)
    first = report.stages[0]
    # an older profile's forward moment left as it was: 256 B under (left alone, §67.embedzero)
    assert first.predicted.peak_bytes - first.measured.peak_bytes == (-256 if bound else 0)


def test_the_tracker_is_told_zero_ones_local_optimizer():
    """ZeroRedundancyOptimizer's partition state lives in its local optimizer (`optim`), its own `state` empty, the
    one MemTracker reads: the rank tells the tracker both (before, a ZeRO 1 stage measured without any optimizer
    state: OLMo 2 tiny's stage 1 10,560,784 B below ZeRO 0's, 2.9-5.3 MB 'over'); an offloaded local optimizer's
    host copies stay untold, as static_bytes counts them."""
    from types import SimpleNamespace

    import torch

    from planner.runtime.offload import OffloadOptimizer
    from planner.runtime.worker import _Rank

    weight = torch.nn.Parameter(torch.zeros(2))
    local = torch.optim.Adam([weight])
    rank = SimpleNamespace(module=None, optimizer=SimpleNamespace(optim=local), inputs=None, targets=None, stages=[])
    assert any(item is local for item in _Rank.held_before_step(rank))
    offloaded = OffloadOptimizer([weight], optimizer="adam")
    rank.optimizer = SimpleNamespace(optim=offloaded)
    assert not any(item is offloaded for item in _Rank.held_before_step(rank))
