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

A sized all-reduce (tuned_sized_all_reduce, docs/framework-facts.md §148): the same latencies (by version: v2.21.5's
Tree / Simple and ring steps differ) plus tuning.cc's bandwidths on the ring graph's channels, the least latency +
bytes / bandwidth over Tree and Ring under LL, LL128 and Simple; planner/cost/sizedreduce.py runs it for the
data-parallel all-reduce across nodes.
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
V2_27, V2_21 = "2.27.7", "2.21.5"
# v2.21.5-1 tuning.cc 56-77: Tree / Simple's baseLat 0 and hwLat 28 µs on NVLink, PCI and the network alike
V2_21_TREE_SIMPLE_US = 28.0
NET_OVERHEAD_US = 1.0  # getNetOverhead on an Intel x86 or an ARM host (tuning.cc 201-209; AMD's 2.0 not read)
SIMPLE_OVERHEAD_FACTOR = 3
NVLS_ALGORITHMS = ("NVLS", "NVLSTree")
NVLS_MIN_GPUS = 3  # nvls.cc 160: more than two GPUs of the communicator in the node / NVLink domain


def ring_inter_steps(kind: str, ranks: int, nodes: int, version: str = V2_27) -> int:
    """Of a ring `kind`'s steps (n-1 for an all-gather or a reduce-scatter, 2(n-1) for an all-reduce) over `ranks`
    ranks on `nodes` nodes, those tuning.cc's ncclTopoTuneModel charges at the network's latency (the rest at the
    node's): none on one node; nodes - 1 for an all-gather or a reduce-scatter; for an all-reduce 2(nodes - 1) from
    v2.23 (v2.23.4-1 258, v2.27.7-1 354: `nInterSteps`), 2 x nodes at v2.21.5-1 (161-163; more than the ring's 2(n-1)
    steps where one rank a node, which the model then charges as two steps fewer at the node's latency)."""
    if kind not in ("all-gather", "reduce-scatter", "all-reduce"):
        raise ValueError(f"no NCCL ring step split for {kind!r}")
    nodes = max(1, min(nodes, ranks))
    if nodes == 1:
        return 0
    if kind != "all-reduce":
        return nodes - 1
    return 2 * nodes if version == V2_21 else 2 * (nodes - 1)


def nvls_supported(*, multicast: bool, local_gpus: int, enabled: bool = True) -> bool:
    """Whether a communicator runs NVLink SHARP: NCCL_NVLS_ENABLE not 0 (`enabled`), a GPU with multicast (an
    NVSwitch fabric) and more than two of the communicator's GPUs in the rank's node or NVLink domain."""
    return enabled and multicast and local_gpus >= NVLS_MIN_GPUS


def all_reduce_latency_us(algorithm: str, protocol: str, ranks: int, nodes: int, intra: str = "nvlink",
                          version: str = V2_27) -> float:
    """µs NCCL's model gives an all-reduce of `ranks` ranks over `nodes` nodes under `algorithm` and `protocol`;
    `intra`: the in-node hardware ("nvlink" or "pcie"); `version`: V2_27 (the tables above) or V2_21 (torch 2.6's
    NCCL: Tree / Simple's 0 + 28 µs a hop, no ppn = 1 rule, 2 x nodes network steps in the ring). 0 for one rank."""
    if ranks <= 1:
        return 0.0
    if algorithm not in ALGORITHMS or protocol not in PROTOCOLS:
        raise ValueError(f"unknown NCCL algorithm or protocol {algorithm}/{protocol}")
    if algorithm in NVLS_ALGORITHMS and (protocol != "Simple" or intra != "nvlink"):
        raise ValueError(f"NCCL runs {algorithm} only under Simple over NVLink, not {protocol} over {intra}")
    nodes = max(1, min(nodes, ranks))
    if version not in (V2_21, V2_27):
        raise ValueError(f"no NCCL tuner tables for version {version!r}")
    p = PROTOCOLS.index(protocol)
    old = version == V2_21 and algorithm == "Tree" and protocol == "Simple"
    intra_us = V2_21_TREE_SIMPLE_US if old else HW_US[intra][algorithm][p]
    # "with ppn=1 latencies are fully exposed, use the Tree network latency" (v2.27 only)
    ppn_one = ranks == nodes and version == V2_27
    inter_us = V2_21_TREE_SIMPLE_US if old else HW_US["network"]["Tree" if ppn_one else algorithm][p]
    latency = 0.0 if old else BASE_US[algorithm][p]
    log_nodes = int(math.floor(math.log2(nodes)))
    if algorithm == "NVLS":
        return intra_us + (inter_us if nodes > 1 else 0.0)
    if algorithm == "NVLSTree":
        return latency + intra_us + 2 * log_nodes * inter_us
    if algorithm == "Ring":
        steps, crossing = 2 * (ranks - 1), ring_inter_steps("all-reduce", ranks, nodes, version)
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


# ---------------------------------------------------------------- a sized all-reduce: NCCL's bandwidth model
# tuning.cc (v2.27.7-1 165-189; v2.21.5-1 86-106, no Blackwell row: its compCapIndex stops at Hopper), by arch
# (compCapIndex) and nodes (index2: one node, two, more): llMaxBws (across nodes indexed by the host's CPU, an
# Intel / ARM host's row 0, the one getNetOverhead's 1 µs assumes above), perChMaxRingLL128Bws,
# perChMaxTreeLL128Bws, perChMaxTreeBws, GB/s
ARCHS = ("volta", "ampere", "hopper", "blackwell")
LL_MAX_GBPS = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
               "blackwell": (282.0, 90.0, 70.0)}
RING_LL128_PER_CHANNEL_GBPS = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7,) * 3,
                               "blackwell": (73.4,) * 3}
TREE_LL128_PER_CHANNEL_GBPS = {"volta": (20.0,) * 3, "ampere": (20.0,) * 3, "hopper": (36.7, 36.7, 29.0),
                               "blackwell": (73.4, 73.4, 58.0)}
TREE_PER_CHANNEL_GBPS = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                         "blackwell": (77.4, 82.8, 72.0)}
# treeCorrectionFactor[protocol][log2(bytes / 64)], powers of two from 64 B to 256 MB (tuning.cc 555-560 at
# v2.27.7-1, 398-402 at v2.21.5-1: the same); 1.0 beyond
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9)}
# ncclTopoGetAlgoTime: Ring / Simple's latency x1.4 across nodes once bytes / (channels x ranks) >= 64
RING_PLATEAU = 1.4
# src/graph/search.cc ncclTopoDupChannels (834-848 at v2.21.5-1): a graph at 25 GB/s a channel or more doubles its
# channels at half the speed, but on cc > 80 where under 50 GB/s with more than 4 channels; a ring's maxChannels
# MAXCHANNELS / 2 = 16 (src/init.cc 1051), the tree's the ring's channels (1059)
DUP_MIN_GBPS, DUP_SM90_GBPS, DUP_SM90_CHANNELS, RING_MAX_CHANNELS = 25.0, 50.0, 4, 16


def arch_of(capability: int, version: str = V2_27) -> str:
    """tuning.cc's compCapIndex of a compute capability x 10: Blackwell from 100 (v2.27; Hopper's row at v2.21)."""
    if capability >= 100 and version == V2_27:
        return "blackwell"
    return "hopper" if capability >= 90 else "ampere" if capability >= 80 else "volta"


def graph_channels(bus_gb_per_s: float, nics: int, capability: int) -> tuple[int, float]:
    """(channels, GB/s a channel) of the ring graph NCCL's search finds across nodes, the tree's taken the same: one
    channel a NIC the group's GPUs in a node bring (search.cc ncclTopoSearchRecNet takes each channel's bandwidth off
    one NIC), together the ring's bus rate `bus_gb_per_s` (what ckplan measures a ring at: planner/models/
    network_rate.py), then ncclTopoDupChannels' doubling (DUP_*)."""
    channels = max(1, int(nics))
    speed = bus_gb_per_s / channels
    if speed >= DUP_MIN_GBPS and not (capability > 80 and speed < DUP_SM90_GBPS and channels > DUP_SM90_CHANNELS):
        doubled = min(2 * channels, RING_MAX_CHANNELS)
        speed /= -(-doubled // channels)
        channels = doubled
    return channels, speed


def all_reduce_bandwidth_gbps(algorithm: str, protocol: str, ranks: int, nodes: int, channels: int, speed: float,
                              arch: str, *, version: str = V2_27, ll128: bool = True) -> float:
    """The algorithm bandwidth (GB/s) tuning.cc's ncclTopoTuneModel gives an all-reduce under (algorithm, protocol)
    on a graph of `channels` channels at `speed` GB/s each (Ring and Tree alike); 0 where not run (LL128 off)."""
    if protocol == "LL128" and not ll128:
        return 0.0
    index = 0 if nodes <= 1 else 1 if nodes == 2 else 2
    ll_max = LL_MAX_GBPS[arch if nodes <= 1 else "volta"][index]  # across nodes: row 0, an Intel / ARM host
    bus = channels * speed
    if algorithm == "Ring":
        if protocol == "LL":
            bus = min(ll_max, bus * .5)
        elif protocol == "LL128":
            ppn_factor = 0.7 if version == V2_21 and ranks / max(1, nodes) < 2 else 0.92
            bus = min(bus * ppn_factor, channels * RING_LL128_PER_CHANNEL_GBPS[arch][index])
        return bus * ranks / (2 * (ranks - 1))
    if algorithm != "Tree":
        raise ValueError(f"no sized all-reduce model for {algorithm}")
    bus = min(bus * .92, channels * TREE_PER_CHANNEL_GBPS[arch][index])
    if protocol == "LL":
        bus = min(bus / 3.8, ll_max)
    elif protocol == "LL128":
        bus = min(bus * (7.0 / 9.0 if nodes <= 1 else 120.0 / 128.0),
                  channels * TREE_LL128_PER_CHANNEL_GBPS[arch][index])
    return bus * .5


def all_reduce_time_us(algorithm: str, protocol: str, num_bytes: float, ranks: int, nodes: int, channels: int,
                       speed: float, arch: str, *, intra: str = "nvlink", version: str = V2_27,
                       ll128: bool = True) -> float | None:
    """ncclTopoGetAlgoTime: latency + bytes / (1000 x bandwidth) µs, the tree's bandwidth scaled by
    treeCorrectionFactor at its size and Ring / Simple's latency by the plateau factor across nodes; None where
    the pair is not run."""
    bw = all_reduce_bandwidth_gbps(algorithm, protocol, ranks, nodes, channels, speed, arch, version=version,
                                   ll128=ll128)
    if bw <= 0:
        return None
    latency = all_reduce_latency_us(algorithm, protocol, ranks, nodes, intra, version)
    log_size = int(num_bytes) >> 6
    log_size = log_size.bit_length() - 1 if log_size > 0 else -1
    if algorithm == "Tree" and 0 <= log_size < len(TREE_CORRECTION[protocol]):
        bw *= TREE_CORRECTION[protocol][log_size]
    if algorithm == "Ring" and protocol == "Simple" and nodes > 1 and num_bytes / (channels * ranks) >= 64:
        latency *= RING_PLATEAU
    return latency + num_bytes / (1000 * bw)


def tuned_sized_all_reduce(num_bytes: float, ranks: int, nodes: int, channels: int, speed: float, arch: str, *,
                           intra: str = "nvlink", version: str = V2_27) -> tuple[str, str, float]:
    """(algorithm, protocol, µs) NCCL's tuner picks for an all-reduce of `num_bytes` bytes (topoGetAlgoInfo: the
    least ncclTopoGetAlgoTime over Tree and Ring under LL, LL128 and Simple, the first on a tie in NCCL's order);
    LL128 where the GPUs' NVLink carries it (tuning.cc's pEnable: typeIntra NVLink, NICs at PIX / PXN). NVLS and
    NVLS Tree are not weighed: their graph's channels are not read here (nccltuner's scalar choice weighs them)."""
    if ranks <= 1:
        return "Ring", "Simple", 0.0
    nodes = max(1, min(nodes, ranks))
    best = None
    for algorithm in ("Tree", "Ring"):
        for protocol in PROTOCOLS:
            us = all_reduce_time_us(algorithm, protocol, num_bytes, ranks, nodes, channels, speed, arch, intra=intra,
                                    version=version, ll128=intra == "nvlink")
            if us is not None and (best is None or us < best[2]):
                best = (algorithm, protocol, us)
    return best
