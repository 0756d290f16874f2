"""GPU specs as data, each figure with its source: the vendors' datasheet figures (memory as
sold; dense, not 2:4-sparse, BF16 and FP8 tensor-core TFLOP/s; HBM bandwidth; the GPU-to-GPU
link, the network and the host link), the measured matmul ceiling (MAMF) and attention
kernel throughput the roofline reads (planner/profiler/roofline.py), and the memory a
training process can use: the total CUDA reports (the card's memory less what the driver
reserves, as published device queries print it) less the CUDA context (`usable_bytes`),
`solve`'s default cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import UserError
from planner.models.attention_published import (
    CUDNN_B200,
    CUDNN_GB200,
    CUDNN_HOPPER_CHIP,
    FA2_AMPERE,
    FA2_AMPERE_SOURCE,
    MI300X_FLASH_CAUSAL_TFLOPS,
    MI300X_FLASH_SOURCE,
    SDPA_B200,
    SDPA_B200_BY_SEQ,
    SDPA_BLACKWELL,
    SDPA_H100,
    SDPA_H100_BY_SEQ,
    SDPA_HOPPER,
)
from planner.models.matmul_ceilings import (  # noqa: F401  read as gpus.<name> too
    _MAF_MI300X,
    B200_SMS,
    GB200_SMS,
    MAF_FP8_MI300X_TFLOPS,
    MAMF_FP8_TFLOPS,
    MAMF_TFLOPS,
    MSMF_FP8_TFLOPS,
    MSMF_TFLOPS,
)
from planner.models.matmul_ceilings import matmul_fields as _mamf
from planner.models.membound_published import (  # noqa: F401  read as gpus.<name> too
    BABELSTREAM_ADD_MI300X_TBPS,
    LIGER,
    LIGER_B200,
    LIGER_MI300X,
    MEGATRON_CE_H100,
    MEMBOUND_A100,
    MEMBOUND_B200,
    MEMBOUND_CLASSES_A100,
    MEMBOUND_CLASSES_B200,
    MEMBOUND_CLASSES_H100,
    MEMBOUND_CLASSES_MI300X,
    MEMBOUND_H100,
    MEMBOUND_MI300X,
)
from planner.models.nvlink_rates import NCCL_NVLINK_SOURCE, nccl_nvlink_rate

# MI300X's collectives in a node (AMD's acceptance guide's example output; pass mark 304 GB/s): the all-reduce's busbw,
# its ring's per-link rate (a reduce-scatter then an all-gather), read for those too; 0.71 of the datasheet's 448
RCCL_ALL_REDUCE_MI300X_GBPS = 316.55
_RCCL_MI300X = ("rccl-tests all_reduce_perf on 8 x MI300X, 8 GiB in place: busbw 316.55 GB/s (ROCm/system-acceptance-docs "
                "b754ce72 docs/mi300x/performance-bench.rst); the all-reduce's busbw read for all-gathers and "
                "reduce-scatters (none published)")
@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int  # as sold, decimal
    bf16_tflops: float  # dense BF16 tensor-core peak
    hbm_tbps: float  # HBM bandwidth, TB/s
    source: str
    # GB/s one way per GPU: the GPU-to-GPU link inside a node (NVLink / Infinity Fabric: the
    # datasheet's bidirectional total / 2), the network between nodes (one NIC per GPU), and
    # the host link (PCIe: the datasheet's bidirectional figure / 2, or a pinned copy's measured rate on the GPU's
    # server where one is published: the A100s')
    node_link_gb_per_s: float = 0.0
    network_gb_per_s: float = 50.0  # 400 Gb/s InfiniBand NDR / ConnectX-7 per GPU (DGX H100, DGX B200)
    host_link_gb_per_s: float = 64.0  # PCIe Gen5 x16
    host_link_kind: str = "PCIe"  # what the host link is: PCIe, or NVLink-C2C on a Grace superchip
    # GPUs behind one PCIe switch whose uplink to the host they share (their copies to the host at once split it);
    # 1 where not read
    gpus_per_host_switch: int = 1
    # what one GPU moves to (h2d) and from (d2h) pageable host memory, the driver staging it through its own pinned
    # buffers (bandwidthTest --memory=pageable on the GPU's server); 0: not read (a pageable copy at the host link's)
    pageable_h2d_gb_per_s: float = 0.0
    pageable_d2h_gb_per_s: float = 0.0
    gpus_per_node: int = 8  # GPUs one host runs (its processes, host memory, NICs): a DGX's 8, a GB200 tray's 4
    # GPUs that reach each other over NVLink, where more than one host's (a GB200 NVL72 rack's 72); 0: the host's
    nvlink_domain: int = 0
    link_source: str = ""
    # NICs per GPU, each at network_gb_per_s (DGX H100 / B200 / A100: one ConnectX per GPU), and
    # what the GPU-to-GPU link inside a node is: NVLink / Infinity Fabric, or PCIe where there is
    # none (NCCL's latency per ring step differs: planner/cost/comm.py)
    nics_per_gpu: float = 1.0
    node_link_kind: str = "nvlink"
    # a measured bus bandwidth of the all-gathers and reduce-scatters inside a node (nccl-tests),
    # which tensor parallelism's collectives run at in place of the link's datasheet figure; 0:
    # none published, the datasheet's
    node_collective_gb_per_s: float = 0.0
    collective_source: str = ""
    # NCCL's sends and receives (an all-to-all's) inside a node: its effective NVLink rate (nvlink_rates.py); 0: the link's
    node_alltoall_gb_per_s: float = 0.0
    alltoall_source: str = ""
    # what cudaGetDeviceProperties().totalGlobalMem (torch's total_memory) reports, and its source
    cuda_total_bytes: int = 0
    total_source: str = ""
    # a ROCm device: torch's caching allocator ignored expandable_segments there until pytorch#173330
    # (2026-03-01; planner/cost/allocator.py)
    rocm: bool = False
    # the best BF16 matmul measured against the datasheet peak (a per-kernel ceiling, not an
    # end-to-end MFU: no launches, communication or memory-bound ops in it)
    matmul_efficiency: float = 0.801
    matmul_source: str = ""
    # dense FP8 tensor-core peak (0: no FP8 tensor cores), from the same datasheet as bf16_tflops
    fp8_tflops: float = 0.0
    # the best FP8 matmul measured against fp8_tflops (its MAMF, or the vendor's MAF: the MI300X); 0: none
    # published, the BF16 fraction
    fp8_matmul_efficiency: float = 0.0
    # the attention kernel PyTorch's scaled_dot_product_attention runs (its flash backend), forward and
    # backward, as fractions of the BF16 peak: its published throughput at 8192 (or the nearest published)
    # tokens, head dim 128, counted as FlashAttention's benchmarks count FLOPs (causal: half)
    attention_efficiency: tuple[float, float] = (0.35, 0.35)
    attention_source: str = ""
    # the same kernel's rate by tokens per sequence where it is published: (tokens, forward, backward
    # fractions of the BF16 peak), ascending; empty: attention_efficiency at every length
    attention_by_seq: tuple[tuple[int, float, float], ...] = ()
    # the attention kernel Transformer Engine runs under Megatron-LM (cuDNN's fused attention, TE's
    # FusedAttention F16_arbitrary_seqlen), forward and backward as fractions of the BF16 peak, counted
    # as attention_efficiency is; empty: none published, attention_efficiency read (planner/profiler/te_fused.py)
    te_attention_efficiency: tuple[float, ...] = ()
    te_attention_source: str = ""
    # the same kernel at a latent attention's shape (q/k head dim 192, v head dim 128: DeepSeek-V3's), by tokens per
    # sequence as attention_by_seq; empty: none published, te_attention_efficiency read (planner/profiler/te_mla.py)
    te_mla_attention_by_seq: tuple[tuple[int, float, float], ...] = ()
    te_mla_attention_source: str = ""
    # the same kernel's deterministic backward (cuDNN's, which Transformer Engine asks for under
    # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 on sm90 and later) as a fraction of the BF16 peak; 0: none published,
    # the non-deterministic backward read (planner/cost/jobsettings.py deterministic_attention_ms)
    te_attention_deterministic_bwd: float = 0.0
    # cuDNN's sliding-window kernel: (window, tokens, forward, backward fractions of the BF16 peak) where published
    # (attention_published.py CUDNN_SWA_*); attention_windowed: the windowed figures of the kernel the record's
    # attention runs (te_attention_gpu sets cuDNN's; empty: a window at the full kernel's rate, attention_rates.py)
    te_attention_windowed: tuple[tuple[int, int, float, float], ...] = ()
    te_attention_windowed_source: str = ""
    attention_windowed: tuple[tuple[int, int, float, float], ...] = ()
    # the GPU's compute capability x 10 where a kernel choice reads it: Transformer Engine's attention under
    # deterministic mode runs FlashAttention-2 below sm90, and on sm100+ where the attention drops
    # (planner/cost/jobsettings.py deterministic_attention_kernel); 0: not read (the Hopper records: sm90,
    # where TE keeps cuDNN's)
    cuda_arch: int = 0
    # its streaming multiprocessors, which FlashAttention-2's deterministic backward splits its grid by
    # (jobsettings.flash2_deterministic_factor); 0: not read
    num_sms: int = 0
    # the host's CPU time to issue one framework module's forward (a Linear's) on the GPU's reference
    # system, in µs (planner/cost/hosttime.py); 0: none published for its host
    host_call_us: float = 0.0
    host_source: str = ""
    # the bandwidth memory-bound kernels reach as fractions of hbm_tbps, measured on this GPU's architecture
    # (Liger-Kernel's published benchmarks, docs/gpus.md "Memory-bound kernels"; planner/profiler/membound.py):
    # eager torch ops (the fake and analytic profiles' bytes), and fused kernels (torch.compile's inductor
    # kernels, Transformer Engine's and Megatron's fused ones: roofline.Work.fused_bytes); defaults: the H100's
    membound_eager_efficiency: float = MEMBOUND_H100[0]
    membound_fused_efficiency: float = MEMBOUND_H100[1]
    # eager fractions per op class (membound.OP_CLASSES), where the architecture's sweeps measure one
    membound_class_efficiency: tuple[tuple[str, float], ...] = MEMBOUND_CLASSES_H100
    membound_source: str = ""
    # Megatron-LM's own cross-entropy chains (unfused, fused) timed whole, as fractions of hbm_tbps for the bytes the
    # Megatron record counts (membound_published.MEGATRON_CE_H100); (): none published for the architecture
    megatron_ce_efficiency: tuple[tuple[str, float], ...] = ()

    @property
    def node_collective_rate(self) -> float:
        """GB/s a ring all-gather or reduce-scatter inside a node runs at (tensor-, context- and data-parallel
        groups alike): the measured bus bandwidth where one is published, else the link's datasheet rate."""
        return self.node_collective_gb_per_s or self.node_link_gb_per_s

    @property
    def node_alltoall_rate(self) -> float:
        """GB/s one way an all-to-all inside a node runs at: NCCL's NVLink rate where read, else the link's."""
        return self.node_alltoall_gb_per_s or self.node_link_gb_per_s

    @property
    def network_collective_rate(self) -> float:
        """GB/s NCCL's collectives reach over one NIC: 0.96 of its line rate (NCCL_NIC_BUSBW_FRACTION); a
        point-to-point send keeps the line rate. A ring whose group has k ranks a node runs over k GPUs' NICs
        (planner/models/network_rate.py ring_rate_across_nodes), an all-to-all over each rank's own."""
        return self.network_gb_per_s * NCCL_NIC_BUSBW_FRACTION

    @property
    def usable_bytes(self) -> int:
        """What one training process can allocate: the CUDA total less the context."""
        return self.cuda_total_bytes - CUDA_CONTEXT_BYTES


# The CUDA context PyTorch creates on its first CUDA call (CUDA >= 11.7, lazy module loading):
# "around 400MB" (pytorch/pytorch#109888, a PyTorch maintainer); ~287 MB measured in
# pytorch/pytorch#86509. Taken as 400 MiB, the larger reading.
# NCCL's collectives over InfiniBand reach 0.96 of a NIC's line rate: "We usually consider 24GB/s is the peak
# performance per 200G NIC (12 GB/s for 100G NICs)" (an NCCL maintainer, NVIDIA/nccl-tests#119, 2022-11-17): 48 GB/s
# bus bandwidth a 400 Gb/s NIC, the figure the same maintainers give for NDR in NVIDIA/nccl-tests#290
NCCL_NIC_BUSBW_FRACTION = 24.0 / 25.0
CUDA_CONTEXT_BYTES = 400 * 2**20
CONTEXT_SOURCE = "CUDA context ~400 MB with lazy loading (pytorch/pytorch#109888)"
_MIB = 2**20
# nvidia-smi's total less its "Reserved" line: 454 MiB on an H100 SXM (driver 565), the
# reservation assumed where only nvidia-smi's total was found
_H100_RESERVED = 454 * _MIB


# The host's Adam step an offloaded optimizer takes, per fp32 parameter, on a GPU server:
# DeepSpeedCPUAdam (AVX) in one process with its memory on the local NUMA node updated 136M
# parameters (545 MB of fp32) in 54.8 ms (github.com/DandinPower/numa-cpu-adam-bench,
# example/qwen2.5-7B_normal_interleave.csv). Ranks stepping at once share the host's memory
# bandwidth: the same run measured two processes at 1.5 ns per parameter each.
HOST_ADAM_NS_PER_PARAM = 0.40

# An 8-GPU A100 server's host side, as Azure's ND A100 v4 nodes (the DeepSpeed rows' NDm A100 v4) are laid out: four
# PCIe Gen4 x16 switches, each with two GPUs and two NICs behind one x16 uplink to the host (Azure/azhpc-images
# 4a4565a0 topology/ndv4-topo.xml: four bridges at 16 GT/s x16, two class-0x0302 GPUs and two 0x0207 NICs under
# each; docs/framework-facts.md §175)
# Pageable copies on a DGX A100 (A100-SXM4-80GB; its host two AMD EPYC 7742, Rome as NDm A100 v4's 7V12, the same four
# x16 Gen4 switches of two GPUs): bandwidthTest (cuda-samples v11.4, 32 MB, quick mode) --memory=pageable h2d 10.0,
# d2h 10.8 GB/s; --memory=pinned 25.7 / 25.8 on the same GPU, within 1% of NDm A100 v4's 25.9 below
# (gengwg/gpu 54e9b29d nvda_gpu_benchmark.md; docs/framework-facts.md §578)
_A100_HOST = {"gpus_per_host_switch": 2, "pageable_h2d_gb_per_s": 10.0, "pageable_d2h_gb_per_s": 10.8}
# What one A100 of those servers moves to or from pinned host memory, alone (the other GPUs idle): CUDA's
# bandwidthTest (its default, pinned memory) under SuperBench v0.4's mem-bw, run on one GPU at a time bound to its own
# NUMA node, on Azure NDm A100 v4 (the DeepSpeed rows' nodes): h2d 25.90, d2h 25.95 GB/s; on ND A100 v4 (40 GB) h2d
# 25.92, d2h 26.03 (microsoft/superbench-results 1c985995 v0.4.0/Azure-NDmv4-A100/baseline.json and
# Azure-NDv4-A100/baseline.json, config.yaml beside each; docs/framework-facts.md §575). The x16 Gen4 link's 32 GB/s
# a direction is its signalling rate: a copy's payload reaches 81% of it. The smaller of the four, one rate both ways.
A100_PINNED_COPY_GB_PER_S = 25.9
_A100_LINKS = ("A100 datasheet: NVLink 600 GB/s, PCIe Gen4 64 GB/s; DGX A100: 200 Gb/s HDR per GPU; host copies at "
               "25.9 GB/s, bandwidthTest's pinned rate on Azure NDm A100 v4 (SuperBench v0.4 mem-bw)")
HOST_ADAM_SOURCE = ("DeepSpeedCPUAdam on a GPU server's host, one process: 136M fp32 parameters in 54.8 ms "
                    "(numa-cpu-adam-bench)")


# Hopper's dense 16-bit tensor-core work per SM and clock: 4 tensor cores x 512 FMA x 2 FLOP (NVIDIA H100 Tensor Core
# GPU Architecture whitepaper; glennklockwood.com/garden/peak-FLOPS: 540,672 FLOP a clock on the SXM's 132 SMs, x 1.83
# GHz = 989.4 TFLOP/s). A datasheet's dense peak over it is the clock the peak is rated at.
HOPPER_BF16_FLOP_PER_SM_CLOCK = 4 * 512 * 2
# NVIDIA H100 NVL (94 GB HBM3, 3.9 TB/s, 350-400 W, 132 SMs): BF16 1,671 and FP8 3,341 TFLOPS with sparsity (NVIDIA H100
# Tensor Core GPU datasheet, NVL column), halved: dense. SMs: vllm-project/vllm#53446's device query on an H100 NVL
# ("NVIDIA H100 NVL | SM: 9.0 | SMs: 132")
H100_NVL_BF16_TFLOPS = 1671 / 2
H100_NVL_FP8_TFLOPS = 3341 / 2


def rated_clock_mhz(bf16_tflops: float, sms: int) -> float:
    """The clock (MHz) a Hopper part's dense BF16 peak is rated at: the peak over its SMs' FLOP a clock."""
    return bf16_tflops * 1e12 / (sms * HOPPER_BF16_FLOP_PER_SM_CLOCK) / 1e6


# The CPU time of one Linear module's forward (BF16, hidden 2048, 8192 tokens) on each reference system's host,
# torch's nn.Linear: DGX H100 (Xeon Platinum 8480C) 13.48 µs, GB200 (Grace) 37.08, GH200 (Grace) 33.17
# (NVIDIA/TransformerEngine#2053, 2025-08-11, the table; TE's Linear then 99.66 on GB200 and 90.53 on
# GH200, "nearly the same with vanilla torch linear" for BF16 since, a TE maintainer in #2126, 2026-01-03)
_HOST_2053 = "NVIDIA/TransformerEngine#2053 (2025-08-11): torch nn.Linear forward, BF16, hidden 2048, 8192 tokens"
_HOST_XEON = dict(host_call_us=13.48, host_source=f"DGX H100's Xeon Platinum 8480C: 13.48 µs ({_HOST_2053})")
_HOST_GRACE_GB200 = dict(host_call_us=37.08, host_source=f"GB200's Grace: 37.08 µs ({_HOST_2053})")
_HOST_GRACE_GH200 = dict(host_call_us=33.17, host_source=f"GH200's Grace: 33.17 µs ({_HOST_2053})")
# DGX A100's host (two AMD EPYC 7742, Zen 2) has no published figure: the Xeon's carried by single-thread speed,
# SPECspeed2017_int_base on spec.org (its table as scraped in github.com/blue-plum-cloud/cpu2017data 429d1a51
# data/test.csv): the EPYC 7742's median of 42 results (2019-20, 8.33-9.08), the Xeon Platinum 8480+'s (the 8480C's
# retail twin) of its 3 of 2024 (14.1, 13.7, 13.9), after SPEC's ruling on oneAPI 2022-2023's xalancbmk (earlier: 14.5).
# A model, not a measurement (same x86-64 binaries; not to Arm: Grace 22.5 µs for 37.08; scripts/spec_host_ratio.py).
EPYC_7742_SPECSPEED_INT = 8.92
XEON_8480_SPECSPEED_INT = 13.9
_HOST_EPYC_ROME = dict(
    host_call_us=round(_HOST_XEON["host_call_us"] * XEON_8480_SPECSPEED_INT / EPYC_7742_SPECSPEED_INT, 2),
    host_source="DGX A100's AMD EPYC 7742: 13.48 µs x 13.9 / 8.92 = 21.01 µs, the DGX H100 Xeon's figure "
                f"({_HOST_2053}) carried by SPECspeed2017_int_base (EPYC 7742 8.92, Xeon Platinum 8480+ 13.9: "
                "spec.org medians), not measured")
_FA2_AMPERE = FA2_AMPERE_SOURCE
# the A100's 108 streaming multiprocessors (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020: "108 SMs"
# in the A100 as shipped, of the GA100's 128), sm80: below sm90 (TE's deterministic FlashAttention-2 backward)
_A100_SMS = 108
# the B200's 148, sm100 (torch.cuda.get_device_properties on a B200, torch 2.8.0+cu128: "_CudaDeviceProperties(
# name='NVIDIA B200', major=10, minor=0, total_memory=182631MB, multi_processor_count=148", printed in a public
# benchmark log; the same count in another B200's printed properties). GB200's 152: no device query was found, but
# profiling notes of GB200 runs in public kernel repositories count it so, consistently: an Nsight Systems analysis
# "GPU: NVIDIA GB200 (152 SMs)" launching "228 (1.50 waves)" blocks, and cluster capacities "measured on GB200 (152
# SMs)" beside "B300 (148 SMs)" (from cudaOccupancyMaxActiveClusters)
_B200_SMS, _GB200_SMS = B200_SMS, GB200_SMS  # kept in matmul_ceilings.py, which reads them too
# a GB200 NVL72 rack's hosts: 18 compute trays of 4 GPUs (2 Grace + 4 Blackwell, one CX7 NIC a GPU), all 72 GPUs in one
# NVLink domain through 9 NVLink switch trays (NVIDIA Multi-Node NVLink Tuning Guide, "Understanding Your Grace-Blackwell
# Systems", docs.nvidia.com/multi-node-nvlink-systems/multi-node-tuning-guide/system.html, the 72x1 configuration)
_GB200_TRAY = ("a host (compute tray) runs 4 GPUs, 18 trays a rack in one NVLink domain of 72 (NVIDIA Multi-Node NVLink "
               "Tuning Guide, system.html, 72x1)")
_NIC_ASSUMED = "no NIC in the datasheet or a reference system: 400 Gb/s per GPU assumed, as DGX H100"
_MEMBOUND_HOPPER = dict(membound_eager_efficiency=MEMBOUND_H100[0], membound_fused_efficiency=MEMBOUND_H100[1],
                        membound_class_efficiency=MEMBOUND_CLASSES_H100, megatron_ce_efficiency=MEGATRON_CE_H100,
                        membound_source=f"measured on H100 NVL and H100 SXM: {LIGER}")
_MEMBOUND_AMPERE = dict(membound_eager_efficiency=MEMBOUND_A100[0], membound_fused_efficiency=MEMBOUND_A100[1],
                        membound_class_efficiency=MEMBOUND_CLASSES_A100,
                        membound_source=f"measured on A100 SXM 80 GB and A100 PCIe 80 GB (no A100 sweep of SwiGLU "
                                        f"or an elementwise op alone: those classes read the eager mean): {LIGER}")


_MEMBOUND_BLACKWELL = dict(membound_eager_efficiency=MEMBOUND_B200[0], membound_fused_efficiency=MEMBOUND_B200[1],
                           membound_class_efficiency=MEMBOUND_CLASSES_B200)


def _membound_assumed(nearest: str, fractions: tuple[float, float]) -> dict:
    classes = MEMBOUND_CLASSES_H100 if nearest == "H100" else MEMBOUND_CLASSES_A100
    return dict(membound_eager_efficiency=fractions[0], membound_fused_efficiency=fractions[1],
                membound_class_efficiency=classes, megatron_ce_efficiency=MEGATRON_CE_H100 if nearest == "H100" else (),
                membound_source=f"no memory-bound kernel benchmark published for this GPU: the {nearest}'s fractions "
                                f"assumed ({LIGER})")

GPUS: dict[str, GPU] = {g.name: g for g in (
    # NVIDIA H100 Tensor Core GPU datasheet (2023): SXM 80 GB, BF16 1,979 TFLOPS with sparsity
    # (989 dense), FP8 3,958 with sparsity (1,979 dense), 3.35 TB/s; PCIe 80 GB, BF16 1,513 with
    # sparsity (756 dense), FP8 3,026 (1,513 dense), 2 TB/s.
    # Links: NVLink 900 GB/s (SXM) / NVLink bridge 600 GB/s (PCIe, pairs only: PCIe counted),
    # PCIe Gen5 128 GB/s; DGX H100: 8x ConnectX-7 400 Gb/s, one per GPU
    GPU("h100-sxm", 80 * 10**9, 989.4, 3.35, "NVIDIA H100 datasheet, SXM5 (BF16 989, FP8 1,979 dense; 3.35 TB/s)",
        450.0, fp8_tflops=1978.9,
        link_source="H100 datasheet: NVLink 900 GB/s, PCIe Gen5 128 GB/s; DGX H100: 400 Gb/s NDR per GPU",
        node_collective_gb_per_s=354.9,
        collective_source="nccl-tests on 8 x H100: reduce_scatter busbw 360, all_gather 350 GB/s (NVIDIA/nccl#1281, "
                          "2024-05-10); 354.9 their harmonic mean, a tensor-parallel layer moving equal bytes in each",
        node_alltoall_gb_per_s=nccl_nvlink_rate(450.0, 90), alltoall_source=NCCL_NVLINK_SOURCE,
        cuda_total_bytes=85_045_477_376,
        total_source="deviceQuery on H100 80GB HBM3: 85045477376 bytes; nvidia-smi 81559 MiB less 454 MiB "
                     "reserved (github.com/thamada/nvidia-smi, nvsim/H100SXMx8_*)",
        **_mamf("h100-sxm", 989.4, ": MSMF the H200's rows, the same GH100 at 700 W", fp8_key="h100-sxm",
              fp8_peak=1978.9), attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=SDPA_HOPPER, **CUDNN_HOPPER_CHIP, **_HOST_XEON,
        **_MEMBOUND_HOPPER),
    GPU("h100-pcie", 80 * 10**9, 756.5, 2.0, "NVIDIA H100 datasheet, PCIe (BF16 756, FP8 1,513 dense; 2 TB/s)", 64.0,
        fp8_tflops=1513.0,
        link_source="H100 datasheet: PCIe Gen5 128 GB/s (GPU to GPU over PCIe); 400 Gb/s NIC per GPU",
        node_link_kind="pcie",
        cuda_total_bytes=81559 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on H100 PCIe: 81559 MiB (Beomi/BitNet-Transformers README), less the SXM's "
                     "454 MiB driver reservation (assumed)",
        **_mamf("h100-sxm", 989.4, ": the SXM's fraction, none published for PCIe"),
        attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=f"the SXM's fractions, none published for PCIe: {SDPA_HOPPER}", **CUDNN_HOPPER_CHIP,
        **_MEMBOUND_HOPPER),
    # The H100 of Meta's Grand Teton hosts, on which torchtitan's published benchmarks ran: "HBM2e-based SXM
    # H100 with lower TDP", "96GB HBM2e with 2.4 TB/sec peak memory bandwidth", "the default 500W power
    # limit", 8 per host "fully connected with NVLink", "400 Gb/s per GPU" RDMA (torchtitan 820504e,
    # benchmarks/llama3_h100_202412_torchtitan.md lines 12-15 and footnote 2). Its BF16 peak "is between
    # SXM and NVL, and we don't know its exact value": the SXM's 989.4 is read, an upper bound (and the
    # figure torchtitan's own MFU divides by); its matmul and attention fractions are the 700 W SXM's.
    # The range's ends as clocks: the NVL's 835.5 is 1,545 MHz on its 132 SMs at 400 W, the SXM's 989.4 is
    # 1,830 MHz at 700 W (rated_clock_mhz); no source gives the clock this part holds at 500 W under
    # matmul (docs/gpus.md §1; docs/published-runs.md §21.h100g500 scores the rows at both ends)
    GPU("h100-96g", 96 * 10**9, 989.4, 2.4,
        "torchtitan 820504e benchmarks/llama3_h100_202412_torchtitan.md: SXM H100, 96 GB HBM2e at 2.4 TB/s, 500 W; "
        f"BF16 peak unpublished (between NVL and SXM): the SXM's 989.4 ({rated_clock_mhz(989.4, 132):.0f} MHz), an "
        f"upper bound; the NVL's {H100_NVL_BF16_TFLOPS:g} ({rated_clock_mhz(H100_NVL_BF16_TFLOPS, 132):.0f} MHz at "
        "400 W) the lower", 450.0, fp8_tflops=1978.9,
        link_source="torchtitan's benchmark hosts: 8 H100 fully connected with NVLink (the SXM's 900 GB/s assumed), "
                    "400 Gb/s RDMA per GPU",
        node_collective_gb_per_s=354.9,
        collective_source="the H100 SXM's nccl-tests figures (NVIDIA/nccl#1281), assumed for this NVLink host",
        cuda_total_bytes=96 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        **_mamf("h100-sxm", 989.4, ": the 700 W SXM's; none measured at 500 W", fp8_key="h100-sxm", fp8_peak=1978.9),
        attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=f"the 700 W SXM's: {SDPA_HOPPER}", **CUDNN_HOPPER_CHIP,
        **_MEMBOUND_HOPPER),
    # NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e, 4.8 TB/s, same compute as H100 SXM
    GPU("h200", 141 * 10**9, 989.4, 4.8, "NVIDIA H200 datasheet, SXM (BF16 989, FP8 1,979 dense; 4.8 TB/s)", 450.0,
        fp8_tflops=1978.9,
        link_source="H200 datasheet: NVLink 900 GB/s, PCIe Gen5 128 GB/s; DGX H200: 400 Gb/s NIC per GPU",
        node_alltoall_gb_per_s=nccl_nvlink_rate(450.0, 90), alltoall_source=NCCL_NVLINK_SOURCE,
        cuda_total_bytes=143771 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on H200: 143771 MiB (sgl-project/sglang#3196), less the H100's 454 MiB driver "
                     "reservation (assumed)",
        **_mamf("h100-sxm", 989.4, ": MSMF the H200's own rows; MAMF the H100 row, \"H200 is the same\"", fp8_key="h200",
              fp8_peak=1978.9),
        attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=f"the H100's chip: {SDPA_HOPPER}", **CUDNN_HOPPER_CHIP,
        **_membound_assumed("H100", MEMBOUND_H100)),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 part with 96 GB HBM3 at 4 TB/s (or
    # 144 GB HBM3e at 4.9 TB/s), H100 SXM compute; NVLink 900 GB/s GPU to GPU, NVLink-C2C 900 GB/s
    # to the Grace CPU (the host link an offload crosses)
    GPU("gh200", 96 * 10**9, 989.4, 4.0, "NVIDIA GH200 datasheet, 96 GB HBM3 (BF16 989, FP8 1,979 dense; 4 TB/s)",
        450.0, host_link_gb_per_s=450.0, host_link_kind="NVLink-C2C", fp8_tflops=1978.9,
        link_source=f"GH200 datasheet: NVLink 900 GB/s, NVLink-C2C 900 GB/s to the CPU; {_NIC_ASSUMED}",
        cuda_total_bytes=96 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        **_mamf("gh200", 989.4, ", measured on the 144 GB part", fp8_key="gh200", fp8_peak=1978.9),
        attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=f"the H100's chip: {SDPA_HOPPER}", **CUDNN_HOPPER_CHIP, **_HOST_GRACE_GH200,
        **_membound_assumed("H100", MEMBOUND_H100)),
    GPU("gh200-144g", 144 * 10**9, 989.4, 4.9,
        "NVIDIA GH200 datasheet, 144 GB HBM3e (BF16 989, FP8 1,979 dense; 4.9 TB/s)", 450.0,
        host_link_gb_per_s=450.0, host_link_kind="NVLink-C2C", fp8_tflops=1978.9,
        link_source=f"GH200 datasheet: NVLink 900 GB/s, NVLink-C2C 900 GB/s to the CPU; {_NIC_ASSUMED}",
        cuda_total_bytes=144 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        **_mamf("gh200", 989.4, ", measured on the 144 GB part", fp8_key="gh200", fp8_peak=1978.9),
        attention_efficiency=SDPA_H100, attention_by_seq=SDPA_H100_BY_SEQ,
        attention_source=f"the H100's chip: {SDPA_HOPPER}", **CUDNN_HOPPER_CHIP, **_HOST_GRACE_GH200,
        **_membound_assumed("H100", MEMBOUND_H100)),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense, no FP8; 40 GB 1,555 GB/s,
    # 80 GB SXM 2,039 GB/s; NVLink 600 GB/s, PCIe Gen4 64 GB/s; DGX A100: 8x HDR 200 Gb/s
    GPU("a100-40g", 40 * 10**9, 312.0, 1.555, "NVIDIA A100 datasheet, 40 GB SXM (BF16 312 dense, no FP8; 1.555 TB/s)",
        300.0, 25.0, A100_PINNED_COPY_GB_PER_S, link_source=_A100_LINKS,
        node_alltoall_gb_per_s=nccl_nvlink_rate(300.0, 80), alltoall_source=NCCL_NVLINK_SOURCE,
        cuda_total_bytes=42_298_834_944,
        total_source="deviceQuery on A100-SXM4-40GB: 42298834944 bytes (bottlerocket-os/bottlerocket PR #3873)",
        **_mamf("a100", 312.0), attention_efficiency=FA2_AMPERE, attention_source=_FA2_AMPERE,
        cuda_arch=80, num_sms=_A100_SMS, **_MEMBOUND_AMPERE, **_A100_HOST, **_HOST_EPYC_ROME),
    GPU("a100-80g", 80 * 10**9, 312.0, 2.039, "NVIDIA A100 datasheet, 80 GB SXM (BF16 312 dense, no FP8; 2.039 TB/s)",
        300.0, 25.0, A100_PINNED_COPY_GB_PER_S, link_source=_A100_LINKS,
        node_alltoall_gb_per_s=nccl_nvlink_rate(300.0, 80), alltoall_source=NCCL_NVLINK_SOURCE,
        cuda_total_bytes=85_100_068_864,
        total_source="deviceQuery on A100-SXM4-80GB: 85100068864 bytes; nvidia-smi 81920 MiB less 763 MiB "
                     "reserved (github.com/thamada/nvidia-smi, gls/A100SXMx4_*)",
        **_mamf("a100", 312.0), attention_efficiency=FA2_AMPERE, attention_source=_FA2_AMPERE,
        cuda_arch=80, num_sms=_A100_SMS, **_MEMBOUND_AMPERE, **_A100_HOST, **_HOST_EPYC_ROME),
    # NVIDIA DGX B200 datasheet (2024): 1,440 GB for 8 GPUs (180 GB each), 72 PFLOPS FP8 training
    # for 8 GPUs (sparse: 4.5 dense each); HGX B200: BF16 2.25 PFLOPS dense (4.5 with sparsity),
    # HBM3e 8 TB/s, NVLink 5 1.8 TB/s
    GPU("b200", 180 * 10**9, 2250.0, 8.0,
        "NVIDIA DGX B200 / HGX B200 datasheets (BF16 2,250, FP8 4,500 dense; 8 TB/s)", 900.0, fp8_tflops=4500.0,
        link_source="HGX B200 datasheet: NVLink 1.8 TB/s per GPU; DGX B200: 400 Gb/s per GPU; PCIe Gen5",
        node_alltoall_gb_per_s=nccl_nvlink_rate(900.0, 100), alltoall_source=NCCL_NVLINK_SOURCE,
        cuda_total_bytes=183359 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on B200: 183359 MiB (NVIDIA/TensorRT-LLM#10278), less the H100's 454 MiB "
                     "driver reservation (assumed)",
        **_mamf("b200", 2250.0, fp8_key="b200", fp8_peak=4500.0), attention_efficiency=SDPA_B200,
        attention_by_seq=SDPA_B200_BY_SEQ, attention_source=SDPA_BLACKWELL, **CUDNN_B200,
        cuda_arch=100, num_sms=_B200_SMS, **_MEMBOUND_BLACKWELL,
        membound_source=f"eager measured on B200 ({LIGER_B200}); no torch.compile row: the H100's fused fraction "
                        f"assumed ({LIGER})"),
    # NVIDIA GB200 NVL72 datasheet (2024), per rack of 72 GPUs: 360 PFLOPS BF16 and 720 PFLOPS FP8
    # (sparse: 2,500 and 5,000 dense per GPU), 13.4 TB HBM3e (186 GB per GPU), 576 TB/s (8 TB/s per
    # GPU), NVLink 130 TB/s (1.8 TB/s per GPU), all 72 in one NVLink domain; NVLink-C2C 900 GB/s to
    # the Grace CPU
    GPU("gb200", 186 * 10**9, 2500.0, 8.0,
        "NVIDIA GB200 NVL72 datasheet (BF16 2,500, FP8 5,000 dense per GPU; 8 TB/s)", 900.0,
        host_link_gb_per_s=450.0, host_link_kind="NVLink-C2C", gpus_per_node=4, nvlink_domain=72,
        fp8_tflops=5000.0,
        link_source=f"GB200 NVL72 datasheet: NVLink 1.8 TB/s per GPU across the 72, NVLink-C2C 900 GB/s to the "
                    f"CPU; {_GB200_TRAY}; {_NIC_ASSUMED}",
        node_collective_gb_per_s=679.6,
        node_alltoall_gb_per_s=nccl_nvlink_rate(900.0, 100), alltoall_source=NCCL_NVLINK_SOURCE,
        collective_source="nccl-tests all_reduce_perf on one GB200 host's 4 GPUs, NCCL_ALGO=Ring, NCCL 2.25.1: busbw "
                          "679.61 GB/s at 8 GB, 574.19 at 134 MB (Azure/AI-benchmarking-guide Azure_Results/"
                          "ND_GB200_v6_results.md, 2a370be6; Benchmarks/NVIDIA/NCCLBandwidth.py runs Ring on 4 GPUs)",
        cuda_total_bytes=int(184.31 * 2**30),
        total_source="torch's CUDA total on GB200: 'GPU 3 has a total capacity of 184.31 GiB' (vllm-project/vllm#43951, "
                     "4x GB200); nvidia-smi shows 189471 MiB, 738 MiB above it (B200: 183359 MiB against 178.35 GiB)",
        **_mamf("gb200", 2500.0, fp8_key="gb200", fp8_peak=5000.0), attention_efficiency=SDPA_B200,
        attention_by_seq=SDPA_B200_BY_SEQ,
        attention_source=f"none published for GB200: the B200's fractions (the same chip) assumed ({SDPA_BLACKWELL})",
        **CUDNN_GB200, **_HOST_GRACE_GB200, cuda_arch=100, num_sms=_GB200_SMS,
        **_MEMBOUND_BLACKWELL, membound_source=f"none published for GB200: the B200's fractions (the same chip, the "
                                               f"same 8 TB/s) assumed ({LIGER_B200}; fused: the H100's, {LIGER})"),
    # AMD Instinct MI300X datasheet (2023): 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense
    # (2,614.9 with sparsity), FP8 2,614.9 dense (5,229.8 with sparsity)
    GPU("mi300x", 192 * 10**9, 1307.4, 5.3,
        "AMD Instinct MI300X datasheet (BF16 1,307.4, FP8 2,614.9 dense; 5.3 TB/s)", 448.0, fp8_tflops=2614.9, rocm=True,
        link_source="MI300X datasheet: Infinity Fabric 896 GB/s peer to peer, PCIe Gen5 128 GB/s; "
                    "400 Gb/s NIC per GPU assumed",
        node_collective_gb_per_s=RCCL_ALL_REDUCE_MI300X_GBPS, collective_source=_RCCL_MI300X,
        cuda_total_bytes=196592 * _MIB,
        total_source="hipGetDeviceProperties on MI300X: 196592 MB total global memory "
                     "(github.com/thamada/nvidia-smi, package/MI300X_deviceQuery.py)",
        **_mamf("mi300x", 1307.4, fp8_maf=(MAF_FP8_MI300X_TFLOPS / 2614.9, _MAF_MI300X)),
        attention_efficiency=(MI300X_FLASH_CAUSAL_TFLOPS[0] / 1307.4, MI300X_FLASH_CAUSAL_TFLOPS[1] / 1307.4),
        attention_source=MI300X_FLASH_SOURCE,
        membound_eager_efficiency=MEMBOUND_MI300X[0], membound_fused_efficiency=MEMBOUND_MI300X[1],
        membound_class_efficiency=MEMBOUND_CLASSES_MI300X,
        membound_source=f"eager measured on MI300X ({LIGER_MI300X}; SwiGLU alone: none, the eager mean; elementwise: "
                        f"BabelStream's Add, ROCm/system-acceptance-docs b754ce72); no torch.compile row: the H100's "
                        f"fused fraction assumed ({LIGER})"),
    # NVIDIA L4 Tensor Core GPU datasheet (2023): 24 GB GDDR6 at 300 GB/s, BF16 121 TFLOPS dense
    # (242 with sparsity), FP8 242.5 dense (485 with sparsity), PCIe Gen4 x16 64 GB/s, no NVLink
    GPU("l4", 24 * 10**9, 121.0, 0.300, "NVIDIA L4 datasheet (BF16 121, FP8 242.5 dense; 300 GB/s GDDR6)", 32.0,
        host_link_gb_per_s=32.0, fp8_tflops=242.5, node_link_kind="pcie",
        link_source=f"L4 datasheet: PCIe Gen4 x16 64 GB/s, no NVLink (GPU to GPU over PCIe); {_NIC_ASSUMED}",
        cuda_total_bytes=24 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        **_mamf("a100", 312.0, ": the A100's fraction, none published for L4"),
        attention_efficiency=FA2_AMPERE,
        attention_source=f"{_FA2_AMPERE}; none published for L4, the Ampere figure assumed",
        **_membound_assumed("A100", MEMBOUND_A100)),
)}

GPU_ALIASES = {"h100": "h100-sxm", "gh200-96g": "gh200"}


def gpu(name: str) -> GPU:
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        import difflib

        close = difflib.get_close_matches(key, [*GPUS, *GPU_ALIASES], n=1, cutoff=0.8)
        mean = f"did you mean {close[0]}? " if close else ""
        raise UserError(f"unknown --gpu {name!r}; {mean}choose one of {', '.join([*GPUS, *GPU_ALIASES])}")
    return GPUS[key]
