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


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int  # as sold, decimal
    bf16_tflops: float  # dense BF16 tensor-core peak
    hbm_tbps: float  # HBM bandwidth, TB/s
    source: str
    # GB/s one way per GPU: the GPU-to-GPU link inside a node (NVLink / Infinity Fabric: the
    # datasheet's bidirectional total / 2), the network between nodes (one NIC per GPU), and
    # the host link (PCIe: the datasheet's bidirectional figure / 2)
    node_link_gb_per_s: float = 0.0
    network_gb_per_s: float = 50.0  # 400 Gb/s InfiniBand NDR / ConnectX-7 per GPU (DGX H100, DGX B200)
    host_link_gb_per_s: float = 64.0  # PCIe Gen5 x16
    gpus_per_node: int = 8
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
    # what cudaGetDeviceProperties().totalGlobalMem (torch's total_memory) reports, and its source
    cuda_total_bytes: int = 0
    total_source: str = ""
    # the best BF16 matmul measured against the datasheet peak (a per-kernel ceiling, not an
    # end-to-end MFU: no launches, communication or memory-bound ops in it)
    matmul_efficiency: float = 0.801
    matmul_source: str = ""
    # dense FP8 tensor-core peak (0: no FP8 tensor cores), from the same datasheet as bf16_tflops
    fp8_tflops: float = 0.0
    # the attention kernel PyTorch's scaled_dot_product_attention runs (FlashAttention-2), forward
    # and backward, as fractions of the BF16 peak: its published throughput
    attention_efficiency: tuple[float, float] = (0.35, 0.35)
    attention_source: str = ""

    @property
    def usable_bytes(self) -> int:
        """What one training process can allocate: the CUDA total less the context."""
        return self.cuda_total_bytes - CUDA_CONTEXT_BYTES


# The CUDA context PyTorch creates on its first CUDA call (CUDA >= 11.7, lazy module loading):
# "around 400MB" (pytorch/pytorch#109888, a PyTorch maintainer); ~287 MB measured in
# pytorch/pytorch#86509. Taken as 400 MiB, the larger reading.
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
HOST_ADAM_SOURCE = ("DeepSpeedCPUAdam on a GPU server's host, one process: 136M fp32 parameters in 54.8 ms "
                    "(numa-cpu-adam-bench)")


# Attention: FlashAttention-2, the kernel torch's scaled_dot_product_attention runs on these
# GPUs, at its published throughput (a fraction of the BF16 peak; the backward, where no
# separate figure is published, at the forward's)
_FA2_HOPPER = ("FlashAttention-2 reaches 35% of the H100's peak (Shah et al. 2024, FlashAttention-3, arXiv "
               "2407.08608, §1); backward at the forward's fraction")
_FA2_AMPERE = "FlashAttention-2 up to 73% of the A100's 312 TFLOP/s (Dao 2023, arXiv 2307.08691)"
_FA2_ASSUMED = "no FlashAttention figure published for this GPU: the H100's 35% (Shah et al. 2024, §1), assumed"
_NIC_ASSUMED = "no NIC in the datasheet or a reference system: 400 Gb/s per GPU assumed, as DGX H100"

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
        cuda_total_bytes=85_045_477_376,
        total_source="deviceQuery on H100 80GB HBM3: 85045477376 bytes; nvidia-smi 81559 MiB less 454 MiB "
                     "reserved (github.com/thamada/nvidia-smi, nvsim/H100SXMx8_*)",
        matmul_efficiency=0.801, matmul_source="MAMF 792.1 of 989 TFLOPS, BF16 matmul, CUDA 12.1 "
                                               "(stas00/ml-engineering, compute/accelerator)",
        attention_source=_FA2_HOPPER),
    GPU("h100-pcie", 80 * 10**9, 756.5, 2.0, "NVIDIA H100 datasheet, PCIe (BF16 756, FP8 1,513 dense; 2 TB/s)", 64.0,
        fp8_tflops=1513.0,
        link_source="H100 datasheet: PCIe Gen5 128 GB/s (GPU to GPU over PCIe); 400 Gb/s NIC per GPU",
        node_link_kind="pcie",
        cuda_total_bytes=81559 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on H100 PCIe: 81559 MiB (Beomi/BitNet-Transformers README), less the SXM's "
                     "454 MiB driver reservation (assumed)",
        matmul_efficiency=0.801, matmul_source="the H100 SXM's MAMF efficiency, 792.1 of 989 TFLOPS "
                                               "(stas00/ml-engineering; none published for PCIe)",
        attention_source=_FA2_HOPPER),
    # NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e, 4.8 TB/s, same compute as H100 SXM
    GPU("h200", 141 * 10**9, 989.4, 4.8, "NVIDIA H200 datasheet, SXM (BF16 989, FP8 1,979 dense; 4.8 TB/s)", 450.0,
        fp8_tflops=1978.9,
        link_source="H200 datasheet: NVLink 900 GB/s, PCIe Gen5 128 GB/s; DGX H200: 400 Gb/s NIC per GPU",
        cuda_total_bytes=143771 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on H200: 143771 MiB (sgl-project/sglang#3196), less the H100's 454 MiB driver "
                     "reservation (assumed)",
        matmul_efficiency=0.830, matmul_source="MAMF 821.0 of 989 TFLOPS on GH200 (the same H100/H200 chip), "
                                               "CUDA 12.5 (stas00/ml-engineering)",
        attention_source=_FA2_HOPPER),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 part with 96 GB HBM3 at 4 TB/s (or
    # 144 GB HBM3e at 4.9 TB/s), H100 SXM compute; NVLink 900 GB/s GPU to GPU, NVLink-C2C 900 GB/s
    # to the Grace CPU (the host link an offload crosses)
    GPU("gh200", 96 * 10**9, 989.4, 4.0, "NVIDIA GH200 datasheet, 96 GB HBM3 (BF16 989, FP8 1,979 dense; 4 TB/s)",
        450.0, host_link_gb_per_s=450.0, fp8_tflops=1978.9,
        link_source=f"GH200 datasheet: NVLink 900 GB/s, NVLink-C2C 900 GB/s to the CPU; {_NIC_ASSUMED}",
        cuda_total_bytes=96 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        matmul_efficiency=0.830, matmul_source="MAMF 821.0 of 989 TFLOPS on GH200, CUDA 12.5 (stas00/ml-engineering)",
        attention_source=_FA2_HOPPER),
    GPU("gh200-144g", 144 * 10**9, 989.4, 4.9,
        "NVIDIA GH200 datasheet, 144 GB HBM3e (BF16 989, FP8 1,979 dense; 4.9 TB/s)", 450.0,
        host_link_gb_per_s=450.0, fp8_tflops=1978.9,
        link_source=f"GH200 datasheet: NVLink 900 GB/s, NVLink-C2C 900 GB/s to the CPU; {_NIC_ASSUMED}",
        cuda_total_bytes=144 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        matmul_efficiency=0.830, matmul_source="MAMF 821.0 of 989 TFLOPS on GH200, CUDA 12.5 (stas00/ml-engineering)",
        attention_source=_FA2_HOPPER),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense, no FP8; 40 GB 1,555 GB/s,
    # 80 GB SXM 2,039 GB/s; NVLink 600 GB/s, PCIe Gen4 64 GB/s; DGX A100: 8x HDR 200 Gb/s
    GPU("a100-40g", 40 * 10**9, 312.0, 1.555, "NVIDIA A100 datasheet, 40 GB SXM (BF16 312 dense, no FP8; 1.555 TB/s)",
        300.0, 25.0, 32.0,
        link_source="A100 datasheet: NVLink 600 GB/s, PCIe Gen4 64 GB/s; DGX A100: 200 Gb/s HDR per GPU",
        cuda_total_bytes=42_298_834_944,
        total_source="deviceQuery on A100-SXM4-40GB: 42298834944 bytes (bottlerocket-os/bottlerocket PR #3873)",
        matmul_efficiency=0.859, matmul_source="MAMF 267.9 of 312 TFLOPS, A100 SXM, CUDA 12.1 (stas00/ml-engineering)",
        attention_efficiency=(0.73, 0.73), attention_source=_FA2_AMPERE),
    GPU("a100-80g", 80 * 10**9, 312.0, 2.039, "NVIDIA A100 datasheet, 80 GB SXM (BF16 312 dense, no FP8; 2.039 TB/s)",
        300.0, 25.0, 32.0,
        link_source="A100 datasheet: NVLink 600 GB/s, PCIe Gen4 64 GB/s; DGX A100: 200 Gb/s HDR per GPU",
        cuda_total_bytes=85_100_068_864,
        total_source="deviceQuery on A100-SXM4-80GB: 85100068864 bytes; nvidia-smi 81920 MiB less 763 MiB "
                     "reserved (github.com/thamada/nvidia-smi, gls/A100SXMx4_*)",
        matmul_efficiency=0.859, matmul_source="MAMF 267.9 of 312 TFLOPS, A100 SXM, CUDA 12.1 (stas00/ml-engineering)",
        attention_efficiency=(0.73, 0.73), attention_source=_FA2_AMPERE),
    # NVIDIA DGX B200 datasheet (2024): 1,440 GB for 8 GPUs (180 GB each), 72 PFLOPS FP8 training
    # for 8 GPUs (sparse: 4.5 dense each); HGX B200: BF16 2.25 PFLOPS dense (4.5 with sparsity),
    # HBM3e 8 TB/s, NVLink 5 1.8 TB/s
    GPU("b200", 180 * 10**9, 2250.0, 8.0,
        "NVIDIA DGX B200 / HGX B200 datasheets (BF16 2,250, FP8 4,500 dense; 8 TB/s)", 900.0, fp8_tflops=4500.0,
        link_source="HGX B200 datasheet: NVLink 1.8 TB/s per GPU; DGX B200: 400 Gb/s per GPU; PCIe Gen5",
        cuda_total_bytes=183359 * _MIB - _H100_RESERVED,
        total_source="nvidia-smi on B200: 183359 MiB (NVIDIA/TensorRT-LLM#10278), less the H100's 454 MiB "
                     "driver reservation (assumed)",
        matmul_efficiency=0.801, matmul_source="the H100 SXM's MAMF efficiency (stas00/ml-engineering; no B200 "
                                               "BF16 figure published there)",
        attention_source=_FA2_ASSUMED),
    # NVIDIA GB200 NVL72 datasheet (2024), per rack of 72 GPUs: 360 PFLOPS BF16 and 720 PFLOPS FP8
    # (sparse: 2,500 and 5,000 dense per GPU), 13.4 TB HBM3e (186 GB per GPU), 576 TB/s (8 TB/s per
    # GPU), NVLink 130 TB/s (1.8 TB/s per GPU), all 72 in one NVLink domain; NVLink-C2C 900 GB/s to
    # the Grace CPU
    GPU("gb200", 186 * 10**9, 2500.0, 8.0,
        "NVIDIA GB200 NVL72 datasheet (BF16 2,500, FP8 5,000 dense per GPU; 8 TB/s)", 900.0,
        host_link_gb_per_s=450.0, gpus_per_node=72, fp8_tflops=5000.0,
        link_source=f"GB200 NVL72 datasheet: NVLink 1.8 TB/s per GPU across the 72, NVLink-C2C 900 GB/s to the "
                    f"CPU; {_NIC_ASSUMED}",
        cuda_total_bytes=186 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        matmul_efficiency=0.801, matmul_source="the H100 SXM's MAMF efficiency (stas00/ml-engineering; none "
                                               "published for GB200)",
        attention_source=_FA2_ASSUMED),
    # AMD Instinct MI300X datasheet (2023): 192 GB HBM3, 5.3 TB/s, BF16 1,307.4 TFLOPS dense
    # (2,614.9 with sparsity), FP8 2,614.9 dense (5,229.8 with sparsity)
    GPU("mi300x", 192 * 10**9, 1307.4, 5.3,
        "AMD Instinct MI300X datasheet (BF16 1,307.4, FP8 2,614.9 dense; 5.3 TB/s)", 448.0, fp8_tflops=2614.9,
        link_source="MI300X datasheet: Infinity Fabric 896 GB/s peer to peer, PCIe Gen5 128 GB/s; "
                    "400 Gb/s NIC per GPU assumed",
        cuda_total_bytes=196592 * _MIB,
        total_source="hipGetDeviceProperties on MI300X: 196592 MB total global memory "
                     "(github.com/thamada/nvidia-smi, package/MI300X_deviceQuery.py)",
        matmul_efficiency=0.601, matmul_source="MAMF 781.9 of 1300 TFLOPS, ROCm 6.2 (stas00/ml-engineering)",
        attention_source=_FA2_ASSUMED),
    # NVIDIA L4 Tensor Core GPU datasheet (2023): 24 GB GDDR6 at 300 GB/s, BF16 121 TFLOPS dense
    # (242 with sparsity), FP8 242.5 dense (485 with sparsity), PCIe Gen4 x16 64 GB/s, no NVLink
    GPU("l4", 24 * 10**9, 121.0, 0.300, "NVIDIA L4 datasheet (BF16 121, FP8 242.5 dense; 300 GB/s GDDR6)", 32.0,
        host_link_gb_per_s=32.0, fp8_tflops=242.5, node_link_kind="pcie",
        link_source=f"L4 datasheet: PCIe Gen4 x16 64 GB/s, no NVLink (GPU to GPU over PCIe); {_NIC_ASSUMED}",
        cuda_total_bytes=24 * 10**9 - _H100_RESERVED,
        total_source="memory as sold less the H100's 454 MiB driver reservation (assumed; no device query found)",
        matmul_efficiency=0.859, matmul_source="the A100's MAMF efficiency, 267.9 of 312 TFLOPS (stas00/ml-engineering; "
                                               "none published for L4)",
        attention_efficiency=(0.73, 0.73),
        attention_source=f"{_FA2_AMPERE}; none published for L4, the Ampere figure assumed"),
)}

GPU_ALIASES = {"h100": "h100-sxm", "gh200-96g": "gh200"}


def gpu(name: str) -> GPU:
    key = GPU_ALIASES.get(name.lower(), name.lower())
    if key not in GPUS:
        raise UserError(f"unknown --gpu {name!r}; choose one of {', '.join([*GPUS, *GPU_ALIASES])}")
    return GPUS[key]
