"""NCCL's own latency model of an all-reduce, and the algorithm and protocol its tuner picks for a tiny one
(docs/framework-facts.md §135).

NVIDIA/nccl v2.27.7-1, src/graph/tuning.cc ncclTopoTuneModel: each (algorithm, protocol) of a communicator of
`ranks` ranks over `nodes` nodes gets a latency, in µs,

    Ring   base + (2(n-1) - k) * max(intra, overhead) + k * inter      k = 2(nodes-1) steps cross the network
    Tree   base + 2 * ((n/nodes - 1) * intra + log2(nodes) * inter)     (integer n/nodes; floor of log2)

from the tables below (baseLat; hwLat by hardware: NVLink, PCI, network); `overhead` is the network post
overhead of an inter-node ring (getNetOverhead: 1 µs on an Intel or an ARM host, 2 on AMD, x3 under Simple; 0 on one
node), `inter` the network's figure (the Tree's where one rank a node, "ppn = 1"), plus the graph's latencyInter,
which InfiniBand's and the socket transport's properties leave 0 (net_ib.cc 863, net_socket.cc 112).
ncclTopoGetAlgoTime charges latency + bytes / bandwidth; for a 4 B scalar the bytes' term is nil and Ring /
Simple's "plateau" factor (x1.4 where bytes / (channels x ranks) >= 64) does not apply, so the tuner picks the
least latency among what is enabled: Ring and Tree under LL, LL128 and Simple (every protocol; LL128 only where
its topology allows, never the least here). Not in the choice: CollNet (NCCL_COLLNET_ENABLE off by default, no
SHARP plugin assumed), PAT (all-gather and reduce-scatter only), NVLS and NVLS Tree (their own latency, 25 µs on
NVLink, beats LL's only on more than ~16 ranks of one NVLink domain: GB200's NVL72; not modelled, an upper bound
there), NCCL_TUNER_PLUGIN's own tables.
"""

from __future__ import annotations

import math

NCCL_VERSION = "NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc"
ALGORITHMS = ("Tree", "Ring")
PROTOCOLS = ("LL", "LL128", "Simple")
# baseLat[algorithm][protocol], µs (tuning.cc 134-136)
BASE_US = {"Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4)}
# hwLat[hardware][algorithm][protocol], µs (tuning.cc 143-156)
HW_US = {"nvlink": {"Tree": (0.6, 1.25, 4.0), "Ring": (0.6, 1.9, 3.4)},
         "pcie": {"Tree": (1.0, 1.9, 4.0), "Ring": (1.0, 2.5, 5.7)},
         "network": {"Tree": (5.0, 8.5, 14.0), "Ring": (2.7, 4.0, 14.0)}}
NET_OVERHEAD_US = 1.0  # getNetOverhead on an Intel x86 or an ARM host (tuning.cc 201-209; AMD's 2.0 not read)
SIMPLE_OVERHEAD_FACTOR = 3


def all_reduce_latency_us(algorithm: str, protocol: str, ranks: int, nodes: int, intra: str = "nvlink") -> float:
    """µs NCCL's model gives an all-reduce of `ranks` ranks over `nodes` nodes under `algorithm` and `protocol`;
    `intra`: the in-node hardware ("nvlink" or "pcie"). 0 for one rank (the tuner returns at once)."""
    if ranks <= 1:
        return 0.0
    if algorithm not in ALGORITHMS or protocol not in PROTOCOLS:
        raise ValueError(f"unknown NCCL algorithm or protocol {algorithm}/{protocol}")
    nodes = max(1, min(nodes, ranks))
    p = PROTOCOLS.index(protocol)
    intra_us = HW_US[intra][algorithm][p]
    ppn_one = ranks == nodes  # "with ppn=1 latencies are fully exposed, use the Tree network latency"
    inter_us = HW_US["network"]["Tree" if ppn_one else algorithm][p]
    latency = BASE_US[algorithm][p]
    if algorithm == "Ring":
        steps = 2 * (ranks - 1)
        crossing = 2 * (nodes - 1) if nodes > 1 else 0
        if nodes > 1:
            overhead = NET_OVERHEAD_US * (SIMPLE_OVERHEAD_FACTOR if protocol == "Simple" else 1)
            intra_us = max(intra_us, overhead)
        return latency + (steps - crossing) * intra_us + crossing * inter_us
    return latency + 2 * ((ranks // nodes - 1) * intra_us + int(math.floor(math.log2(nodes))) * inter_us)


def tuned_all_reduce(ranks: int, nodes: int, intra: str = "nvlink") -> tuple[str, str, float]:
    """(algorithm, protocol, µs) the tuner picks for a scalar all-reduce: the least latency of Ring and Tree under
    each protocol (the first listed on a tie, as the tuner's loop keeps the first minimum: Tree before Ring, LL
    first)."""
    best = None
    for algorithm in ALGORITHMS:
        for protocol in PROTOCOLS:
            us = all_reduce_latency_us(algorithm, protocol, ranks, nodes, intra)
            if best is None or us < best[2]:
                best = (algorithm, protocol, us)
    return best
