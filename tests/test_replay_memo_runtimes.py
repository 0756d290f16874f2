"""FSDP2's, Megatron-LM's (one chunk a rank or several), DeepSpeed's and Megatron-FSDP's replays remembered by
everything they read (planner/cost/replay_memo.py): a figure remembered is the figure made afresh, over random
plans, and a change to any input misses the memo."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel, replay_memo, reserve_megatron, reserve_megatron_chunks
from planner.models.synthetic import uniform_blocks
from planner.schema import AllocRecord, DeviceInfo, StagePlan, TrainSetup

MIB = 2**20
GIB = 2**30
RECORD = AllocRecord(forward=[8 * MIB, 4 * MIB, -2, 16 * MIB], backward=[6 * MIB, -1], output=3, input_grad=4,
                     params=[12 * MIB])


def _profile(layers: int = 6):
    base = uniform_blocks(layers)
    made = [layer.model_copy(update={"alloc_records": {"none": RECORD, "full": RECORD}}) for layer in base.layers]
    return base.model_copy(update={"layers": made, "device": DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3"),
                                   "assumptions": {**base.assumptions, "gpu": "h100"}})


def _setup(stages: int, **fields) -> TrainSetup:
    return TrainSetup(**({"stages": stages, "microbatches": 4, "micro_batch_size": 1, "precision": "bf16-mixed",
                          "mem_caps_bytes": [80 * GIB] * stages} | fields))


ROUTES = {  # each route's setup, as replayed_reserve takes it
    "fsdp2": _setup(2, runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3, zero_gather="per-iteration"),
    "megatron": _setup(2, runtime="megatron", dp=2, zero=1),
    "megatron-chunks": _setup(2, runtime="megatron", dp=2, zero=1, schedule="interleaved-1F1B", chunks=2),
    "megatron-fsdp": _setup(1, runtime="megatron", dp=4, zero=3, fsdp_double_buffer=True, microbatches=2),
    "deepspeed": _setup(1, runtime="deepspeed", dp=4, zero=3, microbatches=2),
}


def _plans(profile, setup, count: int, seed: int = 5):
    """Random splits and options; several chunks a rank: virtual stage k on rank k mod P, in order."""
    rng = random.Random(seed)
    layers, ranks, chunks = len(profile.layers), setup.pipeline.stages, setup.pipeline.chunks
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, layers), ranks * chunks - 1))
        virtual = costmodel.split_to_stages([0, *cuts], [rng.random() < 0.4 for _ in range(layers)], profile)
        if chunks == 1:
            yield virtual
            continue
        yield [StagePlan(index=rank, layers=[n for k in virtual[rank::ranks] for n in k.layers],
                         chunks=[k.layers for k in virtual[rank::ranks]],
                         recompute={n: o for k in virtual[rank::ranks] for n, o in k.recompute.items()})
               for rank in range(ranks)]


def _figures(cost):
    return [(c.reserved_bytes, c.reserved_by, c.cap_replay, c.replayed_reserved_bytes, c.uncapped_reserved_bytes)
            for c in cost.stages]


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    """DeepSpeed's replay reads decoder blocks it knows: an analytic GPT-2 of four (test_dsreplay's, narrower)."""
    folder = tmp_path_factory.mktemp("memo")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 512,
                                  "n_positions": 128, "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", 128, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return io.load_profile(folder / "p.json")


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_remembered_replay_is_the_fresh_one(route, gpt_profile):
    """Every plan evaluated twice with the memo kept (the second all remembered), and once with it emptied before
    each plan: the same figures, every stage replayed."""
    profile, setup = gpt_profile if route == "deepspeed" else _profile(), ROUTES[route]
    replay_memo.forget()
    plans = list(_plans(profile, setup, 6))
    kept = [_figures(costmodel.evaluate(p, profile, setup)) for p in plans]
    assert {by for figures in kept for _, by, *_ in figures} == {"replay"}
    again = [_figures(costmodel.evaluate(p, profile, setup)) for p in plans]
    fresh = []
    for p in plans:
        replay_memo.forget()
        fresh.append(_figures(costmodel.evaluate(p, profile, setup)))
    assert kept == again == fresh


def test_every_input_is_in_the_key():
    """The Megatron-LM route's key for stage 1 of a plan, against the same with one input changed: the plan's
    options, its cost, its place, the profile (a field, a layer replaced, a copy), the setup, the route, the cap.
    Each misses, and a miss replays."""
    profile, setup = _profile(), ROUTES["megatron"]
    plan = costmodel.split_to_stages([0, 3], [False] * 6, profile)
    cost = costmodel.evaluate(plan, profile, setup)
    stage, stage_cost = plan[1], cost.stages[1]

    def key(stage=stage, stage_cost=stage_cost, index=1, profile=profile, setup=setup,
            route=reserve_megatron.replay_stage):
        return replay_memo.stage_key(route, stage, stage_cost, index, profile=profile, setup=setup)

    base = key()
    assert key() == base  # the same inputs, the same key
    assert key(stage=stage.model_copy(update={"predicted": None})) == base  # what no replay reads
    changed = [
        key(stage=costmodel.split_to_stages([0, 3], [False] * 4 + [True, False], profile)[1]),
        key(stage_cost=dataclasses.replace(stage_cost, buffer_bytes=stage_cost.buffer_bytes + 1)),
        key(index=0),
        key(profile=profile.model_copy(update={"loss_bytes": profile.loss_bytes + 1})),
        key(profile=profile.model_copy(update={"layers": [*profile.layers[:5], profile.layers[5].model_copy()]})),
        key(profile=profile.model_copy()),
        key(setup=setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"microbatches": 8})})),
        key(route=reserve_megatron_chunks.replay_rank),
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    played = []
    replay_memo.forget()
    for cap in (None, 60 * GIB, None):  # the cap is the last part of the memo's key
        replay_memo.remembered(base + (cap,), lambda cap=cap: played.append(cap))
    assert played == [None, 60 * GIB]



@pytest.mark.parametrize("route", [r for r in ROUTES if r != "deepspeed"])
def test_a_memo_kept_across_differing_inputs_gives_each_its_fresh_figure(route):
    """A brute force over inputs that differ where a stage's cost does not show it, sharing one memo: each stage's
    cost (as evaluate made it) replayed on the profile and on a copy with one layer's allocation record changed,
    under the route's setup with the allocator's expandable segments on and off, and under a cap its replay fits,
    one it retries under (torch's release) and one it fails (capped_reserve: fits, retried, oom); every input twice
    with the memo kept, then each with it emptied first. Every figure kept is the fresh one: a key that left out
    the setup, or the profile's layers, hands one input another's figure here (the stage's cost is the same)."""
    import itertools

    from planner.cost import replayed_reserve

    base = _profile()
    other = RECORD.model_copy(update={"forward": [8 * MIB, 4 * MIB, -2, 64 * MIB]})
    changed = base.layers[3].model_copy(update={"alloc_records": {"none": other, "full": other}})
    profiles = [base, base.model_copy(update={"layers": [*base.layers[:3], changed, *base.layers[4:]]})]
    setup = ROUTES[route]
    setups = [setup.model_copy(update={"training": setup.training.model_copy(update={"expandable_segments": on})})
              for on in (True, False)]
    inputs = []
    for plan in _plans(base, setup, 3):
        for index, (stage, cost) in enumerate(zip(plan, costmodel.evaluate(plan, base, setup).stages, strict=True)):
            # a cap the replay fits, one just under what the stage needs (torch's release may hold it), one it fails
            for profile, varied, cap in itertools.product(profiles, setups,
                                                          (80 * GIB, cost.device_need_bytes - 64 * MIB, GIB)):
                inputs.append((stage, index, profile, varied, dataclasses.replace(cost, cap_bytes=cap)))

    def replayed(stage, index, profile, varied, cost):
        found = replayed_reserve.with_replayed_reserve(cost, stage, index, profile=profile, setup=varied)
        return found.reserved_bytes, found.cap_replay, found.uncapped_reserved_bytes

    replay_memo.forget()
    kept = [replayed(*one) for one in inputs + inputs]
    fresh = []
    for one in inputs:
        replay_memo.forget()
        fresh.append(replayed(*one))
    assert kept == fresh + fresh
    assert len({figure for figure, *_ in fresh}) > len(inputs) // 6  # the inputs' figures differ, not one figure
    # the three caps reach the replay's verdicts (FSDP2's retries under torch's release just under its need)
    assert {verdict for _, verdict, _ in fresh} == ({"fits", "retried", "oom"} if route == "fsdp2" else {"fits", "oom"})
