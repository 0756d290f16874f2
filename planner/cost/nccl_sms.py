"""The compute a hidden data-parallel collective slows: NCCL's CTAs take SMs for as long as the collective runs, so
the layers' kernels beside it run on fewer (docs/framework-facts.md §128).

dataparallel.exposed_comm_ms hides a layer's gradient reductions and weight gathers behind its compute and charges
only what they take beyond it. But a collective is a kernel: NCCL launches one CTA a channel (`dim3 grid =
{nChannels, 1, 1}`, src/enqueue.cc 1541 at NVIDIA/nccl v2.27.7-1), each of up to NCCL_MAX_NTHREADS 640 threads and
NCCL's shared memory, resident until the collective ends. A GEMM's CTAs (cuBLAS / CUTLASS on Hopper: a CTA an SM,
most of the shared memory and registers) do not share an SM with it, so the compute beside it runs on S - c of the
GPU's S SMs. Charged at first order: while a collective of c CTAs runs for T ms beside compute of W ms, the compute
loses c x T / S ms of work, made up after the collective ends (`slowed_ms`).

The CTAs (`collective_ctas`), read at NCCL v2.27.7-1 (the record's NCCL, nccl_buffers.py):
  - ring (and tree) collectives: comm->nChannels, the ring channels NCCL lays on the GPU's NVLinks
    (nccl_buffers.ring_channels: 24 on A100 and H100 / H200, 32 on B200 / GB200); NCCL_MAX_CTAS unset: maxCTAs
    defaults to MAXCHANNELS (src/init.cc 1731), which caps nothing. Fewer for a small collective: topoGetAlgoInfo
    (src/enqueue.cc 1831, 1850-1853) drops a channel while nBytes < nc x nt x threadThreshold (Simple:
    NCCL_SIMPLE_MAX_NTHREADS 512 over NVLink, NCCL_SIMPLE_THREAD_THRESHOLD 64: 32 KiB a channel, src/graph/tuning.cc
    214, 522), nBytes the whole buffer (ncclFuncMaxSendRecvCount);
  - NVLink SHARP (all-reduces where the GPU has multicast, the group has more than two GPUs in the NVLink domain and
    the launch leaves NCCL_NVLS_ENABLE on: nccltuner.nvls_supported, nvls.cc 151-175; NVLS_TREE across nodes):
    comm->nvlsChannels, 16 on SM90, 24 on SM100 inside one NVLink domain, 32 across (src/transport/nvls.cc
    147-198; enqueue.cc 1846-1847: "NVLS should not need more than 16 channels"). Under NCCL_NVLS_ENABLE=0 (the
    setting nccl_nvls_off: Megatron-Bridge's executor, Megatron-LM's functional tests) the all-reduce runs the
    ring's channels as any other (framework-facts §147);
  - a ring across nodes: one ring a NIC, doubled once (network_ring_channels: 16 on an 8-NIC node);
  - all-gathers and reduce-scatters run the ring: NCCL's tuner prices NVLS below it on one node (NVIDIA/nccl#1083: NVLS
    sends S where the ring sends (N-1)S/N) and turns NVLS off for them across nodes without CollNet (tuning.cc 301-304);
  - RCCL on an 8-GPU MI300X node: 28 rings of its MI300X model (src/graph/rome_models.cc rome_model_79, 8 GPUs on 7
    xGMI links each, no NIC: NCCL trims the NICs of a one-node job), doubled to 56 (src/graph/connect.cc: up to
    MAXCHANNELS 128 on gfx94), a workgroup a channel, of the MI300X's 304 compute units (ROCm/rccl 0cbce2a7).
  Not read, so not charged: a GPU without NVLink (PCIe H100, L4), GH200, MI300X across nodes. The NICs are the GPU
  record's (nics_per_gpu x the ranks of a group in one NVLink domain: setup.comm.domain, GB200's 72 where no block is given).

What the frameworks set: torchtitan and DeepSpeed set no NCCL_MAX_CTAS / NCCL_MIN_CTAS (nor pass a ProcessGroupNCCL
config with max_ctas); Megatron-LM passes one only under --nccl-communicator-config-path (none in the rows).

Checked against published measurements, not fitted: Lee et al., "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, 2025) measure the compute overlapped with collectives on
A100, H100, MI250 and MI210 slowed by 18.9% on average (40.0% at most) against running alone; at 24 of 132 SMs the
first order slows it by 132 / 108 - 1 = 22.2%, at 24 of 108 (A100) by 28.6%. The first order leaves out the GEMM's
wave quantisation (an H100 GEMM of exactly 132 CTAs beside a 24-CTA all-gather runs a second wave: nearly twice
its time, NVIDIA's developer forum, 2025) and the HBM both read, so it is a floor where the GEMMs are wave-bound.

A collective's time here is its bytes at the link (dataparallel.collectives_ms) and, for FSDP2's units, NCCL's ring
latency (fsdp2work.unit_latency_ms, `fsdp2_latency_ms`): the CTAs are resident from the kernel's launch to its end,
through the ring's steps' waits as through its copies. DeepSpeed's and Megatron-FSDP's carry their bytes alone.

Where: the layers whose collectives dataparallel.exposed_comm_ms hides (FSDP2 and DeepSpeed's ZeRO 3 prefetches
and reductions, DDP's overlapped reductions, Megatron-LM's --overlap-param-gather under a schedule in closed form),
window by window as it hides them; and Megatron-LM's DDP under interleaving, where megatron_dp.py's simulation
places the collectives on a side stream: each takes its share (`collective_shares`) of the SMs while it runs, and the rank's compute
beside it runs at 1 - that share of its rate (schedule_time.Issue.share). Not here: reductions a pipeline runs after
its last backward (pipereduce.py), FSDP2's first unit (exposed whole,
fsdp2work.edge_units_exposed_ms), AsyncTP's copies (copy engines, no SMs: framework-facts §126)."""

from __future__ import annotations

from planner.cost import dataparallel as dp
from planner.cost import deepspeed_waits, fsdp2work, fsdpunits, nccltuner, runtimes
from planner.cost.layers import LayerCost
from planner.cost.nccl_buffers import (
    NCCL_GPUS,
    NVLS_CHANNELS,
    NVLS_CHANNELS_MULTI_NODE,
    ring_channels,
)
from planner.cost.rules import compute_ms
from planner.errors import UserError
from planner.schema import Profile, TrainSetup

SIMPLE_THREADS = 512  # device.h NCCL_SIMPLE_MAX_NTHREADS, the ring's Simple threads over NVLink (tuning.cc 214)
SIMPLE_THREAD_THRESHOLD = 64  # src/include/comm.h NCCL_SIMPLE_THREAD_THRESHOLD, bytes a thread
RCCL_MI300X_NODE_CHANNELS = 56  # rome_model_79's 28 rings, doubled (connect.cc), ROCm/rccl 0cbce2a7


def collective_ctas(gpu_name: str, kind: str, nbytes: float, *, ranks: int, local_ranks: int,
                    nics_per_node: int = 8, nvls: bool = True) -> int:
    """CTAs (channels) NCCL launches for one collective of `nbytes` (its whole buffer) of `kind` "all-gather",
    "reduce-scatter" or "all-reduce" among `ranks`, `local_ranks` of them in one NVLink domain whose node has
    `nics_per_node` NICs; `nvls` False: the launch sets NCCL_NVLS_ENABLE=0 (an all-reduce then runs the ring's
    channels); 0 where not read."""
    if ranks <= 1 or nbytes <= 0:
        return 0
    if gpu_name == "mi300x":
        return _fewer_for_size(RCCL_MI300X_NODE_CHANNELS, nbytes) if ranks == local_ranks == 8 else 0
    gpu = NCCL_GPUS.get(gpu_name)
    if gpu is None:
        return 0
    if kind == "all-reduce" and nccltuner.nvls_supported(multicast=gpu.multicast, local_gpus=local_ranks,
                                                         enabled=nvls):
        return (NVLS_CHANNELS_MULTI_NODE if ranks > local_ranks else NVLS_CHANNELS)[gpu.capability]
    rings = ring_channels(gpu) if ranks == local_ranks else network_ring_channels(nics_per_node, gpu.capability)
    return _fewer_for_size(min(rings, ring_channels(gpu)), nbytes)


def network_ring_channels(nics_per_node: int, capability: int) -> int:
    """A ring across nodes: the search (src/graph/search.cc 1036-1160) lays one ring a NIC at the first speed of
    the inter-node array a NIC carries (400 Gb/s: 48 GB/s on SM90 / SM100, sm90SpeedArrayInter,
    sm100SpeedArrayInter; 200 Gb/s: 24 on A100, speedArrayInter); ncclTopoDupChannels does not double them (under
    50 GB/s with more than 4 rings past SM80; under 25 on A100: search.cc 937-949; past SM80 with 4 NICs or fewer
    it does), and ncclTopoPostset doubles: 2 a NIC, 16 on an 8-NIC node (NVIDIA/nccl#1453's
    log of 3 H100 nodes: "Channel 05/16")."""
    doubled = capability > 80 and nics_per_node <= 4  # A100's 24 GB/s rings stay single (under 25)
    return (4 if doubled else 2) * nics_per_node


def _fewer_for_size(channels: int, nbytes: float) -> int:
    """topoGetAlgoInfo's ring: one channel fewer while the buffer is under channels x threads x threshold."""
    return max(1, min(channels, int(nbytes // (SIMPLE_THREADS * SIMPLE_THREAD_THRESHOLD))))


def slowed_ms(collective_ms: float, compute_ms_: float, lost_ms: float) -> float:
    """What compute of `compute_ms_` beside a collective of `collective_ms` adds to the window's max(compute,
    collective) when it loses `lost_ms` of work while the collective runs (its CTAs' share x its time): the compute
    ends at compute + lost where that is past the collective's end, else the collective's end rules."""
    return max(0.0, compute_ms_ + lost_ms - max(compute_ms_, collective_ms))


def layer_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """Per iteration, what NCCL's CTAs add to the compute the layer's hidden gathers and reductions run beside,
    window by window as dataparallel.exposed_comm_ms hides them; 0 where nothing is hidden or no CTA count is read."""
    from planner.models.gpu_sms import (
        sm_count,  # GPU data, read where the profile's GPU is (as profile_gpu does)
    )

    if not _hidden_here(layer, profile, setup):
        return 0.0
    try:
        gpu = dp.profile_gpu(profile)
    except UserError:
        return 0.0
    gather, reduce = dp.collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                                       fp8_count=layer.float8_param_count, frozen=layer.frozen_param_count)
    reduce -= deepspeed_waits.waited_reduce_ms(layer, profile, setup)  # beside no GEMM: the host waits for them
    gather_share, reduce_share = layers_shares(gpu, sm_count(gpu), setup, [layer])
    fwd, bwd = compute_ms(layer.fwd_ms, setup.time), compute_ms(layer.bwd_ms, setup.time)
    return sum(n * slowed_ms(t, w, lost) for n, t, w, lost in _windows(gather, reduce, fwd, bwd, setup,
                                                                       gather_share, reduce_share))


def _hidden_here(layer: LayerCost, profile: Profile, setup: TrainSetup) -> bool:
    """Whether exposed_comm_ms hides this layer's collectives behind its own compute (see the module's Where)."""
    if setup.data_parallel.dp == 1 or dp.ddp_buckets(setup) or not (dp.overlaps_comm(setup)
                                                                     or dp.gathers_in_forward(setup)):
        return False
    return fsdp2work.edge_units_exposed_ms(layer, profile, setup) == 0.0


def _windows(gather: float, reduce: float, fwd: float, bwd: float, setup: TrainSetup, gather_share: float,
             reduce_share: float) -> list[tuple[int, float, float, float]]:
    """(count, collective ms, compute ms, compute lost ms) of each window exposed_comm_ms hides collectives in."""
    reductions = dp.reductions_per_iteration(setup)
    reduce_once = reduce / reductions if reductions else 0.0
    m = setup.pipeline.microbatches
    if not dp.overlaps_comm(setup):  # only --overlap-param-gather's gathers, each behind its forward
        return [(1, gather, fwd, gather * gather_share)]
    if setup.data_parallel.zero >= 3 and not dp.kept_whole(setup):
        latency_gather, latency_reduce = fsdp2_latency_ms(setup)
        gather_once = gather / (2 * m) + latency_gather
        reduce_once += latency_reduce if reductions else 0.0
        each = reduce_once * (reductions > 1)
        windows = [(m, gather_once, fwd, gather_once * gather_share),
                   (m, gather_once + each, bwd, gather_once * gather_share + each * reduce_share)]
        return windows + ([] if reductions > 1 else [(1, reduce_once, bwd, reduce_once * reduce_share)])
    gathers = [(1, gather, fwd, gather * gather_share)] if dp.gathers_in_forward(setup) else []
    if dp.reduced_after_last_backward(setup):  # the schedule carries the reductions (pipereduce.py)
        return gathers
    return [(reductions, reduce_once, bwd, reduce_once * reduce_share)] + gathers


def fsdp2_latency_ms(setup: TrainSetup) -> tuple[float, float]:
    """(one all-gather, one reduction): NCCL's ring latency of an FSDP2 unit's collectives
    (fsdp2work.unit_latency_ms), which its CTAs hold the SMs through beside the bytes, where FSDP2's units are
    charged per moment (a record whose units were read, ZeRO 3 resharded after forward: fsdpunits); (0, 0) elsewhere
    (DeepSpeed's and Megatron-FSDP's collectives: their bytes alone, as dataparallel.exposed_comm_ms charges them)."""
    units = runtimes.of(setup.training).fsdp_units
    if units not in fsdp2work.ORDERED_UNITS or not fsdpunits.regathered_per_moment(setup, units):
        return 0.0, 0.0
    return fsdp2work.unit_latency_ms(setup)


def layers_shares(gpu, sms: int, setup: TrainSetup, layers) -> tuple[float, float]:
    """(gather, reduce): the share of the GPU's SMs the layers' gathers and reductions take over their time, each
    collective at its own group's CTAs: the dense parameters' in the data-parallel group, the routed experts' (the
    rank's 1/E) in the expert-data-parallel group (dataparallel.expert_setup: dp / E ranks, tp x E ranks apart
    in Megatron-LM's order tp-cp-ep-dp, as nccl_buffers.rank_communicators places them), weighted by the time each
    runs (dataparallel.collectives_ms's two parts)."""
    dense = sum(layer.param_count - layer.expert_param_count for layer in layers)
    fp8 = sum(layer.float8_param_count for layer in layers)
    held = sum(dp.held_expert_params(layer.expert_param_count, setup) for layer in layers)
    dense_ms = dp.collectives_ms(dense, setup, fp8_count=fp8)
    if not held:
        return tuple(gpu_share(gpu, sms, setup, which, dense, fp8_count=fp8) for which in ("gather", "reduce"))
    experts = dp.expert_setup(setup)
    expert_ms = dp.collectives_ms(int(held), experts)
    shares = []
    for index, which in enumerate(("gather", "reduce")):
        total = dense_ms[index] + expert_ms[index]
        lost = (dense_ms[index] * gpu_share(gpu, sms, setup, which, dense, fp8_count=fp8)
                + expert_ms[index] * gpu_share(gpu, sms, experts, which, int(held),
                                               stride=setup.comm.tp * setup.data_parallel.ep))
        shares.append(lost / total if total else 0.0)
    return shares[0], shares[1]


def gpu_share(gpu, sms: int, setup: TrainSetup, which: str, count: int, *, fp8_count: int = 0,
              stride: int | None = None) -> float:
    """The share of the GPU's `sms` SMs one gather ("gather") or reduction ("reduce") of `count` parameters takes: its
    CTAs over the SMs, in the shard group (a reduction with no shard group, or ZeRO 1 on a record that all-reduces: an
    all-reduce over the data-parallel group), whose ranks lie `stride` apart (default the setup's tp, the
    data-parallel group's, as nccl_buffers.rank_communicators places it; a node holds per_node / stride of them
    where the group spans nodes: network_rate.ranks_per_node)."""
    from planner.models.network_rate import ranks_per_node

    if not sms:
        return 0.0
    group, per_node = dp.shard_size(setup), setup.comm.domain
    kind = "all-gather"
    if which == "gather":
        nbytes = dp.gathered_bytes(count, setup, fp8_count=fp8_count)
    else:
        nbytes = count * dp.param_bytes(setup).grads
        kind = "reduce-scatter"
        if group == 1 or (setup.data_parallel.zero == 1 and runtimes.of(setup.training).zero1_all_reduces):
            kind, group = "all-reduce", setup.data_parallel.dp
    nics = max(1, round(per_node * gpu.nics_per_gpu))  # the record's NICs (not a --nics-per-gpu, which the setup drops)
    stride = setup.comm.tp if stride is None else stride
    ctas = collective_ctas(gpu.name, kind, nbytes, ranks=group, local_ranks=ranks_per_node(group, stride, per_node),
                           nics_per_node=nics,
                           nvls=not setup.training.nccl_nvls_off)
    return min(ctas, sms) / sms


def collective_shares(profile: Profile | None, setup: TrainSetup, layers) -> tuple[float, float]:
    """layers_shares on the profile's GPU ((0, 0) without a profile, or where its GPU or SMs are not known): for a
    simulation's side stream (megatron_dp.py), whose collectives take the share while they run."""
    from planner.models.gpu_sms import (
        sm_count,  # GPU data, read where the profile's GPU is (as layer_ms does)
    )

    if profile is None or setup.data_parallel.dp == 1:
        return 0.0, 0.0
    try:
        gpu = dp.profile_gpu(profile)
    except UserError:
        return 0.0, 0.0
    return layers_shares(gpu, sm_count(gpu), setup, layers)


# the cost model's row (planner/cost/terms.py splices it into TERMS)
ROWS = (
    ("NCCL's CTAs beside the compute a hidden gather or reduction runs with", "step", "layer",
     lambda layer, ckpt, ctx: layer_ms(layer, ctx.profile, ctx.setup),
     "a CTA a channel for the collective's time (NCCL v2.27.7-1 enqueue.cc, tuning.cc; RCCL's MI300X rings), "
     "over the GPU's SMs (models/gpu_sms.py), x the time dataparallel.exposed_comm_ms hides it (nccl_sms.py)"),
)
