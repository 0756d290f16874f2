"""NCCL's device buffers, per communicator a rank joins, from NCCL's code (docs/framework-facts.md §115).

Read at NVIDIA/nccl **v2.27.7-1** (the NCCL the Megatron-Bridge 25.11 record assumes, §112; torch's bundled NCCL for
torchtitan's rows is of the same line: the terms below are the same from 2.22, where lazy connection came in):

- **What a connection holds.** A ring connection between two ranks on one channel: the receiver's buffer holds the
  three protocols' FIFOs, LL `NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16 B` = 512 KiB, LL128
  `NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8 B` = 4.6875 MiB, Simple `DEFAULT_BUFFSIZE`
  4 MiB (NCCL_BUFFSIZE) (src/init.cc 618-631, src/include/device.h), beside its ncclRecvMem; the sender's an
  ncclSendMem (and the Simple buffer, under P2P read: Ampere over NVLink, src/graph/paths.cc 365). Each is rounded up
  to `CUDA_IPC_MIN` 2 MiB (src/transport/p2p.cc 377-380, 445-448; src/include/comm.h 35). So a rank's two ends on a
  channel take 2 + 10 MiB (write) or 6 + 6 MiB (read): 12 MiB either way — the 10485760 and 2097152 allocations
  NVIDIA/nccl#1685's log shows on H100.
- **Which connections are made.** With cuMem (default) `NCCL_RUNTIME_CONNECT` 1 (src/init.cc 52, 1148-1154) connects
  nothing at init: the first collective of an algorithm connects its ring (every channel, the previous and the next
  rank: src/transport/generic.cc ncclTransportRingConnect), tree or NVLS buffers (src/group.cc 140-175); point to
  point sends connect `p2pnChannelsPerPeer` channels to their peer (src/graph/paths.cc 841-866). A communicator
  created and never used holds no buffers. Before 2.22 (NVIDIA/nccl#964's NCCL 2.18) init connected the ring and the
  tree eagerly.
- **Channels.** The ring search (src/graph/search.cc 1038-1060) takes the first speed of the compute capability's
  array (`speedArrayIntra` 40 GB/s from SM80, `sm90SpeedArrayIntra` 60, `sm100SpeedArrayIntra` 90) that fits the
  GPU's NVLink bandwidth (links x `SMxx_NVLINK_BW`, src/graph/topo.h) and lays as many rings as that bandwidth holds;
  `ncclTopoDupChannels` (search.cc 937-949) doubles them where the speed is >= 25 (and, past SM80, >= 50 or <= 4
  rings), and `ncclTopoPostset` doubles the result again (src/graph/connect.cc 452). A100 (12 links x 20): 240 / 40
  = 6 rings, 12, 24; H100 (18 x 20.6 = 370.8): 6 at 60, 12, 24 (the "24 coll channels" of H100 logs); B200 / GB200
  (18 x 40.1 = 721.8): 8 at 90, 16, 32. P2P: `p2pnChannelsPerPeer` = pow2Up(min(ring channels, 2 x NVLinks))
  (paths.cc 841-866; ncclTopoGetNchannels): 32 on all three (NVIDIA/nccl#1685: 32 channels a pair of H100s).
- **NVLink SHARP.** `NCCL_NVLS_ENABLE` 2: on where the GPU reports multicast (H100 / B200 NVSwitch systems, GB200
  NVL72) and the communicator has more than two GPUs in its NVLink domain (src/transport/nvls.cc 151-200); its buffer
  on each rank `nvlsChannels x 2 x (NCCL_NVLS_CHUNKSIZE 128 KiB x NCCL_STEPS) x nHeads` (ncclNvlsBufferSetup,
  nvls.cc 316-340), nvlsChannels 16 on SM90, 24 on SM100 inside one NVLink domain, 32 across (nvls.cc 147-149, 193),
  nHeads the NVLS graph's channels, `min(NCCL_MAX_NVLS_ARITY 32, GPUs)` (search.cc 1014), GPUs those of the
  communicator in the rank's node or NVLink domain (a data-parallel group at TP 8 on nodes of 8: one, no NVLS); and its
  credits, `nChannels x 2 x 64 B x nHeads` (nvls.cc 402-433), one 2 MiB granule. Made at the first NVLS collective (a
  large all-reduce, reduce-scatter or all-gather; a one-element all-reduce where NCCL's tuner picks NVLS or NVLS
  Tree for it, planner/cost/nccltuner.py: more than 16 ranks of one NVLink domain, GB200 NVL72's). None where the
  launch sets NCCL_NVLS_ENABLE=0 (the setting nccl_nvls_off: Megatron-Bridge's performance runs, "Disable NVLink SHARP
  to save memory", scripts/performance/utils/executors.py 42 at 00b7660b; Megatron-LM's functional tests).

What is not read here: the NET transport's buffers where a ring crosses nodes (src/transport/net.cc: its send side
in host memory, shared buffers for point to point; ckplan charges the P2P figure a channel), the tree's extra
connections under 2.22+ (the tuner's choice of tree for small all-reduces), an expert-parallel all-to-all's
point-to-point connections to every peer (the EP group is charged as a collective group; NVIDIA/nccl#1685: 32
channels a peer on H100) and HybridEP / DeepEP's own buffers, TE's userbuffers, CollNet, RCCL (MI300X:
NVIDIA/nccl#964's measurement stays, `MEASURED_*`), and GPUs without NVLink (the same)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import nccltuner, runtimes
from planner.models.network_rate import ranks_per_node

MIB = 1 << 20
KIB = 1 << 10

# src/include/device.h (v2.27.7-1)
NCCL_STEPS = 8
LL_BYTES = 8 * 512 * NCCL_STEPS * 16  # NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x steps x ncclLLFifoLine
LL128_BYTES = 120 * 640 * NCCL_STEPS * 8  # NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x steps x uint64
SIMPLE_BYTES = 1 << 22  # src/init.cc DEFAULT_BUFFSIZE (NCCL_BUFFSIZE)
CUDA_IPC_MIN = 2 * MIB  # src/include/comm.h: every P2P connection's allocation is a multiple
# sizeof(ncclSendMem) / sizeof(ncclRecvMem): a few KiB of head, tail and FIFO pointers (device.h); under 2 MiB either
# way, so the rounding to CUDA_IPC_MIN absorbs them: counted as one 4 KiB page each
CONN_HEAD_BYTES = 4 * KIB
MAXCHANNELS = 64  # device.h
NVLS_CHUNK_BYTES = 128 * KIB  # nvls.cc NCCL_NVLS_CHUNKSIZE
NVLS_MAX_ARITY = 32  # device.h NCCL_MAX_NVLS_ARITY
NVLS_CREDIT_BYTES = 64  # nvls.cc 404: memSize of a credit, nChannels x 2 x nHeads of them
NVLS_CHANNELS = {90: 16, 100: 24}  # nvls.cc NVLS_NCHANNELS_SM90, NVLS_NCHANNELS_SM100_NVL (one NVLink domain)
NVLS_CHANNELS_MULTI_NODE = {90: 16, 100: 32}  # NVLS_NCHANNELS_SM100 across nodes
NET_PEER_CHANNELS = 2  # src/graph/paths.cc ncclTopoGetNchannels: a remote peer, NCCL_NCHANNELS_PER_NET_PEER unset
NVLINK_BW = {80: 20.0, 90: 20.6, 100: 40.1}  # src/graph/topo.h SM80/SM90/SM100_NVLINK_BW, GB/s a link
SPEEDS_INTRA = {80: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),  # search.cc 952-962
                90: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                100: (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}

# NVIDIA/nccl issue 964: GPU memory per NCCL communicator, PyTorch on 4 A100s over NVLink, NCCL 2.18 (eager ring and
# tree): where no NCCL GPU below is known (RCCL, PCIe-only GPUs) ckplan charges these measured figures
MEASURED_PAIR_BYTES = 544 * MIB
MEASURED_GROUP_BYTES = 688 * MIB


@dataclass(frozen=True)
class NcclGpu:
    """What NCCL's buffers depend on: the compute capability x 10, the NVLinks, multicast (NVLS) support."""
    capability: int
    nvlinks: int
    multicast: bool


# compute capability and NVLink count from the GPUs' datasheets (A100 SXM: 12 NVLink 3; H100 / H200 SXM, GH200: 18
# NVLink 4; B200, GB200: 18 NVLink 5); multicast: an NVSwitch fabric (HGX H100 / H200 / B200, GB200 NVL72)
NCCL_GPUS = {
    "a100-40g": NcclGpu(80, 12, False), "a100-80g": NcclGpu(80, 12, False),
    "h100-sxm": NcclGpu(90, 18, True), "h100-96g": NcclGpu(90, 18, True), "h200": NcclGpu(90, 18, True),
    "b200": NcclGpu(100, 18, True), "gb200": NcclGpu(100, 18, True),
}


def _align(nbytes: int, to: int) -> int:
    return -(-nbytes // to) * to


def connection_bytes(gpu: NcclGpu) -> int:
    """A rank's two ends of one channel's connection to a peer: its receive buffer (the three protocols' FIFOs, less
    Simple under P2P read) and its send buffer (Simple under P2P read), each rounded to CUDA_IPC_MIN."""
    read = gpu.capability == 80  # paths.cc 365: P2P read on Ampere over NVLink
    recv = CONN_HEAD_BYTES + LL_BYTES + LL128_BYTES + (0 if read else SIMPLE_BYTES)
    send = CONN_HEAD_BYTES + (SIMPLE_BYTES if read else 0)
    return _align(recv, CUDA_IPC_MIN) + _align(send, CUDA_IPC_MIN)


def ring_channels(gpu: NcclGpu) -> int:
    """The ring channels NCCL lays on the GPU's NVLinks: the first speed the links' bandwidth reaches, as many rings
    as it holds, doubled by ncclTopoDupChannels."""
    bandwidth = gpu.nvlinks * NVLINK_BW[gpu.capability]
    speed = next(s for s in SPEEDS_INTRA[gpu.capability] if s <= bandwidth)
    rings = min(int(bandwidth // speed + 1e-9), MAXCHANNELS // 2)
    if not (speed < 25.0 or (gpu.capability > 80 and speed < 50.0 and rings > 4)):
        rings = min(2 * rings, MAXCHANNELS // 2)  # ncclTopoDupChannels (graph->maxChannels: MAXCHANNELS / 2)
    return min(2 * rings, MAXCHANNELS)  # ncclTopoPostset: "Duplication should be complete now"


def p2p_channels_per_peer(gpu: NcclGpu) -> int:
    """p2pnChannelsPerPeer: pow2Up of the ring channels or the peer's 2 x NVLinks, whichever is fewer."""
    fewest = min(ring_channels(gpu), 2 * gpu.nvlinks)
    return 1 << (fewest - 1).bit_length()


def nvls_bytes(gpu: NcclGpu, ranks: int, domain: int, local: int = 0) -> int:
    """NVLink SHARP's buffer and credits on a rank of a communicator of `ranks` in NVLink domains of `domain` GPUs,
    `local` of them in the rank's domain (0: as many as fit, min(ranks, domain)); 0 where NCCL does not run NVLS (no
    multicast, or two GPUs or fewer of the communicator in the domain: nccltuner.nvls_supported)."""
    local = local or min(ranks, domain)
    if not nccltuner.nvls_supported(multicast=gpu.multicast, local_gpus=local):
        return 0
    channels = (NVLS_CHANNELS_MULTI_NODE if ranks > local else NVLS_CHANNELS)[gpu.capability]
    heads = min(NVLS_MAX_ARITY, local)
    buffer = _align(channels * 2 * NVLS_CHUNK_BYTES * NCCL_STEPS * heads, CUDA_IPC_MIN)
    return buffer + _align(channels * 2 * NVLS_CREDIT_BYTES * heads, CUDA_IPC_MIN)


@dataclass(frozen=True)
class Communicator:
    """One communicator a rank uses: its name (the group), its ranks, and what it runs: "collective" (ring, and
    NVLS where it applies), "sharded" (reduce-scatters, all-gathers or reduces of a sharded data-parallel group, and
    one-element all-reduces: as "collective" inside one node or domain; across them NCCL runs no NVLS for the sized
    ones, src/graph/tuning.cc 301-304 without CollNet, so NVLS only where its tuner picks it for the scalars), "small"
    (one-element all-reduces only: the ring, or NVLS where NCCL's tuner picks it for 4 B, nccltuner.tuned_all_reduce),
    "p2p" (sends to and receives from one peer in its NVLink domain) or "p2p-net" (a peer in another node); `local`:
    its ranks in the rank's NVLink domain (0: min(ranks, domain))."""
    name: str
    ranks: int
    kind: str = "collective"
    local: int = 0


def communicator_bytes(comm: Communicator, gpu: NcclGpu | None, *, domain: int, nvls: bool = True) -> int:
    """NCCL's device buffers on one rank for `comm` (NCCL 2.22+: the connections its use makes); a group of one has
    none; `gpu` None (no NCCL GPU known): NVIDIA/nccl#964's measured figures; `nvls` False: NCCL_NVLS_ENABLE=0."""
    if comm.ranks <= 1:
        return 0
    if gpu is None:
        return MEASURED_PAIR_BYTES if comm.ranks == 2 else MEASURED_GROUP_BYTES
    if comm.kind == "p2p":
        return p2p_channels_per_peer(gpu) * connection_bytes(gpu)
    if comm.kind == "p2p-net":  # paths.cc 816-823: a peer over the network starts from 2 channels a NIC
        return min(NET_PEER_CHANNELS, p2p_channels_per_peer(gpu)) * connection_bytes(gpu)
    ring = ring_channels(gpu) * connection_bytes(gpu)
    local = comm.local or min(comm.ranks, domain)
    scalars_only = comm.kind == "small" or (comm.kind == "sharded" and comm.ranks > local)
    if not nvls or (scalars_only and not _scalar_runs_nvls(gpu, comm.ranks, local)):
        return ring
    return ring + nvls_bytes(gpu, comm.ranks, domain, local)


def _scalar_runs_nvls(gpu: NcclGpu, ranks: int, local: int) -> bool:
    """Whether NCCL's tuner picks NVLS or NVLS Tree for a 4 B all-reduce of `ranks`, `local` a domain (NVLink)."""
    supported = nccltuner.nvls_supported(multicast=gpu.multicast, local_gpus=local)
    return nccltuner.tuned_all_reduce(ranks, -(-ranks // local), nvls=supported)[0] in nccltuner.NVLS_ALGORITHMS


def eager_ring_tree_bytes(gpu: NcclGpu, ranks: int) -> int:
    """What NCCL before 2.22 connected at init on rank 0 of a communicator inside one node: the ring, and the tree's
    connections the ring does not already hold. The tree is a chain through the node from rank 0: rank 0 sends to
    and receives from its child, the ring's next, to which it already sends; so a receive end more a channel (the
    receiver's buffer: P2P read's 6 MiB on A100, write's 10 MiB elsewhere); two ranks: the ring's peer both ways,
    nothing more. NVIDIA/nccl#964's setup."""
    ring = ring_channels(gpu) * connection_bytes(gpu)
    read = gpu.capability == 80
    receive = _align(CONN_HEAD_BYTES + LL_BYTES + LL128_BYTES + (0 if read else SIMPLE_BYTES), CUDA_IPC_MIN)
    return ring if ranks == 2 else ring + ring_channels(gpu) * receive


def profile_nccl_gpu(profile) -> NcclGpu | None:
    """The NCCL GPU of a cuda profile (its recorded GPU, or its device's name), None where none is known."""
    from planner.cost.dataparallel import profile_gpu
    from planner.errors import UserError

    try:
        return NCCL_GPUS.get(profile_gpu(profile).name)
    except UserError:
        return None


def rank_communicators(stage: int, setup, profile) -> list[Communicator]:
    """The communicators the rank holding `stage` runs NCCL in: a point-to-point peer per pipeline neighbour
    (ProcessGroupNCCL's sends), its data-parallel group (HSDP: its shard and its replica group), the experts' groups
    where the profile has experts, the tensor-parallel group of an analytic profile, and under Megatron-LM the groups
    megatron_communicators names."""
    comms = []
    stages = setup.pipeline.stages
    neighbours = (stage > 0) + (stage < stages - 1)
    if setup.pipeline.chunks > 1:  # a rank's chunks talk to both its neighbours
        neighbours = min(2, stages - 1)
    peers = [stage - 1] * (stage > 0) + [stage + 1] * (stage < stages - 1)
    if setup.pipeline.chunks > 1:  # a rank's chunks talk to both its neighbours (the ring: last to first)
        peers = [(stage - 1) % stages, (stage + 1) % stages][:neighbours]
    comms += [Communicator(f"pp-peer-{i}", 2, "p2p-net" if _crosses(stage, peer, setup) else "p2p")
              for i, peer in enumerate(peers)]
    dp, shard, ep = setup.data_parallel.dp, setup.data_parallel.shard_group, setup.data_parallel.ep
    tp = profile.assumptions.get("tp", 1)
    tp = tp if isinstance(tp, int) else 1
    domain = setup.comm.domain

    def group(name: str, ranks: int, stride: int, kind: str = "collective") -> Communicator:
        """A group of `ranks` lying `stride` ranks apart, with its ranks in the rank's NVLink domain."""
        return Communicator(name, ranks, kind, ranks_per_node(ranks, stride, domain))

    # ZeRO >= 1 shards: reduce-scatters and gathers (torchtitan's FSDP2, Megatron's distributed optimizer), or
    # DeepSpeed's ZeRO 1 / 2 reduces to each partition's owner; ZeRO 0 (DDP) and HSDP's replicas all-reduce
    sharded = "sharded" if getattr(setup.data_parallel, "zero", 0) >= 1 else "collective"
    if shard is not None:
        comms += [group("dp-shard", shard, tp, "sharded"), group("dp-replica", dp // shard, tp * shard)]
    else:
        comms.append(group("dp", dp, tp, sharded))
    if ep > 1 and any(layer.expert_param_count for layer in profile.layers):
        comms += [group("ep", ep, tp), group("expert-dp", dp // ep, tp * ep, sharded)]
    comms.append(group("tp", tp, 1))
    training = getattr(setup, "training", None)
    if training is not None and runtimes.of(training).side_communicators:
        comms += megatron_communicators(setup, tp)
    return [c for c in comms if c.ranks > 1]


def megatron_communicators(setup, tp: int) -> list[Communicator]:
    """The further communicators a Megatron-LM rank runs collectives in (megatron-core 92c8482e; each a process group
    of its own, so an NCCL communicator of its own, created by ProcessGroupNCCL at its first collective:
    initialize.py 342-355 passes no device_id): the default group's barriers (megatron/training/initialize.py 221-229,
    399-401: a one-element all-reduce over every rank), the model-parallel group (TP x PP) the gradients' norm and
    zeros are summed over (megatron/core/optimizer/clip_grads.py 96-132, optimizer.py 161-177), and TE's
    context-parallel ring, point to point with its two neighbours (one where CP is 2)."""
    cp = getattr(setup.comm, "cp", 1)
    stages, dp = setup.pipeline.stages, setup.data_parallel.dp
    world, domain = stages * dp * tp * cp, setup.comm.domain
    stages_local = ranks_per_node(stages, tp * dp * cp, domain)  # the pipeline's ranks tp x dp x cp apart
    comms = [Communicator("world", world, "small", min(world, domain)),
             Communicator("model-parallel", tp * stages, "small", min(tp * stages_local, domain))]
    if cp > 1:
        comms += [Communicator(f"cp-peer-{i}", 2, "p2p") for i in range(min(2, cp - 1))]
    return comms


def _crosses(rank: int, peer: int, setup) -> bool:
    """Whether pipeline rank `rank`'s peer lies in another node (comm.edge_crosses_nodes; False where the setup
    names no pp_stride)."""
    from planner.cost.comm import edge_crosses_nodes

    stride = getattr(setup.comm, "pp_stride", 0)
    return bool(stride) and edge_crosses_nodes(rank, peer, stride=stride, gpus_per_node=setup.comm.domain)


def rank_buffers(stage: int, setup, profile) -> dict[str, int]:
    """Each communicator's NCCL buffers on the rank holding `stage` (communicator_bytes), by name."""
    gpu = profile_nccl_gpu(profile)
    domain = setup.comm.domain
    nvls = not getattr(getattr(setup, "training", None), "nccl_nvls_off", False)
    return {c.name: communicator_bytes(c, gpu, domain=domain, nvls=nvls)
            for c in rank_communicators(stage, setup, profile)}


def gpu_fields(profile, gpu, nics_per_gpu: float | None = None) -> dict:
    """The setup's nccl_capability and nccl_nics_per_gpu, which NCCL's tuner on a sized all-reduce reads
    (planner/cost/sizedreduce.py), for a cuda profile's GPU record `gpu` (planner/models/gpus.py; its NICs, or
    --nics-per-gpu), where NCCL_GPUS knows its capability; {} elsewhere (a CPU, an AMD GPU under RCCL: the ring's
    rate alone)."""
    known = NCCL_GPUS.get(getattr(gpu, "name", None)) if profile.device.type == "cuda" else None
    if known is None:
        return {}
    return {"nccl_capability": known.capability, "nccl_nics_per_gpu": nics_per_gpu or gpu.nics_per_gpu}
