"""NCCL's tuner on a sized all-reduce (planner/cost/nccltuner.py tuned_sized_all_reduce): the (algorithm, protocol)
it picks from 4 B to 8 GiB and where the pick changes, for a few groups of 8-GPU H100 nodes with a NIC a GPU
(docs/framework-facts.md §148, docs/published-runs.md §31.ncclsized).

    python scripts/ncclsized_crossovers.py [--version 2.27.7|2.21.5]
"""

from __future__ import annotations

import argparse

from planner.cost import nccltuner
from planner.models import archs, network_rate

# (ranks, nodes, ranks a node): 8 ranks in one node, 16 over 2 nodes, 128 over 16, and 16 one a node (tp 8)
GROUPS = ((8, 1, 8), (16, 2, 8), (128, 16, 8), (16, 16, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=nccltuner.V2_27, choices=(nccltuner.V2_27, nccltuner.V2_21))
    parser.add_argument("--gpu", default="h100-sxm")
    args = parser.parse_args()
    gpu = archs.gpu(args.gpu)
    from planner.cost.nccl_buffers import NCCL_GPUS

    capability = NCCL_GPUS[gpu.name].capability
    arch = nccltuner.arch_of(capability, args.version)
    for ranks, nodes, local in GROUPS:
        rate = gpu.node_collective_rate if nodes == 1 else network_rate.ring_rate_across_nodes(gpu, local)
        channels, speed = nccltuner.graph_channels(rate, round(local * gpu.nics_per_gpu), capability)
        print(f"{ranks} ranks, {nodes} node(s), {local} a node: ring {rate:g} GB/s, {channels} channels x "
              f"{speed:.2f} GB/s, {arch}, NCCL {args.version}")
        previous = None
        for exponent in range(2, 34):
            size = 2**exponent
            algorithm, protocol, us = nccltuner.tuned_sized_all_reduce(size, ranks, nodes, channels, speed, arch,
                                                                       version=args.version)
            ring_us = 2 * (ranks - 1) / ranks * size / (rate * 1e3)
            if (algorithm, protocol) != previous or exponent in (20, 30):
                print(f"  {size:>13,} B  {algorithm}/{protocol:<6} {us:10.1f} µs  "
                      f"(the ring's rate alone {ring_us:9.1f})")
            previous = algorithm, protocol


if __name__ == "__main__":
    main()
