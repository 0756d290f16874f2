"""The chunked solvers' linear time reads the sends a runtime runs beside the compute as evaluate does
(stagesends: Megatron-core's interleaved overlap_p2p_comm; docs/framework-facts.md §214-§218): the rank does not
wait for a steady-state send, it does for its warm-up forwards' (chunked.chunked_linear_ms, milp_ranks._chunked_time)."""

import itertools

import pytest

from planner.cost import costmodel, stagesends
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup
from planner.solve import milp

# six layers, F as listed, B 2·F, each output 1 or 8 MiB over a 2 GB/s pipeline link (0.52 or 4.19 ms a send)
FWD_MS = [0.97, 0.64, 1.5, 0.77, 1.19, 1.06]
OUT_MIB = [8, 1, 8, 8, 1, 1]


def _profile():
    layers = [layer(f"l{i}", f"L{i}", fwd_ms=f, act_mib=1, input_mib=OUT_MIB[i - 1] if i else 1, output_mib=out,
                    param_count=1000) for i, (f, out) in enumerate(zip(FWD_MS, OUT_MIB))]
    return profile_of(layers)


def _setup(runtime: str = "megatron", version: str | None = "92c8482e") -> TrainSetup:
    # megatron-core 92c8482e runs both sends beside the compute (RuntimeFacts.stage_sends_beside "both")
    return TrainSetup(stages=2, chunks=2, schedule="interleaved-1F1B", microbatches=4, micro_batch_size=1,
                      mem_caps_bytes=[2**50] * 2, runtime=runtime, runtime_version=version,
                      comm={"pp_gb_per_s": 2.0, "pp_latency_ms": 0.0})


def _linear_with_sends_in_the_passes(ranks, profile, setup) -> float:
    """The linear time as the solvers had it: every send inside its stage's passes, M·Σ a rank's stages'
    busy + (P - 1)·the slowest stage + the slowest step."""
    order = costmodel.schedule_of(setup)
    view = costmodel.stages_view(setup, order)
    costs = {c.name: c for c in costmodel.layer_costs(profile)}
    busy, steps = [], []
    for k, stage in enumerate(costmodel.pipeline_stages(ranks, setup)):
        layers = [costs[name] for name in stage.layers]
        sums = costmodel.stage_sums(layers, costmodel.option_indices(stage, layers), stage=k, profile=profile,
                                    setup=view)
        busy.append(sums.busy_ms)
        steps.append(sums.step_ms)
    rank_stages = [order.stages_of(r) for r in range(order.num_ranks)]
    return (max(setup.pipeline.microbatches * sum(busy[k] for k in mine) for mine in rank_stages)
            + (order.num_ranks - 1) * max(busy) + max(sum(steps[k] for k in mine) for mine in rank_stages))


def _plans(profile, setup):
    for cuts in itertools.combinations(range(1, len(FWD_MS)), 3):
        yield cuts, costmodel.ranks_of(costmodel.split_to_stages([0, *cuts], [0] * len(FWD_MS), profile), setup)


def test_sends_beside_the_compute_pick_a_plan_evaluate_scores_faster():
    """Every split of the six layers into 2 ranks x 2 chunks, scored three ways. Counting every send in
    the passes picks cuts (2, 4, 5), which evaluate scores 60.15 ms; the linear time with the sends
    beside picks (2, 3, 5): 58.38 ms, evaluate's fastest of all ten. The MILP reaches the new minimum."""
    profile, setup = _profile(), _setup()
    rows = [(cuts, _linear_with_sends_in_the_passes(ranks, profile, setup),
             costmodel.chunked_linear_ms(ranks, profile, setup), costmodel.evaluate(ranks, profile, setup).iteration_ms)
            for cuts, ranks in _plans(profile, setup)]
    old, new, fastest = (min(rows, key=lambda row: row[i]) for i in (1, 2, 3))
    assert (old[0], new[0]) == ((2, 4, 5), (2, 3, 5))
    assert new[3] == fastest[3] < old[3]
    assert (old[3], new[3]) == pytest.approx((60.154, 58.384), abs=1e-3)
    problem = milp.build_problem(profile, setup)
    assert milp.solve(problem, mip_gap=0.0, threads=1).objective == pytest.approx(new[2], rel=1e-6)
    chosen = milp.extract_plan(problem)
    assert costmodel.chunked_linear_ms(chosen, profile, setup) == pytest.approx(new[2], rel=1e-9)


def test_a_rank_waits_for_its_warmup_sends_only():
    """Rank 0 of 2 x 2 stages, M 4: its warm-up is (P - 1 - 0)·2 + (V - 1)·P = 4 forwards (stage 0's
    microbatches 0, 1 and stage 2's 0, 1), each sent to rank 1; rank 1's 2 (stage 1's 0, 1), each sent back
    to rank 0. The rank's work in the linear time: M·(busy less the sends beside) + those sends."""
    profile, setup = _profile(), _setup()
    order = costmodel.schedule_of(setup)
    assert stagesends.warmup_sends(order) == [{0: 2, 2: 2}, {1: 2}]
    # where the runtime runs no send beside (torch's, ckplan's), nothing moves: the linear time is the old one
    plain = _setup("ckplan", None)
    for _, ranks in _plans(profile, plain):
        assert costmodel.chunked_linear_ms(ranks, profile, plain) == \
            pytest.approx(_linear_with_sends_in_the_passes(ranks, profile, plain), rel=1e-12)
