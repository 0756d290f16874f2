"""The step's scalar all-reduces: what a Megatron-LM step's gradient norm, count_zeros and parameters' norm cost
on the device beyond their arithmetic (docs/framework-facts.md §121).

Each is an all-reduce of one fp32 scalar (4 B), so its time is NCCL's latency, not bytes over a link: NCCL's own
latency model (planner/cost/nccltuner.py, NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc), under the algorithm and
protocol the job runs. Megatron-LM's functional tests force Ring / Simple (tests/functional_tests/shell_test_utils/
_run_training.sh 58-61 at 93ebf8d7 exports NCCL_PROTO=simple, NCCL_ALGO=Ring and NCCL_NVLS_ENABLE=0 unless the
test's ENV_VARS say otherwise: the setting `nccl_ring_simple`, which the Megatron reader sets on such a file); any
other job runs what NCCL's tuner picks, the least latency of its model over Ring and Tree under LL, LL128 and
Simple (Tree / LL across nodes: 85 µs on 1,024 ranks of 8 a node, where Ring / Simple's model gives 9.7 ms), and NVLS
/ NVLS Tree where the group runs NVLink SHARP (a multicast GPU, more than two of the group's GPUs a node, the launch
not setting NCCL_NVLS_ENABLE=0, the setting nccl_nvls_off: Megatron-Bridge's and the functional tests' launches do). None
is hidden: the gradients' norm runs after the last backward's reduction and before the inner step, which scales by
it; count_zeros and the parameters' norm are read on the host
(`.item()`) before anything else is issued. Which the runtime makes, over which group, and under which flag: the
runtime record's `step_collectives`. The groups, ranks placed tp, cp, (ep,) dp, pp (Megatron-core's order), where
the setup's dp already counts the cp ranks of a replica (training_settings.with_context_parallel: Megatron reduces
and shards over its dp_cp group):

    grad_stats       the whole world (tp x dp x pp) under a distributed optimizer (ZeRO >= 1), else model_parallel
    model_parallel   tp x pp ranks (tp adjacent, pp tp·dp apart)
    dp_cp            the setup's dp ranks (tp apart)
    expert_dp        the expert-data-parallel group: dp / ep ranks (tp·ep apart)

A group's nodes are those its ranks lie on (nodes of the setup's gpus_per_node); in a node NVLink's figures, or
PCI's where the setup's in-node step is NCCL's PCI one. Charged once a step on the embedding's stage, as the
optimizer's fixed host calls are (hosttime.host_step_ms): every rank waits on the same collectives.
"""

from __future__ import annotations

from planner.cost import nccl_buffers, nccltuner, runtimes
from planner.cost.comm import MS_PER_US, in_node_hardware
from planner.cost.layers import LayerCost
from planner.schema import TrainSetup

EMBEDDING = "embedding"


def group_positions(group: str, setup: TrainSetup) -> list[int]:
    """The global ranks of `group`'s first instance (the one holding rank 0), in Megatron-core's order."""
    data = setup.data_parallel
    tp, dp, ep = setup.comm.tp, data.dp, max(1, data.ep)  # dp: the dp x cp ranks of the parameters' replicas
    pp = max(1, setup.pipeline.stages // max(1, setup.pipeline.chunks))  # a stage's terms see the P·V stages
    if group == "grad_stats":
        group = "world" if data.zero >= 1 else "model_parallel"
    if group == "world":
        return list(range(tp * dp * pp))
    if group == "model_parallel":
        return [stage * tp * dp + rank for stage in range(pp) for rank in range(tp)]
    if group == "dp_cp":
        return [replica * tp for replica in range(dp)]
    if group == "expert_dp":
        return [replica * tp * ep for replica in range(max(1, dp // ep))]
    raise ValueError(f"unknown group {group!r}")


def group_ranks(group: str, setup: TrainSetup) -> tuple[int, int]:
    """(ranks, span): how many ranks `group` holds and how far its first rank lies from its last, plus one."""
    positions = group_positions(group, setup)
    return len(positions), positions[-1] - positions[0] + 1


def group_nodes(group: str, setup: TrainSetup) -> int:
    """The nodes (of the setup's gpus_per_node) `group`'s ranks lie on."""
    per_node = setup.comm.domain  # the NVLink domain (planner/models/topology.py)
    return len({rank // per_node for rank in group_positions(group, setup)})


def group_runs_nvls(group: str, setup: TrainSetup, profile) -> bool:
    """Whether NCCL runs NVLink SHARP in `group`: the profile's GPU has multicast, more than two of the group's ranks
    share a node, and the launch leaves NCCL_NVLS_ENABLE on (nccltuner.nvls_supported)."""
    gpu = nccl_buffers.profile_nccl_gpu(profile) if profile is not None else None
    if gpu is None:
        return False
    per_node = setup.comm.domain
    nodes = [rank // per_node for rank in group_positions(group, setup)]
    return nccltuner.nvls_supported(multicast=gpu.multicast, local_gpus=max(nodes.count(n) for n in set(nodes)),
                                    enabled=not setup.training.nccl_nvls_off)


def scalar_all_reduce(ranks: int, nodes: int, setup: TrainSetup, *, nvls: bool = False) -> tuple[str, str, float]:
    """(algorithm, protocol, ms) of one all-reduce of a 4 B scalar over `ranks` ranks on `nodes` nodes: Ring /
    Simple where the launch forces it (the setting nccl_ring_simple), else NCCL's tuner's pick (nccltuner.py; `nvls`:
    the group runs NVLink SHARP, group_runs_nvls)."""
    intra = in_node_hardware(setup)
    if setup.training.nccl_ring_simple:
        algorithm, protocol = "Ring", "Simple"
        us = nccltuner.all_reduce_latency_us(algorithm, protocol, ranks, nodes, intra)
    else:
        algorithm, protocol, us = nccltuner.tuned_all_reduce(ranks, nodes, intra, nvls=nvls)
    return algorithm, protocol, us * MS_PER_US


def step_collectives(setup: TrainSetup, profile=None) -> list[tuple[str, int, float]]:
    """The step's scalar all-reduces the setup's runtime makes: (what, ranks, ms) each; [] where the runtime's
    record lists none or the setup charges no collectives (no link rate); `profile`: its GPU's NVLS (None: none)."""
    if setup.comm.tp_gb_per_s is None:
        return []
    training, found = setup.training, []
    for what, group, flag in runtimes.of(training).step_collectives:
        if flag and not getattr(training, flag, False):
            continue
        ranks = len(group_positions(group, setup))
        nvls = group_runs_nvls(group, setup, profile)
        found.append((what, ranks, scalar_all_reduce(ranks, group_nodes(group, setup), setup, nvls=nvls)[2]))
    return found


def step_collectives_ms(layer: LayerCost, setup: TrainSetup, profile=None) -> float:
    """ms once a step the step's scalar all-reduces take, on the embedding's layer (0 on every other)."""
    if layer.kind != EMBEDDING:
        return 0.0
    return sum(ms for _, _, ms in step_collectives(setup, profile))
