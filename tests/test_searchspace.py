"""`ckplan search`'s default space (branch searchspace): interleaved 1F1B at the chunk counts the layers
admit where the runtime's record runs it, solved after every one-chunk configuration; DeepSpeed's
optimizer offload and ds_config knobs under --runtime deepspeed."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run
from test_search import profile_for

from planner.cost import costmodel, runtimes
from planner.models import archs
from planner.solve import jobsearch, search
from planner.solve.deadline import Deadline
from planner.solve.degrees import (
    JobShape,
    chunk_counts,
    default_schedules,
    enumerate_degrees,
    zero_choices,
)

GiB = 2**30
# eight blocks: P x V = 8 virtual stages of one block each at pp 4, V 2, and of two at pp 2, V 2
MINI8 = archs.Arch(name="mini8", hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=8, num_kv_heads=4,
                   vocab_size=32000, tie_word_embeddings=False)


def _job(**given) -> JobShape:
    shape = dict(gpus=4, gpus_per_node=1, global_batch=8, seq_len=2048, num_layers=MINI8.num_layers + 2,
                 num_blocks=MINI8.num_layers, tp_ok=(1,), schedules=("1F1B", "interleaved-1F1B"), chunks=None,
                 micro_batch_sizes=(1,))
    return JobShape(**(shape | given))


def test_the_default_schedules_are_the_runtimes_own():
    """1F1B, and interleaved 1F1B where the record runs it; DeepSpeed's PipelineEngine runs 1F1B alone."""
    assert default_schedules(runtimes.facts("megatron").pipeline_schedules) == ("1F1B", "interleaved-1F1B")
    assert default_schedules(runtimes.facts("torchtitan", "9dec370").pipeline_schedules) == ("1F1B", "interleaved-1F1B")
    assert default_schedules(runtimes.facts("deepspeed").pipeline_schedules) == ("1F1B",)
    assert "DualPipeV" not in runtimes.facts("torchtitan", "9dec370").pipeline_schedules


def test_chunk_counts_the_blocks_admit_by_hand():
    """32 blocks: pp 2 takes V 2, 4, 8, 16 (64 stages would leave some empty); pp 4 V 2, 4, 8; pp 8 V 2, 4;
    pp 16 V 2. 6 blocks at pp 2: V 3 only. Without the blocks, every V whose stages the 10 layers fill."""
    job = _job(num_blocks=32, num_layers=34)
    assert [chunk_counts(job, pp) for pp in (2, 4, 8, 16, 32)] == [(2, 4, 8, 16), (2, 4, 8), (2, 4), (2,), ()]
    assert chunk_counts(_job(num_blocks=6, num_layers=8), 2) == (3,)
    assert chunk_counts(_job(num_blocks=None), 3) == (2, 3)
    assert chunk_counts(_job(chunks=(5,)), 2) == (5,)


def test_the_enumeration_holds_interleaved_at_each_count_by_hand():
    """4 GPUs at TP 1, batch 8 at micro-batch 1: pp 1 (dp 4, M 2), pp 2 (dp 2, M 4), pp 4 (dp 1, M 8); 1F1B on
    each and interleaved at pp 2 (V 2, 4) and pp 4 (V 2), each over every ZeRO stage of its dp."""
    found = enumerate_degrees(_job())
    expected = len(zero_choices(4, 1)) + 3 * len(zero_choices(2, 1)) + 2 * len(zero_choices(1, 1))
    assert len(found) == expected == len(set(found))
    assert sorted({(d.pp, d.chunks) for d in found if d.schedule == "interleaved-1F1B"}) == [(2, 2), (2, 4), (4, 2)]


def test_interleaved_beats_1f1b_and_the_search_finds_it():
    """A tiny job whose data-parallel gradients cross the network (a GPU a node): the fastest configuration is
    pp 2 with interleaved 1F1B, its plan's time is evaluate's, the same degrees under 1F1B are slower by
    evaluate, and the ranking is the brute force's over every configuration, the chunked ones included."""
    job, build = _job(), profile_for(MINI8)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=1)
    outcome = jobsearch.search_job(job, options, build, top=3)
    best = outcome.ranked[0]
    assert (best.degrees.schedule, best.degrees.pp, best.degrees.chunks) == ("interleaved-1F1B", 2, 2)
    cost = costmodel.evaluate(best.stages, best.candidate.profile, best.candidate.setup)
    assert cost.iteration_ms == pytest.approx(best.iteration_ms, rel=1e-12)
    plain = jobsearch.job_setup(best.candidate.profile, best.degrees.__class__(
        **(best.degrees.as_dict() | {"schedule": "1F1B", "chunks": 1})), options)
    one_chunk = search.plan(best.candidate.profile, plain)
    assert one_chunk.cost.iteration_ms > best.iteration_ms
    every = []
    for degrees in enumerate_degrees(job):
        profile = build(degrees.tp, degrees.sp, degrees.micro_batch_size)
        result = search.plan(profile, jobsearch.job_setup(profile, degrees, options))
        if isinstance(result, search.PlanResult):
            every.append(result.cost.iteration_ms)
    assert [s.iteration_ms for s in outcome.ranked] == pytest.approx(sorted(every)[:3], rel=1e-9)


def _solving(monkeypatch) -> list:
    """The candidates search_job solves, in order."""
    solved, real = [], jobsearch.solve_one

    def solve_one(candidate, **keywords):
        solved.append(candidate)
        return real(candidate, **keywords)

    monkeypatch.setattr(jobsearch, "solve_one", solve_one)
    return solved


def test_one_chunk_configurations_are_solved_before_any_chunked_one(monkeypatch):
    solved = _solving(monkeypatch)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=1)
    jobsearch.search_job(_job(), options, profile_for(MINI8), top=3)
    chunks = [c.degrees.chunks for c in solved]
    assert 1 in chunks and 2 in chunks and chunks == sorted(chunks, key=lambda v: v > 1)


def test_the_time_limit_stops_the_chunked_pass(monkeypatch):
    """On a clock of one second a solve: a limit that passes during the first chunked solve leaves the one-chunk
    ranking as without a limit, says the search incomplete with the chunked ones left unsolved, and starts no
    solve past it."""
    options, build = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=1), profile_for(MINI8)
    one_chunk = jobsearch.search_job(_job(schedules=("1F1B",)), options, build, top=3)
    solved = _solving(monkeypatch)
    limit = one_chunk.solved + 0.5
    outcome = jobsearch.search_job(_job(), options, build, top=3, deadline=Deadline(limit, clock=lambda: len(solved)))
    assert [c.degrees.chunks for c in solved[:one_chunk.solved]] == [1] * one_chunk.solved
    assert len(solved) == one_chunk.solved + 1 and solved[-1].degrees.chunks > 1  # none started past the limit
    assert not outcome.complete and outcome.unsolved and all(c.degrees.chunks > 1 for c in outcome.unsolved)
    ranked = [(s.degrees, s.iteration_ms) for s in outcome.ranked if s.degrees.chunks == 1]
    assert ranked == [(s.degrees, s.iteration_ms) for s in one_chunk.ranked][:len(ranked)] and ranked


def test_deepspeed_offload_in_the_space_with_zero_only():
    """Offload is tried beside no offload for ZeRO 1-3, never for ZeRO 0 (DeepSpeed's offload needs a stage)."""
    job = _job(offload_ok=(False, True), schedules=("1F1B",), global_batch=4)
    found = [d for d in enumerate_degrees(job) if d.pp == 1]
    assert sum(d.offload for d in found) == sum(1 for d in found if d.zero and not d.offload)
    assert not any(d.offload and d.zero == 0 for d in found)
    assert "offload" in next(d for d in found if d.offload).label()


def _search(*args):
    return run("search", "--arch", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--seq-len", "2048", "--top", "3",
               *args)


def test_cli_deepspeed_knob_refused_off_deepspeed(tmp_path):
    result = _search("--reduce-bucket-size", "9e7", "--out", str(tmp_path / "p.yaml"))
    assert result.exit_code == 1 and "--reduce-bucket-size is DeepSpeed's setting" in result.output
    assert "Traceback" not in result.output


def test_cli_deepspeed_search_tries_offload_and_takes_the_knobs(tmp_path):
    """--runtime deepspeed: the space holds offload (the plan says which), the buckets given reach the plan."""
    out = tmp_path / "p.yaml"
    result = _search("--runtime", "deepspeed", "--micro-batch-sizes", "1", "--reduce-bucket-size", "9e7",
                     "--stage3-max-live-parameters", "3e9", "--json", "--out", str(out))
    assert result.exit_code == 0, result.output
    ranked = json.loads(result.stdout)["ranked"]
    assert ranked and all("offload" in row["degrees"] for row in ranked)
    from planner import io

    plan = io.load_plan(out)
    assert plan.setup.data_parallel.reduce_bucket_size == 90_000_000
    assert plan.setup.data_parallel.stage3_max_live_parameters == 3_000_000_000
    assert plan.setup.data_parallel.offload == ranked[0]["degrees"]["offload"]
