"""The least need of planner/solve/staticneed.py is a true lower bound: over every contiguous split
and every checkpoint set of a tiny profile, no stage's allocated peak under evaluate() is below its
range's need, and the split the bound picks needs no more (against its limit) than the best split
found by brute force; a refusal never meets a plan evaluate() admits; `solve` says it before any
search."""

from __future__ import annotations

import itertools

import pytest
from fixtures.cli import run
from test_search import profile_for

from planner import io
from planner.cost import costmodel
from planner.models import archs
from planner.models.synthetic import heterogeneous, layer, profile_of
from planner.schema import StagePlan, TrainSetup
from planner.solve import baselines, search, staticneed

GiB = 2**30
TINY = archs.Arch(name="tiny", hidden_size=256, intermediate_size=704, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=4000, tie_word_embeddings=False)


def _choices(layer) -> list[str]:
    return sorted({o.name for o in layer.recompute_options} | {"none", "full"})


def _least_peaks(profile, setup) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(stage, start, end) -> (the least allocated peak of any checkpoint set, the limit), by brute force: the
    stage's every option vector, the other stages at none, each plan scored by evaluate()."""
    names = [layer.name for layer in profile.layers]
    stages, num = setup.pipeline.stages, len(names)
    least = {}
    for cuts in itertools.combinations(range(1, num), stages - 1):
        edges = [0, *cuts, num]
        for s in range(stages):
            i, j = edges[s], edges[s + 1]
            if (s, i, j) in least:
                continue
            best = None
            for picks in itertools.product(*(_choices(one) for one in profile.layers[i:j])):
                plan = [StagePlan(index=t, layers=names[edges[t]:edges[t + 1]]) for t in range(stages)]
                plan[s] = StagePlan(index=s, layers=names[i:j],
                                    recompute={n: p for n, p in zip(names[i:j], picks) if p != "none"})
                cost = costmodel.evaluate(plan, profile, setup).stages[s]
                if best is None or cost.peak_bytes < best[0]:
                    best = (cost.peak_bytes, cost.allocated_limit_bytes)
            least[s, i, j] = best
    return least


SETUPS = [  # (profile, setup)
    (lambda: heterogeneous(5), dict(stages=2, microbatches=4, schedule="1F1B")),
    (lambda: heterogeneous(5), dict(stages=3, microbatches=2, schedule="GPipe")),
    (lambda: profile_for(TINY, seq_len=512)(1, False, 1), dict(stages=2, microbatches=4, schedule="1F1B",
                                                               precision="bf16-mixed")),
    (lambda: profile_for(TINY, seq_len=512)(1, False, 1), dict(stages=2, microbatches=4, schedule="1F1B",
                                                               precision="bf16-mixed", runtime="torchtitan", dp=2,
                                                               zero=3, shard_gb_per_s=100.0)),
    # FSDP2 keeping weights and gradients whole through the microbatches: gradients allocated at the first backward
    (lambda: profile_for(TINY, seq_len=512)(1, False, 1), dict(stages=2, microbatches=4, schedule="1F1B",
                                                               precision="bf16-mixed", runtime="torchtitan", dp=2,
                                                               zero=3, zero_gather="per-iteration",
                                                               shard_gb_per_s=100.0)),
    (lambda: profile_for(TINY, seq_len=512)(1, False, 1), dict(stages=2, microbatches=2, schedule="GPipe",
                                                               precision="bf16-mixed", runtime="torchtitan", dp=2,
                                                               zero=3, zero_gather="per-iteration",
                                                               shard_gb_per_s=100.0)),
    (lambda: profile_for(TINY, seq_len=512)(1, False, 1), dict(stages=3, microbatches=8, schedule="1F1B",
                                                               precision="bf16-mixed", runtime="megatron", dp=2,
                                                               zero=1, shard_gb_per_s=100.0, replica_gb_per_s=50.0)),
    # ckplan's FSDP2 beside GPipe, no forward after a backward: a stage's shards absent until its first
    # reduce-scatter, its transient below its loss scratch (gathered.stage_floor)
    (lambda: heterogeneous(5), dict(stages=2, microbatches=2, schedule="GPipe", dp=4, zero=2)),
    (lambda: heterogeneous(5), dict(stages=2, microbatches=3, schedule="GPipe", dp=4, zero=3)),
]


@pytest.mark.parametrize("make, options", SETUPS, ids=["cpu-1F1B", "cpu-GPipe", "cuda-1F1B", "titan-fsdp", "titan-lazy-1F1B",
                                                       "titan-lazy-GPipe", "megatron", "ckplan-fsdp2-zero2",
                                                       "ckplan-fsdp2-zero3"])
def test_the_need_is_below_every_checkpoint_set_of_every_split(make, options):
    profile = make()
    setup = TrainSetup(micro_batch_size=1, mem_caps_bytes=[80 * GiB] * options["stages"], **options)
    chain = staticneed.chain_of(profile, setup)
    needs = staticneed.range_needs(chain)
    limits = [stage.cap_bytes for stage in chain.stages]
    least = _least_peaks(profile, setup)
    for (s, i, j), (peak, limit) in least.items():
        assert needs.at(s, i, j).total <= peak + 1, ((s, i, j), needs.at(s, i, j), peak)  # the peak rounds to bytes
        assert limits[s] >= limit  # the rows every plan evaluate admits meets, at least
    # the split it picks is the least against the limits: no split's least need is lower
    found = staticneed.least_need(profile, setup, chain)
    stages, num = setup.pipeline.stages, len(profile.layers)
    best = min(max(least[s, e[s], e[s + 1]][0] / limits[s] for s in range(stages))
               for e in ([0, *cuts, num] for cuts in itertools.combinations(range(1, num), stages - 1)))
    assert found.need_bytes / found.limit_bytes <= best * (1 + 1e-9) + 2 / found.limit_bytes


@pytest.mark.parametrize("make, options", SETUPS[:3], ids=["cpu-1F1B", "cpu-GPipe", "cuda-1F1B"])
def test_a_refusal_never_meets_a_plan_that_fits(make, options):
    """At caps from far below to above the least any plan needs: where the bound refuses, the
    search finds nothing either; at the least need itself it does not refuse."""
    profile = make()
    stages = options["stages"]
    need = None
    for cap in [2**20, 2**24, 2**26, 2**28, 2**30, 4 * GiB]:
        setup = TrainSetup(micro_batch_size=1, mem_caps_bytes=[cap] * stages, **options)
        refused = search.static_refusal(profile, setup)
        found = search.plan(profile, setup)
        if refused is not None:
            assert isinstance(found, search.NoFit) and found.status == "infeasible", cap
        elif need is None and isinstance(found, search.PlanResult):
            need = cap
    assert need is not None  # some cap fits, and it was not refused


def test_the_need_by_hand():
    """Two stages of two fp32 Adam layers of 1000 parameters (16 bytes each: weights, gradients, two
    moments), 10 MiB of activations of which 1 MiB input: the leanest option keeps the input alone, so
    each stage needs in-flight x 2 MiB beside what it holds; held as evaluate holds it."""
    profile = profile_of([layer(f"l{i}", "Block", fwd_ms=1.0, act_mib=10, input_mib=1, output_mib=1,
                                param_count=1000, transient_mib=0.5) for i in range(4)])
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[GiB] * 2)
    needs = staticneed.range_needs(staticneed.chain_of(profile, setup))
    plan = [StagePlan(index=0, layers=["l0", "l1"], checkpointed=["l0", "l1"]),
            StagePlan(index=1, layers=["l2", "l3"], checkpointed=["l2", "l3"])]
    cost = costmodel.evaluate(plan, profile, setup)
    for s, (i, j) in enumerate([(0, 2), (2, 4)]):
        need, stage = needs.at(s, i, j), cost.stages[s]
        assert need.static == stage.static_bytes == 2 * 1000 * 16
        assert need.held == stage.static_bytes + stage.buffer_bytes
        # checkpointed whole, a layer keeps its 1 MiB input: in-flight x 2 MiB, beside the loss scratch
        loss_scratch = staticneed.chain_of(profile, setup).stages[s].loss_scratch_bytes
        assert need.activations == stage.in_flight * 2 * 2**20 + loss_scratch
        assert stage.activation_bytes == stage.in_flight * 2 * 2**20
        assert need.total <= stage.peak_bytes


def test_solve_refuses_before_any_search(tmp_path, monkeypatch):
    """At a cap below the weights and optimizer state of any split, one sentence naming the stage,
    its least need by term and the cap; no baseline scored, no least-memory search run."""
    profile = heterogeneous(5)
    path = tmp_path / "p.json"
    io.save_profile(profile, path)

    def never(*args, **kwargs):
        raise AssertionError("searched")

    monkeypatch.setattr(baselines, "all_baselines", never)
    monkeypatch.setattr(search, "least_memory_plan", never)
    result = run("solve", "--profile", path, "--stages", "2", "--microbatches", "4", "--mem", "100MiB",
                 "--out", tmp_path / "plan.yaml")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: no plan fits the caps, whatever it recomputes") and \
        result.output.count("\n") == 1
    assert "stage 1 needs at least" in result.output or "stage 0 needs at least" in result.output
    assert "weights, grads, optimizer state" in result.output and "its cap of 100 MiB" in result.output
    assert not (tmp_path / "plan.yaml").exists()


def test_no_bound_past_the_deadline_or_past_max_layers():
    """The bound is a shortcut: a deadline already past, or a profile whose (L+1)^2 arrays would be large,
    leaves the verdict to the search."""
    from planner.solve.deadline import Deadline

    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[2**20] * 2)
    small = heterogeneous(5)
    assert search.static_refusal(small, setup) is not None
    assert search.static_refusal(small, setup, Deadline(0.0)) is None
    assert staticneed.least_need(heterogeneous(staticneed.MAX_LAYERS + 1), setup) is None
