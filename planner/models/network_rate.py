"""The bandwidth NCCL's collectives reach across nodes, by how many of the group's ranks share a node.

A ring (all-gather, reduce-scatter, all-reduce) whose group has k ranks in each of its nodes crosses each node
boundary once a channel, and NCCL spreads its channels over the NICs nearest the group's GPUs: NCCL 2.30.7
(5067397c) src/graph/search.cc `ncclTopoSelectNets` (541-590) lists each of the communicator's GPUs' local NICs first
(`ncclTopoPrefNetsChannelFirst`, 507-529, `ncclTopoGetLocalNet` per GPU); `ncclTopoSearchRecNet` (724-753) starts
channel c at `nets[(nChannels + i) % netCount]`, rotating the channels over that list, and takes each channel's
`bwInter` off its NIC (`net.bw -= bw`), so channels are added until the listed NICs' bandwidth is spent; the search
starts at the GPUs' nearest path to a NIC (`minTypeInter`, 1094-1103) and widens it only where no graph is found. A
node's boundary traffic is carried by its k GPUs' NICs: a rank sends (n-1)/n of the tensor on its ring edges, each
node's exit edge carries as much per channel, so the bus bandwidth is k NICs' (k x nics_per_gpu x one NIC's NCCL
rate), bounded by the ring's legs inside the node (GPU.node_collective_rate). The NICs of GPUs outside the
communicator are reached from its GPUs only through the CPU (PATH_PHB / SYS), not listed while a graph is found
nearer. Measured: 3 nodes of 8 A100s with 4 HDR NICs a node read 84.8-96 GB/s all-reduce busbw against 4 x 24 =
96, two such nodes 86 GB/s (NVIDIA/nccl-tests#119, NVIDIA/nccl#1048); "you can add more NICs and you should get
more bandwidth, up to ... the NVLink intra-node bandwidth" (an NCCL maintainer, NVIDIA/nccl#412). One rank a node
(a data-parallel group across nodes with TP 8 inside them): one NIC's, the rate ckplan charged every group before.

An all-to-all (expert parallelism's dispatch and combine) is NCCL's grouped sends and receives (ncclSend/ncclRecv
to every peer at once): a rank's messages to a peer in another node leave by its own NIC, or with PXN (NCCL
2.12+, NCCL_PXN_DISABLE=0 by default, src/graph/paths.cc 668-680, 819) by the NIC of the node's GPU on the peer's
rail after an NVLink hop; either way a node's k ranks' remote bytes are spread over its k GPUs' NICs, one
rank's share a NIC, while the bytes to the node's own peers go over NVLink at the same time. Of a rank's (n-1)/n of the tensor sent, (n-k)/n
crosses nodes and (k-1)/n stays: the exchange takes the longer of the two, given as the rate the (n-1)/n moves at.
A pipeline's send is one NIC's line rate (planner/cost/comm.py job_links), not these.
"""

from __future__ import annotations


def ranks_per_node(ranks: int, stride: int, gpus_per_node: int) -> int:
    """How many of a group's `ranks` share a node when its members lie `stride` ranks apart (the product of the
    degrees placed inside it) in nodes of `gpus_per_node`: all of them where ranks x stride fit in one node, else
    gpus_per_node / stride (at least one: a stride of a node or more puts one rank in each)."""
    if ranks * stride <= gpus_per_node:
        return ranks
    return max(1, min(ranks, gpus_per_node // stride))


def ring_rate_across_nodes(gpu, k: int, nics_per_gpu: float | None = None) -> float:
    """GB/s (NCCL's bus bandwidth) of a ring collective across nodes whose group has `k` ranks in each node on
    `gpu` (planner/models/gpus.py GPU): k x nics_per_gpu NICs at NCCL's rate over one (GPU.network_collective_rate),
    at most the in-node ring's rate (GPU.node_collective_rate). nics_per_gpu: --nics-per-gpu, else the GPU's."""
    nics = k * (nics_per_gpu or gpu.nics_per_gpu)
    return min(nics * gpu.network_collective_rate, gpu.node_collective_rate)


def collective_rate(gpu, ranks: int, stride: int, gpus_per_node: int, nics_per_gpu: float | None = None) -> float:
    """GB/s a ring collective of `ranks` ranks `stride` apart runs at: the in-node ring's rate where the group fits
    in a node, else ring_rate_across_nodes with its ranks a node."""
    if ranks * stride <= gpus_per_node:
        return gpu.node_collective_rate
    return ring_rate_across_nodes(gpu, ranks_per_node(ranks, stride, gpus_per_node), nics_per_gpu)


def alltoall_rate(gpu, ranks: int, stride: int, gpus_per_node: int, nics_per_gpu: float | None = None) -> float:
    """GB/s an all-to-all of `ranks` ranks `stride` apart moves a rank's (n-1)/n of the tensor at: in a node
    NCCL's NVLink rate (GPU.node_alltoall_rate); across nodes with k ranks a node, (n-k)/n of the tensor over the
    rank's NICs (nics_per_gpu x one NIC's NCCL rate) while (k-1)/n goes over NVLink, the longer of the two."""
    if ranks * stride <= gpus_per_node:
        return gpu.node_alltoall_rate
    k = ranks_per_node(ranks, stride, gpus_per_node)
    nic = (nics_per_gpu or gpu.nics_per_gpu) * gpu.network_collective_rate
    slowest = max((ranks - k) / nic, (k - 1) / gpu.node_alltoall_rate)  # seconds per byte of tensor, x n
    return (ranks - 1) / slowest
