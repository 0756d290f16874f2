"""A data-parallel job's links: the bandwidths its shard group, replicas, host copies and
expert-parallel all-to-all run at, chosen from the profile's GPU and where each group's ranks
sit (one node or across nodes), with a note of where each figure came from. A shard or replica group
inside a node runs its all-gathers and reduce-scatters at the bus bandwidth nccl-tests / rccl-tests measured
for the GPU's node where one is published (the rate comm.job_links gives tensor parallelism), else at the
link's datasheet rate; an expert all-to-all at NCCL's effective NVLink rate where it is read (GPU.node_alltoall_rate),
else the link's. The setup's
data_parallel part takes them (--shard-bandwidth and the like override each)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import comm, dataparallel, nccltuner
from planner.models import network_rate, topology
from planner.schema import Profile

# gloo over loopback between processes of one machine: a rough figure, not a measurement;
# pass --shard-bandwidth / --replica-bandwidth to use one
CPU_GLOO_GB_PER_S = 2.0

# NCCL's latency model of a ring collective (docs/framework-facts.md §141), read at NVIDIA/nccl v2.21.5-1
# (ab2b89c4; the NCCL torch 2.6.0's wheels pin, nvidia-nccl-cu12==2.21.5: torch 1963fc8, torchtitan 9dec370's runs)
# src/graph/tuning.cc: baseLat Ring {LL, LL128, Simple} (56-59), hwLat Ring by hardware (65-78), getNetOverhead
# (109-118: 1 µs on an Intel x86 or another host, 2 on AMD; x3 under Simple, 242-246); the same figures at v2.27.7-1.
RING_LATENCY_NCCL = "NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc ncclTopoTuneModel 56-78, 109-118, 158-163, 225-248"
RING_PROTOCOLS = ("LL", "LL128", "Simple")
RING_BASE_US = (6.6, 14.0, 8.4)
RING_HW_US = {"nvlink": (0.6, 1.9, 3.4), "pcie": (1.0, 2.5, 5.7), "network": (2.7, 4.0, 14.0)}
RING_NET_OVERHEAD_US = 1.0  # an Intel x86 host (Grand Teton's, DGX H100's); AMD's 2.0 not charged
RING_SIMPLE_OVERHEAD_FACTOR = 3


def ring_latency_us(kind: str, ranks: int, nodes: int, intra: str = "nvlink", protocol: str = "Simple") -> float:
    """µs of NCCL's latency model for one ring `kind` ("all-gather", "reduce-scatter" or "all-reduce") over `ranks`
    ranks on `nodes` nodes (tuning.cc 158-163, 225-248):

        base + (nsteps - inter) * max(intra, overhead) + inter * network

    nsteps n-1 (all-gather, reduce-scatter) or 2(n-1) (all-reduce); inter, the steps that cross the network,
    nodes-1 (all-gather, reduce-scatter) or, at v2.21.5, 2 x nodes for an all-reduce across nodes (2(nodes-1) from
    v2.23 on); overhead the network post overhead of an inter-node ring (0 on one node), the network's figure plus
    the graph's latencyInter, which InfiniBand's transport leaves 0 (net_ib.cc 620: `props->latency = 0`).
    `intra`: "nvlink" or "pcie". Simple is the protocol NCCL's tuner takes for the hundreds of MB an FSDP unit moves
    (its bandwidth term, the least there); 0 for one rank."""
    if ranks <= 1:
        return 0.0
    if kind not in ("all-gather", "reduce-scatter", "all-reduce") or protocol not in RING_PROTOCOLS:
        raise ValueError(f"no ring latency for {kind!r} under {protocol!r}")
    nodes = max(1, min(nodes, ranks))
    p = RING_PROTOCOLS.index(protocol)
    steps = 2 * (ranks - 1) if kind == "all-reduce" else ranks - 1
    inter = nccltuner.ring_inter_steps(kind, ranks, nodes, nccltuner.V2_21)
    step_us = RING_HW_US[intra][p]
    if nodes > 1:
        step_us = max(step_us, RING_NET_OVERHEAD_US * (RING_SIMPLE_OVERHEAD_FACTOR if protocol == "Simple" else 1))
    return RING_BASE_US[p] + (steps - inter) * step_us + inter * RING_HW_US["network"][p]


group_nodes = comm.group_nodes  # the nodes a group spans (one rule with comm.py's links)


@dataclass(frozen=True)
class Links:
    """Bandwidths (GB/s per rank) and node size for a setup, with where they came from."""

    shard_gb_per_s: float
    replica_gb_per_s: float
    host_gb_per_s: float | None  # None: the host is the device (cpu), copies are free
    devices_per_node: int
    notes: list[str]
    ep_gb_per_s: float | None = None  # the tokens' all-to-all in an expert-parallel group; None: no ep


def host_sharing(gpu, host: int, ranks: int) -> int:
    """The GPUs copying to the host through one PCIe switch's uplink (GPU.gpus_per_host_switch), no more than a
    host's GPUs nor the job's ranks: each one's host copies run at host_link_gb_per_s over it."""
    return max(1, min(gpu.gpus_per_host_switch, host, ranks))


def default_links(profile: Profile, *, stages: int, dp: int, shard_group: int, ep: int = 1,
                  gpus_per_node: int | None = None, given: dict[str, float | None] | None = None,
                  nics_per_gpu: float | None = None, nvlink_domain: int | None = None) -> Links:
    """The profile's GPU's links (analytic profiles name their GPU; a measured cuda profile is
    matched by name) or, on cpu, gloo on one machine. Ranks are placed tensor-parallel
    innermost, then the expert-parallel group (Megatron-LM's order: tp, ep, then the expert
    data-parallel ranks), then the shard group, then the replicas: a group whose ranks x tp fit
    in one node communicates over the node's link, a wider one over the network at the bus bandwidth of the
    NICs its ranks in each node bring (planner/models/network_rate.py: a shard group of k ranks a node, k
    NICs; the replicas, shard_group x tp apart; an expert all-to-all over its ranks' own NICs while the node's
    own peers are reached over NVLink). nics_per_gpu: --nics-per-gpu, else the GPU's. A bandwidth in `given` (by its
    option's name: --shard-bandwidth, --replica-bandwidth, --host-bandwidth, --ep-bandwidth) replaces the
    default, and the note says so."""
    given = {name: value for name, value in (given or {}).items() if value is not None}
    if profile.device.type == "cpu":
        note = (f"data-parallel reductions at {CPU_GLOO_GB_PER_S:g} GB/s (gloo between processes of this "
                "machine: a rough figure); no host copies (the host is the device)")
        return Links(given.get("--shard-bandwidth", CPU_GLOO_GB_PER_S), given.get("--replica-bandwidth", CPU_GLOO_GB_PER_S),
                     given.get("--host-bandwidth"), stages * dp, [note],
                     given.get("--ep-bandwidth", CPU_GLOO_GB_PER_S) if ep > 1 else None)
    gpu = dataparallel.profile_gpu(profile)
    tp = int(profile.assumptions.get("tp", 1))
    host = topology.host_gpus(gpu, gpus_per_node)  # the ranks sharing a host's memory (devices_per_node)
    node = topology.nvlink_domain(gpu, gpus_per_node, nvlink_domain)  # a group's link: inside the NVLink domain or not

    def link(ranks: int, option: str, *, ring: bool = True, stride: int = tp) -> tuple[float, str]:
        if option in given:
            return given[option], option
        if ranks * stride > node:
            k = network_rate.ranks_per_node(ranks, stride, node)
            rate = (network_rate.collective_rate if ring else network_rate.alltoall_rate)(
                gpu, ranks, stride, node, nics_per_gpu)
            return rate, f"network, NCCL's busbw over {k} rank(s) a node's NICs"
        if ring and gpu.node_collective_gb_per_s:
            return gpu.node_collective_rate, "in-node, measured busbw"
        if not ring and gpu.node_alltoall_gb_per_s:
            return gpu.node_alltoall_rate, "in-node, NCCL's effective NVLink rate"
        return gpu.node_link_gb_per_s, "in-node link"

    shard, shard_where = link(shard_group, "--shard-bandwidth")
    shards = min(shard_group, dp) or 1  # the replicas' all-reduce: dp / shard_group ranks, shard_group x tp apart
    replica, replica_where = link(max(1, dp // shards), "--replica-bandwidth", stride=tp * shards)
    # an all-to-all: NCCL's NVLink rate, else the link's; none without expert parallelism (a group of one rank
    # tp apart is "across nodes" where tp passes a node, and has no all-to-all rate)
    experts, experts_where = link(ep, "--ep-bandwidth", ring=False) if ep > 1 else (None, "")
    sharing = host_sharing(gpu, host, stages * dp * tp)
    host_rate, host_where = given.get("--host-bandwidth", gpu.host_link_gb_per_s / sharing), (
        "--host-bandwidth" if "--host-bandwidth" in given else
        gpu.host_link_kind + (f", {sharing} GPUs a switch's uplink" if sharing > 1 else ""))
    where = f"{node} GPUs a node" if host == node else f"{node} GPUs an NVLink domain, {host} a host"
    note = (f"{gpu.name}, {where}, tp {tp}: shard group reduces at {shard:g} GB/s "
            f"({shard_where}), replicas at {replica:g} GB/s ({replica_where}), host copies at "
            f"{host_rate:g} GB/s ({host_where})"
            + (f", the experts' all-to-all over ep {ep} at {experts:g} GB/s ({experts_where})" if ep > 1 else "")
            + f"; {gpu.link_source}" + (f"; {gpu.collective_source}" if "measured" in shard_where + replica_where
                                        else "")
            + (f"; all-to-all: {gpu.alltoall_source}" if ep > 1 and "NCCL's" in experts_where else ""))
    return Links(shard, replica, host_rate, host, [note], experts if ep > 1 else None)
