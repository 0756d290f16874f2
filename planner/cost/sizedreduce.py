"""A sized all-reduce across nodes as NCCL's tuner runs it (docs/framework-facts.md §148): the gradients' all-reduce
of DDP (ZeRO 0) and of a ZeRO 1 runtime that all-reduces (DeepSpeed's BF16 pipeline engine), over the
data-parallel group.

NCCL does not run every all-reduce as a ring: src/graph/tuning.cc's ncclTopoTuneModel gives each algorithm (Tree,
Ring) and protocol (LL, LL128, Simple) a latency and a bandwidth, and the tuner takes the least latency + bytes /
bandwidth at the call's size (planner/cost/nccltuner.py tuned_sized_all_reduce). Across nodes that is Tree / LL
for a few KB, Tree / LL128 to tens of MB, then Ring / LL128 or, on 16 nodes of 8 H100s, Tree / Simple, and Ring /
Simple for the largest (§148's table); each with its latency. ckplan charged every such all-reduce at the ring's
bus rate with no latency; here:

    a group inside one node         unchanged: 2(n-1)/n x bytes at the ring's rate (what ckplan measured in a node)
    a group across nodes            the tuner's time at the call's size: the ring graph's channels and speed from
                                    the ring's bus rate over the NICs its ranks in a node bring
                                    (nccltuner.graph_channels), the tables of the job's NCCL
    NCCL_ALGO=Ring NCCL_PROTO=Simple (the setting nccl_ring_simple): Ring / Simple's time, its latency included

The call's size is the bytes ckplan charges together (a layer's gradients: dataparallel.grad_reduce_ms is called a
layer at a time); a DDP bucket that holds several layers pays the latency once where this pays it a layer. The
tuner needs the GPU (its compute capability, its NICs: the setup's nccl_capability / nccl_nics_per_gpu, filled
from the profile's GPU); where it is not known (0), the ring's rate alone, as before. NCCL's version: torchtitan's
rows run torch 2.6's NCCL 2.21.5, every other runtime the 2.27.7 tables nccltuner's scalar choice reads.
"""

from __future__ import annotations

import math

from planner.cost import nccltuner, runtimes
from planner.cost.comm import MS_PER_US, NCCL_STEP_LATENCY_US
from planner.models import network_rate
from planner.schema import TrainSetup

GB = 1e9


def nccl_version(setup: TrainSetup) -> str:
    """The NCCL whose tables the job's tuner runs, as the runtime's record reads it (RuntimeFacts.nccl_version:
    torch 2.6.0's nvidia-nccl-cu12 2.21.5 under torchtitan 9dec370; else v2.27.7, Megatron-Bridge 25.11's container
    and the tables nccltuner's scalar choice reads)."""
    return runtimes.of(setup.training).nccl_version


def tuned_all_reduce(num_bytes: float, ranks: int, setup: TrainSetup, gb_per_s: float | None, *,
                     stride: int | None = None) -> tuple[str, str, float]:
    """(algorithm, protocol, ms) of one all-reduce of `num_bytes` over `ranks` ranks lying `stride` apart (default:
    the setup's tp, the data-parallel group's) whose ring runs at `gb_per_s` bus bandwidth: ("Ring", "Simple",
    the ring's bandwidth term) inside one node or where the GPU is not known, else NCCL's tuner's pick (module
    docstring). 0 ms for one rank or no rate."""
    if gb_per_s is None or ranks <= 1:
        return "Ring", "Simple", 0.0
    ring_ms = 2 * (ranks - 1) / ranks * num_bytes / (gb_per_s * GB) * 1e3
    data, per_node = setup.data_parallel, setup.comm.domain  # the NVLink domain (planner/models/topology.py)
    stride = setup.comm.tp if stride is None else stride
    local = network_rate.ranks_per_node(ranks, stride, per_node)
    nodes = -(-ranks // local)
    if nodes <= 1 or data.nccl_capability <= 0 or data.nccl_nics_per_gpu <= 0:
        return "Ring", "Simple", ring_ms
    version = nccl_version(setup)
    pcie = math.isclose(setup.comm.tp_step_latency_ms, NCCL_STEP_LATENCY_US["pcie"] * MS_PER_US)
    intra = "pcie" if pcie else "nvlink"
    channels, speed = nccltuner.graph_channels(gb_per_s, round(local * data.nccl_nics_per_gpu),
                                               data.nccl_capability)
    arch = nccltuner.arch_of(data.nccl_capability, version)
    if setup.training.nccl_ring_simple:
        us = nccltuner.all_reduce_time_us("Ring", "Simple", num_bytes, ranks, nodes, channels, speed, arch,
                                          intra=intra, version=version)
        return "Ring", "Simple", us * MS_PER_US
    algorithm, protocol, us = nccltuner.tuned_sized_all_reduce(num_bytes, ranks, nodes, channels, speed, arch,
                                                               intra=intra, version=version)
    return algorithm, protocol, us * MS_PER_US


def all_reduce_ms(num_bytes: float, ranks: int, setup: TrainSetup, gb_per_s: float | None, *,
                  stride: int | None = None) -> float:
    """ms of one all-reduce of `num_bytes` over the data-parallel group's `ranks`, `stride` apart (tuned_all_reduce)."""
    return tuned_all_reduce(num_bytes, ranks, setup, gb_per_s, stride=stride)[2]

