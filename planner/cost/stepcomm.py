"""The step's scalar all-reduces: what a Megatron-LM step's gradient norm, count_zeros and parameters' norm cost
on the device beyond their arithmetic (docs/framework-facts.md §121).

Each is an all-reduce of one fp32 scalar (4 B), so its time is NCCL's latency, not bytes over a link: NCCL's own
model of its Ring / Simple protocol (planner/cost/comm.py: the base 8.4 µs, then 3.4 µs a step over NVLink, 14.0
over the network; 2(n-1) steps an all-reduce of n ranks). The Megatron-LM functional tests run exactly that
protocol (tests/functional_tests/shell_test_utils/_run_training.sh at 93ebf8d7 exports NCCL_PROTO=simple,
NCCL_ALGO=Ring and NCCL_NVLS_ENABLE=0). None is hidden: the gradients' norm runs after the last backward's
reduction and before the inner step, which scales by it; count_zeros and the parameters' norm are read on the host
(`.item()`) before anything else is issued. Which the runtime makes, over which group, and under which flag: the
runtime record's `step_collectives`. The groups, ranks placed tp, cp, (ep,) dp, pp (Megatron-core's order), where
the setup's dp already counts the cp ranks of a replica (training_settings.with_context_parallel: Megatron reduces
and shards over its dp_cp group):

    grad_stats       the whole world (tp x dp x pp) under a distributed optimizer (ZeRO >= 1), else model_parallel
    model_parallel   tp x pp ranks (tp adjacent, pp tp·dp apart)
    dp_cp            the setup's dp ranks (tp apart)
    expert_dp        the expert-data-parallel group: dp / ep ranks (tp·ep apart)

A group crosses NCCL's network latency where its ranks span more than one node (the first rank to the last),
else NVLink's. Charged once a step on the embedding's stage, as the optimizer's fixed host calls are
(hosttime.host_step_ms): every rank waits on the same collectives.
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.cost.comm import MS_PER_US, NCCL_STEP_LATENCY_US, Link, all_reduce_ms
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup

SCALAR_BYTES = 4  # one fp32 norm or count
EMBEDDING = "embedding"


def group_ranks(group: str, setup: TrainSetup) -> tuple[int, int]:
    """(ranks, span): how many ranks `group` holds and how far its first rank lies from its last, plus one."""
    data = setup.data_parallel
    tp, dp, ep = setup.comm.tp, data.dp, max(1, data.ep)  # dp: the dp x cp ranks of the parameters' replicas
    pp = max(1, setup.pipeline.stages // max(1, setup.pipeline.chunks))  # a stage's terms see the P·V stages
    world = tp * dp * pp
    if group == "grad_stats":
        group = "world" if data.zero >= 1 else "model_parallel"
    if group == "world":
        return world, world
    if group == "model_parallel":
        return tp * pp, (pp - 1) * tp * dp + tp
    if group == "dp_cp":
        return dp, (dp - 1) * tp + 1
    if group == "expert_dp":
        ranks = max(1, dp // ep)
        return ranks, (ranks - 1) * tp * ep + 1
    raise ValueError(f"unknown group {group!r}")


def scalar_all_reduce_ms(ranks: int, span: int, setup: TrainSetup) -> float:
    """ms of one all-reduce of a 4 B scalar over `ranks` ranks spanning `span` ranks: NCCL's latency (comm.py)."""
    comm = setup.comm
    where = "nvlink" if span <= comm.gpus_per_node else "network"
    step_ms = comm.tp_step_latency_ms if where == "nvlink" else NCCL_STEP_LATENCY_US["network"] * MS_PER_US
    return all_reduce_ms(SCALAR_BYTES, ranks, Link(comm.tp_gb_per_s, step_ms, comm.collective_latency_ms, where))


def step_collectives(setup: TrainSetup) -> list[tuple[str, int, float]]:
    """The step's scalar all-reduces the setup's runtime makes: (what, ranks, ms) each; [] where the runtime's
    record lists none or the setup charges no collectives (no link rate)."""
    if setup.comm.tp_gb_per_s is None:
        return []
    training, found = setup.training, []
    for what, group, flag in runtimes.of(training).step_collectives:
        if flag and not getattr(training, flag, False):
            continue
        ranks, span = group_ranks(group, setup)
        found.append((what, ranks, scalar_all_reduce_ms(ranks, span, setup)))
    return found


def step_collectives_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """ms once a step the step's scalar all-reduces take, on the embedding's layer (0 on every other)."""
    if layer.kind != EMBEDDING:
        return 0.0
    return sum(ms for _, _, ms in step_collectives(setup))
