"""Communication from bytes over the topology: one function per collective, each its bytes
formula and its ring algorithm's factor, over the link its group crosses.

A ring collective over n ranks moves, per rank, of a tensor of B bytes (the whole tensor: an
all-gather's output, a reduce-scatter's input, an all-reduce's tensor):
    all-gather, reduce-scatter   (n-1)/n · B     in n-1 steps
    all-reduce                   2(n-1)/n · B    in 2(n-1) steps (a reduce-scatter, then an all-gather)
    all-to-all                   (n-1)/n · B     in n-1 steps (every rank keeps 1/n of its own)
    send (point to point)        B               in 1 step
and takes latency + moved / bus bandwidth. The latency is NCCL's own model of its Ring / Simple
protocol (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel, NCCL 2.23+: a base of 8.4 µs
per collective, then per step 3.4 µs over NVLink, 5.7 µs over PCIe, 14.0 µs over the network).
A ring over N nodes with several ranks in each crosses the network on only some of its steps
(ring_latency_ms: N-1 of an all-gather's or a reduce-scatter's n-1, 2(N-1) of an all-reduce's
2(n-1)); the rest run at the node's step, at least the network post overhead NCCL adds to an
inter-node ring's steps (3 µs under Simple on an Intel or ARM host). An all-to-all (NCCL's
grouped sends, outside the ring model) and a send keep every step at their link's figure.
The bus bandwidth is the link's datasheet rate (planner/models/gpus.py), or inside a node the
collective's busbw measured by nccl-tests where one is published (H100: all-gather 350, reduce-
scatter 360 GB/s against NVLink's 450 one way, NVIDIA/nccl#1281; all_reduce_perf with NVLink
SHARP reaches 460-480).

Which link: ranks are placed tensor-parallel innermost, then data-parallel, then the pipeline
(Megatron-LM's and torchtitan's order). A group whose ranks, times the ranks inside each of its
steps, fit in one node runs at the node's link (NVLink); one that spans nodes runs at the
network's rate (its NICs per GPU x each NIC's): the ring's slowest hop sets its pace. A pipeline
send crosses the link of its own edge: in a node where both stages' ranks share one, else the
network (edge_crosses_nodes: 4 stages of tp 1 x dp 2 in nodes of 4 GPUs send 1→2 and 3→0 over it).

Tensor parallelism (Megatron-LM's and torchtitan's layer plans; the profile lists each layer's
collectives, LayerCollective): with sequence parallelism a block all-gathers its input before
attention and before the MLP and reduce-scatters after each (forward), the mirror in the
backward, and again in a full recompute; without it, two all-reduces each way. Context
parallelism's ring passes each rank's K and V shard around the cp ranks (cp - 1 sends forward,
twice the bytes backward: K, V and their gradients), charged as each runtime runs and overlaps
it in planner/cost/contextparallel.py with these functions. Expert
parallelism's all-to-all and the data parallel reductions are charged in planner/cost/dataparallel.py
with these factors.

Hidden only where the runtime overlaps it (the runtime record's tp_overlap, with its source): a hidden
collective costs what it takes beyond the compute it runs beside (the pass's), never less than 0;
under AsyncTP only the collectives torch's micro-pipeline TP pass fuses with matmuls overlap, each
as the chunked pipeline it runs (planner/cost/asynctp.py), and the rest are charged whole.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.cost import asynctp, nccltuner, runtimes, ub_ring, ub_sms
from planner.schema import CommSetup, TrainSetup

MS_PER_US = 1e-3
# NCCL's latency model, Ring algorithm, Simple protocol (the one large messages use)
NCCL_BASE_LATENCY_US = 8.4
NCCL_STEP_LATENCY_US = {"nvlink": 3.4, "pcie": 5.7, "network": 14.0}
NCCL_SOURCE = ("NVIDIA/nccl src/graph/tuning.cc ncclTopoTuneModel (2.23+, the version with PAT; read in a published "
               "annotated copy of the file): baseLat Ring/Simple 8.4 µs; hwLat Ring/Simple per step NVLink 3.4, PCI "
               "5.7, NET 14.0 µs")

RING_FACTORS = {  # (bytes moved per rank / tensor bytes, steps), n ranks
    "all-gather": (lambda n: (n - 1) / n, lambda n: n - 1),
    "reduce-scatter": (lambda n: (n - 1) / n, lambda n: n - 1),
    "all-reduce": (lambda n: 2 * (n - 1) / n, lambda n: 2 * (n - 1)),
    "all-to-all": (lambda n: (n - 1) / n, lambda n: n - 1),
    "send": (lambda n: 1.0, lambda n: 1),
}


@dataclass(frozen=True)
class Link:
    """What one collective crosses: bus bandwidth per rank (GB/s), NCCL's latency per ring step
    and per collective (ms), and where (words)."""

    gb_per_s: float
    step_latency_ms: float = 0.0
    base_latency_ms: float = 0.0
    where: str = ""
    nodes: int = 1  # the nodes the group's ranks lie on
    # across nodes, NCCL's step inside a node (NVLink's or PCI's); None: every step at step_latency_ms
    node_step_latency_ms: float | None = None


# NCCL's network post overhead of an inter-node ring's steps, x3 under Simple (tuning.cc getNetOverhead, 241-247
# at v2.21.5-1): the least a step inside a node costs in a ring across nodes
RING_NET_OVERHEAD_MS = nccltuner.NET_OVERHEAD_US * nccltuner.SIMPLE_OVERHEAD_FACTOR * MS_PER_US
RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")  # the collectives tuning.cc's ring model covers


def ring_latency_ms(kind: str, ranks: int, link: Link) -> float:
    """NCCL's Ring / Simple latency of one `kind` over `ranks` ranks on `link` (tuning.cc ncclTopoTuneModel, v2.23+):
    base + steps inside a node x max(the node's step, RING_NET_OVERHEAD_MS) + steps across x the network's, the
    steps across from nccltuner.ring_inter_steps. On one node, for an all-to-all or a send, or where the link names
    no node step, every step at the link's own."""
    _, steps = RING_FACTORS[kind]
    total = steps(ranks)
    if link.nodes <= 1 or link.node_step_latency_ms is None or kind not in RING_KINDS:
        return link.base_latency_ms + total * link.step_latency_ms
    inter = nccltuner.ring_inter_steps(kind, ranks, link.nodes)
    node_step = max(link.node_step_latency_ms, RING_NET_OVERHEAD_MS)
    return link.base_latency_ms + (total - inter) * node_step + inter * link.step_latency_ms


def collective_ms(kind: str, tensor_bytes: float, ranks: int, link: Link) -> float:
    """One ring collective of `kind` on a tensor of `tensor_bytes` over `ranks` ranks: NCCL's
    latency (ring_latency_ms) + the bytes each rank moves / the link's bandwidth. A group of one
    rank, or nothing to move, costs nothing."""
    if ranks <= 1 and kind != "send" or tensor_bytes <= 0:
        return 0.0
    moved, _ = RING_FACTORS[kind]
    return ring_latency_ms(kind, ranks, link) + moved(ranks) * tensor_bytes / (link.gb_per_s * 1e9) * 1e3


def all_gather_ms(tensor_bytes: float, ranks: int, link: Link) -> float:
    return collective_ms("all-gather", tensor_bytes, ranks, link)


def reduce_scatter_ms(tensor_bytes: float, ranks: int, link: Link) -> float:
    return collective_ms("reduce-scatter", tensor_bytes, ranks, link)


def all_reduce_ms(tensor_bytes: float, ranks: int, link: Link) -> float:
    return collective_ms("all-reduce", tensor_bytes, ranks, link)


def all_to_all_ms(tensor_bytes: float, ranks: int, link: Link) -> float:
    return collective_ms("all-to-all", tensor_bytes, ranks, link)


def send_ms(tensor_bytes: float, link: Link) -> float:
    return collective_ms("send", tensor_bytes, 2, link)


# ---------------------------------------------------------------- the topology

def node_link(gb_per_s: float, *, pcie: bool = False) -> Link:
    step = NCCL_STEP_LATENCY_US["pcie" if pcie else "nvlink"]
    return Link(gb_per_s, step * MS_PER_US, NCCL_BASE_LATENCY_US * MS_PER_US, "PCIe" if pcie else "in-node link")


def network_link(nic_gb_per_s: float, nics_per_gpu: float) -> Link:
    return Link(nic_gb_per_s * nics_per_gpu, NCCL_STEP_LATENCY_US["network"] * MS_PER_US,
                NCCL_BASE_LATENCY_US * MS_PER_US, "network")


def group_link(ranks: int, stride: int, gpus_per_node: int, inside: Link, between: Link) -> Link:
    """The link a group of `ranks` crosses whose members lie `stride` ranks apart (the product
    of the degrees placed inside it): inside one node while ranks x stride fit in it, else the
    network's, on the nodes the group spans with the node's step (ring_latency_ms)."""
    if ranks * stride <= gpus_per_node:
        return inside
    return dataclasses.replace(between, nodes=group_nodes(ranks, stride, gpus_per_node),
                               node_step_latency_ms=inside.step_latency_ms)


def group_nodes(ranks: int, stride: int, gpus_per_node: int) -> int:
    """Nodes a group of `ranks` ranks `stride` apart spans: one where ranks x stride fit a node, else ranks over
    its ranks a node (network_rate.ranks_per_node), rounded up."""
    from planner.models import network_rate

    return -(-ranks // network_rate.ranks_per_node(ranks, stride, gpus_per_node))


def job_links(gpu, *, tp: int, cp: int, pp_stride: int, gpus_per_node: int, nics_per_gpu: float) -> dict[str, Link]:
    """The links of a job's groups on `gpu` (planner/models/gpus.py), ranks placed tp, cp, dp, pp:
    "tp" (its ranks adjacent), "cp" (tp apart), "pp" (a send between ranks `pp_stride` apart: tp x
    dp x cp). A collective group inside a node runs at the node's measured collective rate where
    nccl-tests published one for the GPU, else the link's datasheet rate; the rest at the network's: a
    collective at NCCL's bus bandwidth over the NICs of its ranks in each node
    (planner/models/network_rate.py), a send at one rank's NICs' line rate. "node": a pipeline's send inside a
    node, an NCCL send and receive over the GPU's NVLinks like an all-to-all's pairs, at NCCL's effective NVLink
    rate where it is read (GPU.node_alltoall_rate: 370.8 GB/s on H100 SXM, 721.8 on B200 / GB200, the protocol's
    ~20% under the 450 / 900 line rate, "which you can observe as 'BusBw' when running non-allreduce
    operations", planner/models/nvlink_rates.py), else the link's datasheet rate."""
    from planner.models import network_rate

    inside = node_link(gpu.node_link_gb_per_s, pcie=gpu.node_link_kind == "pcie")
    sends = inside if gpu.node_link_kind == "pcie" or gpu.node_alltoall_rate == inside.gb_per_s else \
        dataclasses.replace(inside, gb_per_s=gpu.node_alltoall_rate, where="in-node, NCCL's effective NVLink rate")
    between = network_link(gpu.network_gb_per_s, nics_per_gpu)  # a send: the NICs' line rate
    measured = (Link(gpu.node_collective_gb_per_s, inside.step_latency_ms, inside.base_latency_ms,
                     f"in-node, measured: {gpu.collective_source}") if gpu.node_collective_gb_per_s else inside)

    def collective(ranks: int, stride: int) -> Link:
        k = network_rate.ranks_per_node(ranks, stride, gpus_per_node)  # NCCL's busbw over k ranks' NICs
        collectives_between = network_link(network_rate.ring_rate_across_nodes(gpu, k, nics_per_gpu), 1.0)
        link = group_link(ranks, stride, gpus_per_node, inside, collectives_between)
        return measured if link is inside else link

    return {"tp": collective(tp, 1), "cp": collective(cp, tp),
            "pp": group_link(2, pp_stride, gpus_per_node, sends, between), "node": sends, "network": between}


def edge_crosses_nodes(rank: int, to: int, *, stride: int, gpus_per_node: int) -> bool:
    """Whether pipeline rank `rank`'s sends to pipeline rank `to` cross nodes. The pipeline is placed
    outermost (Megatron-LM's default order tp-cp-ep-dp-pp, megatron/core/parallel_state.py 561 at 6e091e1b;
    torchtitan's mesh, pp its first dimension), so pipeline rank r holds the global ranks r·stride to (r+1)·stride - 1
    (stride: tp x cp x dp) and each sends to its peer (to - rank)·stride away: the edge crosses where any
    such pair lies in two nodes. Two stages of tp 1 x dp 2 in nodes of 4 GPUs: ranks 0→1 and 2→3 stay in
    a node, 1→2 and 3→0 (an interleaved schedule's next chunk) cross."""
    offset = (to - rank) * stride
    return any(x // gpus_per_node != (x + offset) // gpus_per_node for x in range(rank * stride, (rank + 1) * stride))


# ---------------------------------------------------------------- what the runtimes overlap

def tp_overlap_source(comm: CommSetup, training) -> str | None:
    """The fact that hides the tensor-parallel collectives under the setup's runtime and its
    `--tp-overlap` (its record's tp_overlap, planner/cost/runtimes.py); None where they stay on the
    critical path."""
    record = runtimes.of(training)
    if comm.tp_overlap == "none" or comm.tp_overlap != record.tp_overlap:
        return None
    return record.sources.get("tp_overlap", record.tp_overlap)


# ---------------------------------------------------------------- per layer

def tp_link(comm: CommSetup) -> Link | None:
    if comm.tp_gb_per_s is None:
        return None
    return setup_link(comm, comm.tp_gb_per_s, comm.tp_step_latency_ms, ranks=comm.tp, stride=1)


def setup_link(comm: CommSetup, gb_per_s: float, step_latency_ms: float, *, ranks: int, stride: int) -> Link:
    """A group's link as the setup holds it: its rate and step, NCCL's base, and across the NVLink domain the nodes
    it spans (group_nodes) with the setup's in-node step (ring_latency_ms)."""
    return Link(gb_per_s, step_latency_ms, comm.collective_latency_ms, nodes=group_nodes(ranks, stride, comm.domain),
                node_step_latency_ms=comm.node_step_latency_ms)


PASSES = ("fwd", "bwd", "recompute")


def gathers_float8(layer, setup: TrainSetup) -> bool:
    """Whether the layer's tensor-parallel all-gathers move float8 (1 B an element) rather than the
    bf16 tensor the profile lists: a Float8 layer (its record converts linears) under --float8 where
    the runtime's Float8 TP plan casts before it gathers (record.tp_gathers_float8: torchao's
    PrepareFloat8ModuleInput / Float8ColwiseParallel cast the forward's sequence shard, and
    Float8RowwiseParallel's NoopFwToFloat8BwDynamic, applied after its reduce-scatter, casts the
    backward's output gradient on its shard before that reduce-scatter's adjoint all-gather;
    eab345c float8_tensor_parallel.py 49-60, 107-133, 210-217; Transformer Engine's LayerNormLinear
    quantizes its norm's sequence shard and a row-parallel Linear its output gradient's before an FP8
    all-gather of the 1 B data alone, the scale_inv not sent: docs/framework-facts.md §301-§302). The
    reduce-scatters stay bf16 (a matmul's bf16 output, a gradient sum)."""
    return bool(setup.training.float8 and getattr(layer, "float8_param_count", 0)
                and runtimes.of(setup.training).tp_gathers_float8)


def collective_bytes(kind: str, tensor_bytes: float, *, float8: bool) -> float:
    """The bytes a listed collective moves: an all-gather of a float8 cast half the bf16 tensor."""
    return tensor_bytes / 2 if float8 and kind == "all-gather" else tensor_bytes


def pass_comm_ms(layer, which: str, comm: CommSetup, *, float8: bool = False, skip: frozenset = frozenset()) -> float:
    """A layer's (LayerCost's) tensor-parallel collectives in one pass ("fwd", "bwd", "recompute");
    `float8`: its all-gathers move float8 (gathers_float8); `skip`: the indices of those charged apart (TE's ring
    exchanges, userbuffers_ring_ms)."""
    link = tp_link(comm)
    if link is None:
        return 0.0
    at = 2 + PASSES.index(which)
    return sum(c[at] * collective_ms(c[0], collective_bytes(c[0], c[1], float8=float8), comm.tp, link)
               for i, c in enumerate(layer.collectives) if i not in skip)


def layer_comm_ms(layer, option: int, setup: TrainSetup) -> float:
    """What a layer's tensor-parallel collectives add to a microbatch's critical path: forward,
    backward, and the forward's again where its option recomputes the whole layer (option 1,
    "full"). Under an overlapping runtime setting each pass's collectives cost only what they
    take beyond that pass's compute."""
    comm, scale = setup.comm, setup.time.compute_scale  # the compute as the time term charges it
    passes = [("fwd", layer.fwd_ms * scale), ("bwd", layer.bwd_ms * scale)] + \
        ([("recompute", layer.fwd_ms * scale)] if option == 1 else [])
    hidden = tp_overlap_source(comm, setup.training) is not None
    total = sum(amax_reduce_ms(layer, which, setup) for which, _ in passes)
    if hidden and comm.tp_overlap == "async-tp":
        return total + sum(async_tp_pass_ms(layer, which, setup) for which, _ in passes)
    float8 = gathers_float8(layer, setup)
    for which, compute in passes:
        if not hidden:
            total += pass_comm_ms(layer, which, comm, float8=float8)
            continue
        # TE's ring exchanges as their chunked pipelines; the rest hidden beside the pass's other compute
        ring_ms, ring_whole, sites = userbuffers_ring_ms(layer, which, setup, float8=float8)
        ms = pass_comm_ms(layer, which, comm, float8=float8, skip=frozenset(i for i, _ in sites))
        lost = userbuffers_lost_ms(layer, which, comm, float8=float8, skip=frozenset(gemm for _, gemm in sites))
        total += ring_ms + max(0.0, ms - (compute - ring_whole), lost) + userbuffers_reduce_ms(layer, which, comm) \
            + userbuffers_copy_ms(layer, which, comm, float8=float8)
    return total


def userbuffers_ring_ms(layer, which: str, setup: TrainSetup, *, float8: bool = False) -> tuple[float, float, list]:
    """Under tp-comm-overlap, a dense block's pass's ring-exchange sites run as TE's code runs them
    (planner/cost/ub_ring.py): (what they add beyond their GEMMs whole, those GEMMs whole as the pass charges them,
    the sites: (index, GEMM) pairs); nothing where the profile gives no ring record (the GPU's SMs unknown: no
    margin charged). `float8`: the all-gathers' chunks move FP8 (gathers_float8)."""
    comm = setup.comm
    link = tp_link(comm)
    if comm.tp_overlap != "tp-comm-overlap" or link is None or layer.kind != "decoder_block":
        return 0.0, 0.0, []
    sites = ub_ring.ring_sites(layer.collectives, which, config=comm.ub_cfg, gemms=comm.ub_gemms)
    table, at = ub_sms.overlaps(comm.ub_cfg, comm.ub_gemms), 2 + PASSES.index(which)
    extra = whole = 0.0
    for index, gemm in sites:
        c = layer.collectives[index]
        added, gemm_ms = ub_ring.site_extra_ms(
            c[0], c[1], c[6], table[gemm], ranks=comm.tp, copy_gb_per_s=comm.tp_copy_gb_per_s or link.gb_per_s,
            sms=comm.gpu_sms, float8=setup.training.float8, gathered_float8=float8,
            compute_scale=setup.time.compute_scale)
        extra, whole = extra + c[at] * added, whole + c[at] * gemm_ms  # times the pass runs it (1 in a block)
    return extra, whole, sites


def in_node_hardware(setup: TrainSetup) -> str:
    """NCCL's in-node hardware: PCI where the setup's in-node step is NCCL's PCI figure (node_link), else NVLink."""
    pcie = math.isclose(setup.comm.tp_step_latency_ms, NCCL_STEP_LATENCY_US["pcie"] * MS_PER_US)
    return "pcie" if pcie else "nvlink"


# TE v2.9's amax all-reduces a sequence-parallel dense block makes a pass under FP8 current scaling
# (layernorm_linear.py / linear.py _customize_quantizers_float8_current_scaling: the column-parallel qkv's and fc1's
# input quantizers forward, the row-parallel proj's and fc2's grad-output quantizers backward)
AMAX_REDUCES = {"fwd": 2, "bwd": 2, "recompute": 2}


def amax_reduce_ms(layer, which: str, setup: TrainSetup) -> float:
    """Under Transformer Engine's FP8 current scaling (the setting fp8_current_scaling) with sequence parallelism,
    the one-float all-reduces of a dense block's pass (AMAX_REDUCES) over the TP group: TE's quantizer computes the
    tensor's amax, all-reduces it over amax_reduction_group and waits (quantizer.cpp 522-527: `allreduce(...)->wait()`,
    the compute stream waiting on NCCL's) before the cast, so each is on the pass's path, at NCCL's latency for 4 B
    (nccltuner.tuned_all_reduce; Ring / Simple where the launch forces it; no NVLS: it wins only past 16 ranks of one
    node). 0 without TP's eight listed collectives (no sequence parallelism: TE reduces no amax), or delayed scaling."""
    training, comm = setup.training, setup.comm
    if not (training.float8 and training.fp8_current_scaling and comm.tp > 1 and comm.tp_gb_per_s is not None
            and layer.kind == "decoder_block" and len(layer.collectives) == 8):
        return 0.0
    nodes, intra = max(1, -(-comm.tp // comm.domain)), in_node_hardware(setup)
    if training.nccl_ring_simple:
        us = nccltuner.all_reduce_latency_us("Ring", "Simple", comm.tp, nodes, intra)
    else:
        us = nccltuner.tuned_all_reduce(comm.tp, nodes, intra)[2]
    return AMAX_REDUCES[which] * us * MS_PER_US


def userbuffers_lost_ms(layer, which: str, comm: CommSetup, *, float8: bool = False,
                        skip: frozenset = frozenset()) -> float:
    """Under tp-comm-overlap, the GEMM work a dense block's pass loses to TE's userbuffers' SMs (planner/cost/ub_sms.py:
    the pass ends at compute + this where that is past its collectives); 0 elsewhere. `skip`: the GEMMs whose SMs
    their ring pipeline charges (userbuffers_ring_ms)."""
    link = tp_link(comm)
    if comm.tp_overlap != "tp-comm-overlap" or not comm.gpu_sms or link is None or layer.kind != "decoder_block":
        return 0.0
    each = [collective_ms(c[0], collective_bytes(c[0], c[1], float8=float8), comm.tp, link) for c in layer.collectives]
    return ub_sms.lost_sm_ms(each, which, config=comm.ub_cfg, sms=comm.gpu_sms, gemms=comm.ub_gemms, skip=skip)


def userbuffers_reduce_ms(layer, which: str, comm: CommSetup) -> float:
    """Under tp-comm-overlap, the reduce kernel TE runs after a dense block's pass's ring-exchange reduce-scatters
    (ub_sms.ring_reduce_bytes), on the main stream after the GEMM's last chunk: on the pass's path whatever hides the
    collectives; 0 elsewhere."""
    if comm.tp_overlap != "tp-comm-overlap" or not comm.ub_reduce_gb_per_s or layer.kind != "decoder_block":
        return 0.0
    moved = ub_sms.ring_reduce_bytes(layer.collectives, which, config=comm.ub_cfg, tp=comm.tp, gemms=comm.ub_gemms)
    return moved / (comm.ub_reduce_gb_per_s * 1e9) * 1e3


def userbuffers_copy_ms(layer, which: str, comm: CommSetup, *, float8: bool = False) -> float:
    """Under tp-comm-overlap, TE's copies of a dense block's pass into and out of its userbuffers
    (ub_sms.buffer_copy_bytes: each ring exchange's all-gather shard copied in, each bulk reduce-scatter's chunk cloned
    out), on the compute stream beside no GEMM: on the pass's path, at the rate the reduce kernel's streaming read and
    write is charged (CommSetup.ub_reduce_gb_per_s); `float8`: the all-gathers move FP8 (gathers_float8); 0 elsewhere."""
    if comm.tp_overlap != "tp-comm-overlap" or not comm.ub_reduce_gb_per_s or layer.kind != "decoder_block":
        return 0.0
    moved = ub_sms.buffer_copy_bytes(layer.collectives, which, config=comm.ub_cfg, tp=comm.tp, gemms=comm.ub_gemms,
                                     float8=float8)
    return moved / (comm.ub_reduce_gb_per_s * 1e9) * 1e3


def async_tp_pass_ms(layer, which: str, setup: TrainSetup) -> float:
    """A pass's tensor-parallel collectives under AsyncTP: those torch fuses with matmuls as their
    pipeline adds beyond the matmuls (planner/cost/asynctp.py), their peer copies at the copy engines' rate
    (CommSetup.tp_copy_gb_per_s) where published, else the ring's; the rest whole, at the ring's."""
    comm = setup.comm
    link = tp_link(comm)
    if link is None:
        return 0.0
    copy_rate = comm.tp_copy_gb_per_s or link.gb_per_s
    at, total, gathered8 = 2 + PASSES.index(which), 0.0, gathers_float8(layer, setup)
    for c in layer.collectives:
        fused = c[5] if len(c) > 5 else None
        if fused is None:
            total += c[at] * collective_ms(c[0], collective_bytes(c[0], c[1], float8=gathered8), comm.tp, link)
        else:
            total += c[at] * asynctp.fused_extra_ms(c[0], c[1], comm.tp, copy_rate, fused,
                                                    float8=setup.training.float8,
                                                    compute_scale=setup.time.compute_scale,
                                                    gathers_float8=gathered8)
    return total


def stage_send_ms(num_bytes: int, setup: TrainSetup, *, stage: int | None = None, to: int | None = None) -> float:
    """One send between neighbouring stages over the pipeline's link, where `ckplan calibrate`
    measured no send line (TimeConstants.send_gb_per_s wins where it did): from pipeline stage `stage`
    to stage `to` (of a stage's terms' P·V stages) over the network where their ranks lie in two nodes
    (stage_crosses_nodes), else over the pipeline's one link."""
    link = stage_link(setup, stage=stage, to=to)
    return 0.0 if link is None else send_ms(num_bytes, link)


def stage_all_reduce_ms(num_bytes: float, ranks: int, setup: TrainSetup, *, stage: int, to: int) -> float:
    """One ring all-reduce of `num_bytes` over `ranks` pipeline ranks, the slowest of them pipeline
    stages `stage` and `to` (stage_link): a tied parameter's gradient summed between its holders'
    stages (rules.tied_sum_ms); 0 where the pipeline's link is not known or a send line is calibrated."""
    link = stage_link(setup, stage=stage, to=to)
    return 0.0 if link is None else all_reduce_ms(num_bytes, ranks, link)


def stage_link(setup: TrainSetup, *, stage: int | None = None, to: int | None = None) -> Link | None:
    """The link between pipeline stages `stage` and `to`: the network where their ranks lie in two nodes
    (stage_crosses_nodes), else the pipeline's one link; None where a send line is calibrated
    (TimeConstants.send_gb_per_s: rules.send_ms charges it) or no link is known."""
    comm = setup.comm
    if setup.time.send_gb_per_s is not None or comm.pp_gb_per_s is None:
        return None
    if stage is not None and to is not None and stage_crosses_nodes(stage, to, setup):
        return Link(comm.pp_network_gb_per_s, comm.pp_network_latency_ms)
    return Link(comm.pp_gb_per_s, comm.pp_latency_ms)


def stage_crosses_nodes(stage: int, to: int, setup: TrainSetup) -> bool:
    """Whether a send from pipeline stage `stage` to stage `to` crosses nodes (edge_crosses_nodes on the ranks
    the schedule places them on); False where the setup names no stride or no network link (one link for all),
    and for a V schedule's turn, two stages on one rank (the in-node rate, where the schedule sends nothing)."""
    comm, pipeline = setup.comm, setup.pipeline
    if not comm.pp_stride or comm.pp_network_gb_per_s is None:
        return False
    from planner.cost import schedules  # torch's stage placement: imported where a send is placed

    ranks = pipeline.stages // pipeline.chunks  # a stage's terms see the P·V stages (chunked.stages_view)
    order = schedules.pipeline_schedule(pipeline.schedule, num_ranks=ranks, num_microbatches=pipeline.microbatches,
                                        num_chunks=pipeline.chunks)
    rank, peer = order.stage_to_rank[stage], order.stage_to_rank[to]
    return rank != peer and edge_crosses_nodes(rank, peer, stride=comm.pp_stride, gpus_per_node=comm.domain)
