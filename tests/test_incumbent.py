"""The heuristic start for the MILP: feasible, close to the optimum, never trusted blindly."""

import itertools

import pytest

from planner.cost import costmodel
from planner.models import synthetic
from planner.schema import TrainSetup
from planner.solve import baselines, incumbent, search

MIB = 2**20


def interesting(profile, stages, fraction=0.4):
    roomy = TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1, mem_caps_bytes=[2**50] * stages)
    need = {name: max(costmodel.evaluate(fn(profile, roomy), profile, roomy).peak_bytes_per_stage)
            for name, fn in (("full", baselines.full_checkpointing), ("none", baselines.no_checkpointing))}
    cap = int(need["full"] + fraction * (need["none"] - need["full"]))
    return roomy.model_copy(update={"mem_caps_bytes": [cap] * stages})


def test_greedy_checkpoints_fit_or_say_none():
    profile = synthetic.heterogeneous(6, seed=3)
    layers = costmodel.layer_costs(profile)
    setup = interesting(profile, 2)
    for start, end in itertools.combinations(range(7), 2):
        flags = incumbent.greedy_checkpoints(layers[start:end], stage=0, profile=profile, setup=setup)
        everything = costmodel.stage_cost(layers[start:end], [True] * (end - start), stage=0, profile=profile, setup=setup)
        if flags is None:
            assert not everything.fits  # none only when even checkpointing all does not fit
        else:
            assert costmodel.stage_cost(layers[start:end], flags, stage=0, profile=profile, setup=setup).fits


@pytest.mark.parametrize("seed", range(4))
def test_heuristic_plan_is_feasible_and_near_the_optimum(seed):
    profile = synthetic.heterogeneous(24, seed=seed)
    setup = interesting(profile, 4)
    found = incumbent.heuristic_plan(profile, setup)
    cost = costmodel.evaluate(found, profile, setup)
    assert cost.feasible
    optimum = search.plan(profile, setup, mip_gap=1e-6).cost.iteration_ms
    assert optimum <= cost.iteration_ms <= optimum * 1.05  # a start, not the answer: close is what matters


def test_heuristic_returns_none_when_nothing_fits():
    profile = synthetic.heterogeneous(8, seed=1)
    setup = interesting(profile, 2).model_copy(update={"mem_caps_bytes": [MIB, MIB]})
    assert incumbent.heuristic_plan(profile, setup) is None
