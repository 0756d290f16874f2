"""NCCL's own latency model of an all-reduce, and the algorithm and protocol its tuner picks for a tiny one
(docs/framework-facts.md §135, §142).

NVIDIA/nccl v2.27.7-1, src/graph/tuning.cc ncclTopoTuneModel: each (algorithm, protocol) of a communicator of
`ranks` ranks over `nodes` nodes gets a latency, in µs,

    Ring       base + (2(n-1) - k) * max(intra, overhead) + k * inter      k = 2(nodes-1) steps cross the network
    Tree       base + 2 * ((n/nodes - 1) * intra + log2(nodes) * inter)     (integer n/nodes; floor of log2)
    NVLS       intra (+ inter across nodes)                                 (tuning.cc 367-369: set, not added)
    NVLS Tree  intra + 2 * log2(nodes) * inter                              (tuning.cc 370-371; baseLat 0)

from the tables below (baseLat; hwLat by hardware: NVLink, PCI, network); `overhead` is the network post
overhead of an inter-node ring (getNetOverhead: 1 µs on an Intel or an ARM host, 2 on AMD, x3 under Simple; 0 on one
node), `inter` the network's figure (the Tree's where one rank a node, "ppn = 1"), plus the graph's latencyInter,
which InfiniBand's and the socket transport's properties leave 0 (net_ib.cc 863, net_socket.cc 112).
ncclTopoGetAlgoTime charges latency + bytes / bandwidth; for a 4 B scalar the bytes' term is nil and Ring /
Simple's "plateau" factor (x1.4 where bytes / (channels x ranks) >= 64) does not apply, so the tuner picks the
least latency among what is enabled (topoGetAlgoInfo, src/enqueue.cc 1797-1806: algorithms in NCCL's order Tree,
Ring, CollNet Direct, CollNet Chain, NVLS, NVLS Tree, the first least kept): Ring and Tree under LL, LL128 and Simple
(LL128 only where its topology allows, never the least here), and NVLink SHARP where the communicator runs it:

- **NVLS** (Simple only, tuning.cc 262) on one node; across nodes only with CollNet (tuning.cc 445-448, enqueue.cc
  1769), which is off by default (NCCL_COLLNET_ENABLE 0, no SHARP plugin assumed). Its latency is NVLink's 25 µs
  whatever the ranks: it beats Ring / LL's 6.6 + 2(n-1) x 0.6 from 17 ranks in one NVLink domain (GB200 NVL72).
- **NVLS Tree** across nodes only (tuning.cc 443): 25 + 2 log2(nodes) x 14 µs; on H100 / B200 nodes of 8 Tree / LL
  (15.2 + 10 log2(nodes)) is always less; on NVL72 domains of 64 ranks it wins (4 domains: 81 against 102.4).
- where the communicator runs NVLS at all (`nvls_supported`): NCCL_NVLS_ENABLE (default 2: where the device reports
  CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, an NVSwitch fabric) and more than two of the communicator's GPUs in the
  rank's node or NVLink domain (src/transport/nvls.cc 151-175: `gpuCount <= 2` leaves nvlsSupport 0; the NVLS
  graph is searched only with an NVSwitch and compute capability >= 90, src/graph/search.cc 1012); a float sum is
  an NVLS reduction (src/include/device.h 548-560 ncclNvlsSupported). MNNVL fuses a GB200 NVL72 clique's hosts into
  one topology (src/init.cc 1387-1422), so NCCL's `nodes` there are NVLink domains, not trays.

NVIDIA/nccl v2.21.5-1 (torch's bundled NCCL for torchtitan's rows) holds the same figures (tuning.cc 69-77,
258-262); v2.28 raises NVLS Tree's network figure to 20.9 µs (tuning.cc 165 at v2.28.9-1), not read here. Not in the
choice: CollNet, PAT (all-gather and reduce-scatter only), NCCL_TUNER_PLUGIN's own tables.
"""

from __future__ import annotations

import math

NCCL_VERSION = "NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc"
ALGORITHMS = ("Tree", "Ring", "NVLS", "NVLSTree")  # NCCL's order (src/include/device.h), CollNet left out
PROTOCOLS = ("LL", "LL128", "Simple")
# baseLat[algorithm][protocol], µs (tuning.cc 134-137)
BASE_US = {"Tree": (6.8, 14.0, 8.4), "Ring": (6.6, 14.0, 8.4), "NVLS": (0.0, 0.0, 0.0), "NVLSTree": (0.0, 0.0, 0.0)}
# hwLat[hardware][algorithm][protocol], µs (tuning.cc 143-156); NVLS's only where its graph exists (NVLink)
HW_US = {"nvlink": {"Tree": (0.6, 1.25, 4.0), "Ring": (0.6, 1.9, 3.4), "NVLS": (0, 0, 25.0), "NVLSTree": (0, 0, 25.0)},
         "pcie": {"Tree": (1.0, 1.9, 4.0), "Ring": (1.0, 2.5, 5.7), "NVLS": (0, 0, 0.0), "NVLSTree": (0, 0, 0.0)},
         "network": {"Tree": (5.0, 8.5, 14.0), "Ring": (2.7, 4.0, 14.0), "NVLS": (0, 0, 18.0),
                     "NVLSTree": (0, 0, 14.0)}}
NET_OVERHEAD_US = 1.0  # getNetOverhead on an Intel x86 or an ARM host (tuning.cc 201-209; AMD's 2.0 not read)
SIMPLE_OVERHEAD_FACTOR = 3
NVLS_ALGORITHMS = ("NVLS", "NVLSTree")
NVLS_MIN_GPUS = 3  # nvls.cc 160: more than two GPUs of the communicator in the node / NVLink domain


def nvls_supported(*, multicast: bool, local_gpus: int, enabled: bool = True) -> bool:
    """Whether a communicator runs NVLink SHARP: NCCL_NVLS_ENABLE not 0 (`enabled`), a GPU with multicast (an
    NVSwitch fabric) and more than two of the communicator's GPUs in the rank's node or NVLink domain."""
    return enabled and multicast and local_gpus >= NVLS_MIN_GPUS


def all_reduce_latency_us(algorithm: str, protocol: str, ranks: int, nodes: int, intra: str = "nvlink") -> float:
    """µs NCCL's model gives an all-reduce of `ranks` ranks over `nodes` nodes under `algorithm` and `protocol`;
    `intra`: the in-node hardware ("nvlink" or "pcie"). 0 for one rank (the tuner returns at once)."""
    if ranks <= 1:
        return 0.0
    if algorithm not in ALGORITHMS or protocol not in PROTOCOLS:
        raise ValueError(f"unknown NCCL algorithm or protocol {algorithm}/{protocol}")
    if algorithm in NVLS_ALGORITHMS and (protocol != "Simple" or intra != "nvlink"):
        raise ValueError(f"NCCL runs {algorithm} only under Simple over NVLink, not {protocol} over {intra}")
    nodes = max(1, min(nodes, ranks))
    p = PROTOCOLS.index(protocol)
    intra_us = HW_US[intra][algorithm][p]
    ppn_one = ranks == nodes  # "with ppn=1 latencies are fully exposed, use the Tree network latency"
    inter_us = HW_US["network"]["Tree" if ppn_one else algorithm][p]
    latency = BASE_US[algorithm][p]
    log_nodes = int(math.floor(math.log2(nodes)))
    if algorithm == "NVLS":
        return intra_us + (inter_us if nodes > 1 else 0.0)
    if algorithm == "NVLSTree":
        return latency + intra_us + 2 * log_nodes * inter_us
    if algorithm == "Ring":
        steps = 2 * (ranks - 1)
        crossing = 2 * (nodes - 1) if nodes > 1 else 0
        if nodes > 1:
            overhead = NET_OVERHEAD_US * (SIMPLE_OVERHEAD_FACTOR if protocol == "Simple" else 1)
            intra_us = max(intra_us, overhead)
        return latency + (steps - crossing) * intra_us + crossing * inter_us
    return latency + 2 * ((ranks // nodes - 1) * intra_us + log_nodes * inter_us)


def enabled_algorithms(nodes: int, nvls: bool) -> tuple[str, ...]:
    """The algorithms the tuner weighs for an all-reduce: Tree and Ring; NVLS on one node, NVLS Tree across nodes
    where the communicator runs NVLink SHARP (tuning.cc 443-448, CollNet off)."""
    if not nvls:
        return ("Tree", "Ring")
    return ("Tree", "Ring", "NVLS") if nodes <= 1 else ("Tree", "Ring", "NVLSTree")


def tuned_all_reduce(ranks: int, nodes: int, intra: str = "nvlink", *, nvls: bool = False) -> tuple[str, str, float]:
    """(algorithm, protocol, µs) the tuner picks for a scalar all-reduce: the least latency of what is enabled
    (enabled_algorithms; `nvls`: the communicator runs NVLink SHARP, nvls_supported) under each protocol, the first
    in NCCL's order on a tie (Tree before Ring before NVLS, LL first)."""
    best = None
    for algorithm in enabled_algorithms(max(1, min(nodes, ranks)), nvls and intra == "nvlink"):
        for protocol in PROTOCOLS:
            if algorithm in NVLS_ALGORITHMS and protocol != "Simple":
                continue
            us = all_reduce_latency_us(algorithm, protocol, ranks, nodes, intra)
            if best is None or us < best[2]:
                best = (algorithm, protocol, us)
    return best
