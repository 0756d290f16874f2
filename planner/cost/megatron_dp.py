"""Megatron-LM's data-parallel collectives where its code issues them (the runtime record's
ddp_buckets), placed in the schedule's simulation on a stream beside each rank's compute
(schedule_time.SideStream). Read at megatron-core 92c8482e (Megatron-Bridge 00b7660b's) and
Megatron-LM d98e8a64, docs/framework-facts.md §50 (gradients) and §51 (parameters).

Where: schedules of several chunks a rank (interleaved), whose time is their order's simulation
(score.plan_iteration_ms). A schedule in closed form (1F1B, no pipeline), which the solvers' objective
must equal term by term, keeps dataparallel.exposed_comm_ms's per-layer form of the same facts: each
layer's reduction behind its own last backward, under --overlap-param-gather its gather behind its own
forward, none of either without the flags (what it leaves out: the first pipeline rank's last bucket, and
the later ranks' whole-chunk gathers in the pipeline's fill; side_stream below places those too, and
tests/test_megatron_dp.py runs it on 1F1B's order to show them).

Buckets. Each model chunk (a rank's stage) is one DDP module with its own buffer, cut into buckets
of `bucket_params` parameters from its last parameter back (the backward's order), where the
reduction overlaps: --ddp-bucket-size, default max(40M, 1M x the dp·cp ranks); one bucket without
--overlap-grad-reduce, on every pipeline rank but the first, for every chunk but the first, and
for all under --overlap-param-gather-with-optimizer-step (training.py 2504-2515 at d98e8a64). Here
a chunk's parameters are cut as if continuous (Megatron closes a bucket at a tensor's end).

Gradients (§50). Without --overlap-grad-reduce every chunk's reduction runs in the step's
finalize, after the rank's last backward: exposed whole. With it, gradient sync is off but for the
last microbatch (no_sync), and then:
  - one stage a rank (1F1B, or no pipeline): the first pipeline rank's buckets are issued as the
    last backward fills them; the other ranks' one bucket after their last backward (in the bubble);
  - interleaved, --align-grad-reduce (the default): chunk c's reduction is issued after the rank's
    backward `rank` places past chunk c's last one (grad_sync_func, "at the same time across the
    pipeline-parallel group"), those past the end after the last backward; --no-align-grad-reduce:
    each chunk's as its last backward fills its buckets.
Parameters (§51), the distributed optimizer's all-gather after the step. Without
--overlap-param-gather it runs in the step, synchronous (dataparallel.exposed_comm_ms charges it
there). With it:
  - interleaved with --align-param-gather (Megatron-LM's default under interleaving): chunks 0
    and 1 are issued as the step's forward-backward starts, chunk c >= 2 `rank` forwards before
    chunk c - 1's first one; a chunk's first forward waits for its gather (all its buckets at once);
  - otherwise each chunk's first forward issues its first bucket and waits for it, then issues the
    next, which the forward waits for where it reaches that bucket's layers (a chain);
  - --overlap-param-gather-with-optimizer-step: chunk 0's gather is issued inside the optimizer
    step, after chunk 0's own step, beside the other chunks' steps.
The data-parallel group's collectives share one stream, in the order issued; a rank ends when its
compute and that stream do (finalize waits for every reduction).

NCCL's CTAs (nccl_sms.py, docs/framework-facts.md §128): each collective on the stream takes
nccl_sms.collective_shares of the GPU's SMs while it runs (its kind and group as nccl_sms charges them
elsewhere, its bytes the chunk's), and the rank's compute beside it runs at 1 - that share of its rate
(schedule_time.Issue.share): the first order nccl_sms.layer_ms charges where exposed_comm_ms hides the
collectives, here where the simulation overlaps them. A chunk's first bucket on the first rank (the
only one cut in buckets) is taken at the chunk's bytes too: over 40M parameters a bucket holds every
channel either way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import nccl_sms, runtimes, schedule_time, schedules
from planner.cost.dataparallel import collectives_ms, gathers_in_forward, overlaps_comm
from planner.cost.layers import LayerCost
from planner.cost.rules import compute_ms
from planner.cost.schedule_time import Issue, SideStream, StageTimes
from planner.schema import Profile, TrainSetup

# megatron-core's default bucket: max(40M, 1M x the data-parallel ranks) parameters
# (distributed_data_parallel.py 54-60 at 92c8482e; training.py resolve_ddp_bucket_size at d98e8a64)
DEFAULT_BUCKET_PARAMS = 40_000_000
BUCKET_PARAMS_PER_RANK = 1_000_000


@dataclass(frozen=True)
class Bucket:
    """One bucket of a chunk: its reduction and gather (ms), the share of the chunk's backward done when
    its last gradient is (`ready`), and of its forward done before its first parameter is used."""

    reduce_ms: float
    gather_ms: float
    ready: float
    first_use: float


def gathers_overlapped(setup: TrainSetup) -> bool:
    """--overlap-param-gather under the distributed optimizer (ZeRO 1): the gather waited for in the forward."""
    return gathers_in_forward(setup)


def described(setup: TrainSetup) -> str:
    """What the plan assumes of Megatron-LM's DDP, in a sentence."""
    dp, chunked = setup.data_parallel, setup.pipeline.chunks > 1
    said = "" if dp.overlap_grad_reduce is not None else " (the runtime record's default; --no-overlap-grad-reduce)"
    buckets_of = f" in buckets of {bucket_params(setup):,} parameters" if chunked and overlaps_comm(setup) else ""
    parts = [f"reductions overlapped{buckets_of}{said}" if overlaps_comm(setup) else
             "reductions after the last backward, exposed (no --overlap-grad-reduce)"]
    if dp.zero == 1 and gathers_overlapped(setup):
        parts.append("the parameter all-gather waited for in the next forward"
                     + (", the first chunk's beside the optimizer step" if dp.param_gather_with_step else ""))
    elif dp.zero == 1:
        parts.append("the parameter all-gather in the step, exposed (no --overlap-param-gather)")
    parts.append("placed in the schedule's simulation where megatron-core issues them" if chunked else
                 "overlapped ones hidden behind each layer's own compute (one stage a rank)")
    return f"Megatron-LM's DDP: {'; '.join(parts)} (planner/cost/megatron_dp.py)"


def bucket_params(setup: TrainSetup) -> int | None:
    """The parameters of a bucket where a chunk is bucketed; None: one bucket (no overlap)."""
    if not overlaps_comm(setup):
        return None
    ranks = setup.data_parallel.dp * setup.training.context_parallel
    return setup.data_parallel.bucket_params or max(DEFAULT_BUCKET_PARAMS, BUCKET_PARAMS_PER_RANK * ranks)


def buckets(layers: Sequence[LayerCost], setup: TrainSetup, *, size: int | None) -> list[Bucket]:
    """A chunk's buckets in Megatron's order (from its last parameter back), `size` parameters each
    (None: one). A layer's share of each is its parameters' share, its collectives in proportion."""
    costs = [collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                            fp8_count=layer.float8_param_count, frozen=layer.frozen_param_count) for layer in layers]
    fwd = _shares([layer.fwd_ms for layer in layers], layers)
    bwd = _shares([layer.bwd_ms for layer in layers], layers)
    total = sum(layer.param_count for layer in layers)
    if size is None or total <= size:
        return [Bucket(sum(c[1] for c in costs), sum(c[0] for c in costs), 1.0, 0.0)]
    found, reduce, gather, params, done, lowest = [], 0.0, 0.0, 0, 0.0, 0
    for index in reversed(range(len(layers))):
        left = layers[index].param_count
        done += bwd[index]
        while left > 0:
            take = min(left, size - params)
            share = take / layers[index].param_count
            reduce, gather, params, left = reduce + share * costs[index][1], gather + share * costs[index][0], \
                params + take, left - take
            lowest = index
            if params >= size:
                found.append(Bucket(reduce, gather, min(done, 1.0), sum(fwd[:index])))
                reduce, gather, params = 0.0, 0.0, 0
    if params:  # the last bucket, the chunk's first parameters: ready when its backward ends
        found.append(Bucket(reduce, gather, 1.0, sum(fwd[:lowest])))
    return found


def _shares(times: list[float], layers: Sequence[LayerCost]) -> list[float]:
    """Each layer's share of a pass (by its parameters where the profile times none)."""
    total = sum(times)
    if total <= 0:
        times, total = [float(layer.param_count) for layer in layers], float(sum(layer.param_count for layer in layers))
    return [t / total for t in times] if total > 0 else [1.0 / max(len(layers), 1)] * len(layers)


def chain_extension_ms(groups: Sequence[Bucket], forward_ms: float) -> float:
    """How much longer a chunk's first forward runs waiting for its buckets' gathers after the first
    one (waited before it starts): each issued when the wait for the one before returns, on one
    stream, waited for where the forward reaches its first parameter. `groups` in forward order."""
    wall = comm = 0.0  # since the first bucket's wait returned
    for before, group in zip(groups, groups[1:]):
        comm = max(comm, wall) + group.gather_ms
        wall = max(wall + (group.first_use - before.first_use) * forward_ms, comm)
    reached = groups[-1].first_use * forward_ms if groups else 0.0
    return wall - reached


def edge_exposed_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """Under a schedule in closed form (dataparallel.exposed_comm_ms's per-layer form, which hides each layer's
    reduction behind its own last backward and its overlapped gather behind its own forward): what the model's
    first layer exposes beyond that. Its parameters are Megatron's last bucket of the first pipeline rank (cut from
    the chunk's last parameter back), issued when the last backward ends and waited for by finalize, and its
    first gathered bucket, waited for before the first forward (§50, §51): exposed whole. The bucket is taken as
    the first layer (the embedding, one tensor above the default bucket at GPT's and LLaMA's sizes: the leftover
    parameters Megatron adds to it are not)."""
    dp = setup.data_parallel
    if not (runtimes.of(setup.training).ddp_buckets and dp.dp > 1 and dp.zero <= 1 and setup.pipeline.chunks == 1
            and layer.name == profile.layers[0].name):
        return 0.0
    gather, reduce = collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                                    fp8_count=layer.float8_param_count, frozen=layer.frozen_param_count)
    hidden = min(reduce, compute_ms(layer.bwd_ms, setup.time)) if overlaps_comm(setup) else 0.0
    if gathers_overlapped(setup):
        hidden += min(gather, compute_ms(layer.fwd_ms, setup.time))
    return hidden


def side_stream(order: schedules.Schedule, stage_layers: Sequence[Sequence[LayerCost]],
                times: Sequence[StageTimes], setup: TrainSetup, *, step_window_ms: Sequence[float],
                profile: Profile | None = None) -> SideStream:
    """Every rank's reductions and gathers where Megatron issues them (module docstring);
    `step_window_ms`, per rank: its optimizer step past chunk 0's (what chunk 0's gather hides behind
    under --overlap-param-gather-with-optimizer-step); `profile`, whose GPU's SMs NCCL's CTAs take
    (None: the compute beside the stream is not slowed)."""
    dp, size = setup.data_parallel, bucket_params(setup)
    shares = {stage: stage_shares(layers, profile, setup) for stage, layers in enumerate(stage_layers)}
    opening: list[list[Issue]] = [[] for _ in range(order.num_ranks)]
    issues, waits, extend = defaultdict(list), defaultdict(list), {}
    for rank in range(order.num_ranks):
        stages = order.stages_of(rank)
        by_stage = {s: buckets(stage_layers[s], setup, size=size if chunk == 0 and rank == 0
                               and not dp.param_gather_with_step else None) for chunk, s in enumerate(stages)}
        _reductions(order, rank, by_stage, setup, issues, shares)
        if gathers_overlapped(setup):
            _gathers(order, rank, by_stage, times, setup, step_window_ms[rank],
                     opening=opening[rank], issues=issues, waits=waits, extend=extend, shares=shares)
    return SideStream(tuple(tuple(o) for o in opening), dict(issues), dict(waits), extend)


def stage_shares(layers: Sequence[LayerCost], profile: Profile | None, setup: TrainSetup) -> tuple[float, float]:
    """(gather, reduce): the share of the GPU's SMs a chunk's all-gather and its reduction take while they run
    (nccl_sms.collective_shares: the dense parameters' collectives at the data-parallel group's CTAs, the experts' at
    the expert-data-parallel group's, weighted by their times)."""
    return nccl_sms.collective_shares(profile, setup, layers)


def _last_backward(actions, stage: int, microbatches: int) -> int:
    return max(i for i, a in enumerate(actions) if a.stage == stage and a.kind in ("B", "W")
               and a.microbatch == microbatches - 1)


def _reductions(order: schedules.Schedule, rank: int, by_stage: dict, setup: TrainSetup, issues, shares) -> None:
    actions, last = order.actions[rank], len(order.actions[rank]) - 1
    backs = [i for i, a in enumerate(actions) if a.kind in ("B", "W")]
    for stage, found in by_stage.items():
        total, share = sum(b.reduce_ms for b in found), shares[stage][1]
        if not overlaps_comm(setup):
            issues[(rank, last)].append(Issue(total, "end", share=share))  # finalize_model_grads, synchronous
        elif order.num_chunks > 1 and setup.data_parallel.align_grad_reduce:
            j = backs.index(_last_backward(actions, stage, order.num_microbatches)) + rank
            issues[(rank, backs[j] if j < len(backs) else last)].append(Issue(total, "end", share=share))
        else:
            at = _last_backward(actions, stage, order.num_microbatches)
            issues[(rank, at)] += [Issue(b.reduce_ms, b.ready if b.ready < 1 else "end", share=share) for b in found]


def _gathers(order: schedules.Schedule, rank: int, by_stage: dict, times: Sequence[StageTimes],
             setup: TrainSetup, window_ms: float, *, opening: list, issues, waits, extend, shares) -> None:
    actions = order.actions[rank]
    forwards = [i for i, a in enumerate(actions) if a.kind == "F"]
    first = {}
    for i in forwards:
        first.setdefault(actions[i].stage, i)
    aligned = order.num_chunks > 1 and setup.data_parallel.align_param_gather
    for chunk, (stage, found) in enumerate(by_stage.items()):
        total, key, share = sum(b.gather_ms for b in found), ("AG", stage), shares[stage][0]
        waits[(rank, first[stage])].append(key)
        if chunk == 0 and setup.data_parallel.param_gather_with_step:
            opening.append(Issue(max(0.0, total - window_ms), key=key, share=share))
        elif aligned and chunk <= 1:
            opening.append(Issue(total, key=key, share=share))
        elif aligned:
            previous = forwards.index(first[order.stages_of(rank)[chunk - 1]]) - rank
            issues[(rank, forwards[max(previous, 0)])].append(Issue(total, "start", key, share))
        else:  # the chunk's first forward issues its buckets one by one (forward order: the last first)
            groups = list(reversed(found))
            issues[(rank, first[stage])] += [Issue(groups[0].gather_ms, "start", key, share)] + [
                Issue(g.gather_ms, "start", share=share) for g in groups[1:]]
            extend[(rank, first[stage])] = chain_extension_ms(groups, times[stage].forward_ms)


def makespan_ms(order: schedules.Schedule, times: Sequence[StageTimes], stage_layers: Sequence[Sequence[LayerCost]],
                setup: TrainSetup, *, step_window_ms: Sequence[float], profile: Profile | None = None,
                stage_sends: Sequence[tuple[float, float]] | None = None) -> float:
    """The schedule's makespan (its order's simulation) with Megatron's data-parallel collectives beside
    the compute, slowing it by NCCL's CTAs on `profile`'s GPU (side_stream); `stage_sends`: simulate_time's."""
    side = side_stream(order, stage_layers, times, setup, step_window_ms=step_window_ms, profile=profile)
    return schedule_time.simulate_time(order, stage_times=times, side=side, stage_sends=stage_sends).makespan_ms
