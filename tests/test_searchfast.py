"""The search's bounds without repeated work (docs/published-runs.md §43.searchfast): a layer row that does not read
its recompute option is evaluated once for every option (termvalues.py, read from the row's code), the experts'
setup is made once a setup (expertsetup.py), the replay's relaxed caps once a setup, not once a stage. Each held
against the direct evaluation: the rows' values, every quantity's per-option sums to the bit, the bounds (and the
memory bound alone, which the search asks first of an EP configuration on the EP-1 profile), and a whole search's
ranking and counts."""

from __future__ import annotations

import functools
import json

from fixtures.cli import run_ok
from test_search_ep import CONFIG, H100, REF, TINY

from planner.cost import costmodel, dataparallel, expertsetup, termvalues
from planner.profiler.analytic import Shape, analytic_profile
from planner.solve import bounds as bounds_mod
from planner.solve import jobsearch
from planner.solve.degrees import Degrees

GiB = 2**30


def _uncached_expert_setup(setup):
    """dataparallel.expert_setup as it was: a fresh validated copy at every call."""
    dp = setup.data_parallel
    if dp.ep == 1:
        return setup
    group = None if dp.shard_group is None else dp.shard_group // dp.ep
    return setup.model_copy(update={"dp": dp.dp // dp.ep, "ep": 1, "shard_group": group})


def _direct(monkeypatch):
    """Every row evaluated at every option and every experts' setup made anew: the evaluation before this change."""
    monkeypatch.setattr(termvalues, "reads_option", lambda function: True)
    monkeypatch.setattr(expertsetup, "made", _uncached_expert_setup)
    whole = bounds_mod.setup_bounds  # the search's first bound of an EP configuration, timed as well
    monkeypatch.setattr(bounds_mod, "setup_bounds", lambda profile, setup, layers=None, **_: whole(profile, setup, layers))


@functools.cache
def _profile(ep: int, mbs: int = 1):
    return analytic_profile(TINY, Shape(seq_len=1024, micro_batch_size=mbs, ep=ep), gpu=H100, model=REF)


# a few configurations of 8 GPUs that differ in what the rows read: pipeline, replicas, ZeRO and its group, the
# experts' parallelism, the schedule and its chunks, the runtime
DEGREES = [Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=1, zero=0, ep=1),
           Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=1, zero=3, ep=4),
           Degrees(tp=1, sp=False, pp=2, dp=4, micro_batch_size=1, microbatches=4, zero=1, ep=2),
           Degrees(tp=1, sp=False, pp=2, dp=4, micro_batch_size=1, microbatches=4, zero=3, shard_group=2, ep=2),
           Degrees(tp=1, sp=False, pp=2, dp=4, micro_batch_size=1, microbatches=4, schedule="interleaved-1F1B",
                   chunks=2, zero=0, ep=4),
           Degrees(tp=1, sp=False, pp=4, dp=2, micro_batch_size=1, microbatches=8, zero=2, ep=2)]
RUNTIMES = [{}, {"runtime": "megatron", "training": {"runtime_version": "92c8482e"}}]


def _cases():
    for degrees in DEGREES:
        for runtime in RUNTIMES:
            profile = _profile(degrees.ep)
            options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8, **runtime)
            setup = jobsearch.job_setup(profile, degrees, options)
            of_layer = costmodel.Context(profile, costmodel.stages_view(setup, costmodel.schedule_of(setup)))
            yield profile, setup, of_layer


def test_reads_option_is_read_from_the_rows_code():
    """A row names its option or not; where it cannot be told (an inner function holding it, locals(), *args, a
    partial, a builtin) it counts as reading it."""
    reads = termvalues.reads_option
    assert reads(lambda layer, ckpt, ctx: layer + ckpt)
    assert reads(lambda layer, ckpt, ctx: int(ckpt) and layer)
    assert not reads(lambda layer, ckpt, ctx: layer + ctx)
    assert reads(lambda layer, ckpt, ctx: (lambda: ckpt)())
    assert reads(lambda layer, ckpt, ctx: locals())
    assert reads(lambda *args: args[1])
    assert reads(functools.partial(lambda a, layer, ckpt, ctx: a, 1))
    assert reads(max)
    # the cost model's own rows: the forward/backward time reads it, the optimizer step's reduction does not
    rows = {term.name: term for term in costmodel.TERMS}
    assert reads(rows["forward, backward, recompute"].value)
    assert not reads(rows["optimizer step, gradient reduction, weight gathers, tied sums"].value)


def _as_cpython_313(instructions):
    """The instructions as CPython 3.13 emits them: two LOAD_FASTs in a row one LOAD_FAST_LOAD_FAST, whose argval
    dis gives as the pair of names (Lib/dis.py; docs/framework-facts.md §656)."""
    merged = []
    for instruction in instructions:
        if merged and instruction.opname == merged[-1].opname == "LOAD_FAST":
            merged[-1] = merged[-1]._replace(opname="LOAD_FAST_LOAD_FAST", argval=(merged[-1].argval, instruction.argval))
        else:
            merged.append(instruction)
    return merged


def test_an_option_named_in_a_pair_of_loads_is_read(monkeypatch):
    """`f(layer, ckpt)` loads both in one instruction from CPython 3.13 on: the option is read there too."""
    import dis

    plain = dis.get_instructions
    monkeypatch.setattr(dis, "get_instructions", lambda code: _as_cpython_313(plain(code)))

    def reading(layer, ckpt, ctx):
        return max(layer, ckpt)

    def not_reading(layer, ckpt, ctx):
        return max(layer, ctx)

    assert any(i.opname == "LOAD_FAST_LOAD_FAST" for i in dis.get_instructions(reading.__code__))
    assert termvalues.reads_option(reading) and not termvalues.reads_option(not_reading)


def test_a_row_that_does_not_read_its_option_gives_one_value_under_each():
    """Brute force over every layer row the code says ignores its option, every layer, six configurations and
    two runtimes: the same value at every option."""
    free = [term for term in costmodel.TERMS if term.where == "layer" and not termvalues.reads_option(term.value)]
    assert len(free) > 10
    for profile, _setup, ctx in _cases():
        for layer, _count in bounds_mod.kinds(profile):
            for term in free:
                values = [term.value(layer, option, ctx) for option in range(len(layer.options))]
                assert values == [values[0]] * len(values), term.name


def test_layer_values_are_layer_value_to_the_bit():
    for profile, _setup, ctx in _cases():
        for layer, _count in bounds_mod.kinds(profile):
            options = range(len(layer.options))
            for quantity in costmodel.declared():
                assert termvalues.layer_values(quantity, layer, options, ctx) == \
                    [costmodel.layer_value(quantity, layer, option, ctx) for option in options], quantity


def test_the_experts_setup_is_made_once_a_setup_and_anew_once_it_changes():
    profile = _profile(4)
    setup = jobsearch.job_setup(profile, DEGREES[1], jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8))
    first = dataparallel.expert_setup(setup)
    assert dataparallel.expert_setup(setup) is first and first == _uncached_expert_setup(setup)
    assert (first.data_parallel.dp, first.data_parallel.ep, first.data_parallel.zero) == (2, 1, 3)
    setup.data_parallel.zero = 1  # changed in place (tests do): a new copy of the new value
    again = dataparallel.expert_setup(setup)
    assert again is not first and again == _uncached_expert_setup(setup) and again.data_parallel.zero == 1
    twin = setup.model_copy(deep=True)  # an equal setup, another object: its own copy, equal
    assert dataparallel.expert_setup(twin) == again
    plain = jobsearch.job_setup(profile, DEGREES[0], jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8))
    assert dataparallel.expert_setup(plain) is plain


def test_the_bounds_are_the_direct_evaluations(monkeypatch):
    cases = list(_cases())
    found = [bounds_mod.setup_bounds(profile, setup) for profile, setup, _ in cases]
    # the memory bound alone (the search's first look at an EP configuration, on the EP-1 profile): the same fields
    for (profile, setup, _), timed in zip(cases, found):
        alone = bounds_mod.setup_bounds(profile, setup, timed=False)
        assert (alone.static_bytes, alone.limit_bytes) == (timed.static_bytes, timed.limit_bytes)
        assert alone.time_ms != alone.time_ms  # nan: not a bound to solve by
    _direct(monkeypatch)
    assert found == [bounds_mod.setup_bounds(profile, setup) for profile, setup, _ in cases]


def test_a_search_ranks_alike_with_and_without_the_reuse(tmp_path, monkeypatch):
    """A tiny Mixtral-style job over 8 H100s under Megatron-LM's record (every EP, ZeRO and pipeline the degrees
    allow, interleaved too):
    the whole JSON, its ranking (degrees, steps, bytes, plans) and its counts, equal to the direct evaluation's."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))

    def searched(name):
        result = run_ok("search", "--arch-config", config, "--gpus", "8", "--global-batch", "16", "--seq-len",
                        "1024", "--micro-batch-sizes", "1,2", "--schedules", "1F1B,interleaved-1F1B", "--top", "6",
                        "--runtime", "megatron", "--json", "--out", tmp_path / f"{name}.yaml")
        data = json.loads(result.stdout)
        data["counts"].pop("wall_s")
        # under the command's --time-limit the solves interleave with the enumeration by the wall clock
        # (searchqueue.py, §43.searchorder, §44.searchbb): how many ran before the bar fell, and so how many the bound
        # pruned or a share stopped, follow the load; the ranking and every other count do not
        for clocked in ("solved", "solved_without_plan", "solved_early", "pruned_time", "pruned_bubble", "deferred"):
            data["counts"].pop(clocked)
        data.pop("plan")
        return data

    now = searched("now")
    _direct(monkeypatch)
    before = searched("before")
    assert len(now["ranked"]) == 6
    assert now == before
