"""Each GPU record's streaming multiprocessors (an AMD GPU's compute units): what a collective's CTAs take from the
compute beside it (planner/cost/nccl_sms.py). The records that already carry `num_sms` (A100, B200, GB200,
planner/models/gpus.py, each with its source) keep theirs; the rest are here, one source each (docs/framework-facts.md
§128)."""

from __future__ import annotations

# NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), "H100 SXM5 ... 132 SMs", "H100 PCIe ... 114 SMs"; the
# NVIDIA developer forum's nsys trace of an H100 (Compute-Communication Overlap Causes Severe GEMM Performance
# Degradation because of Tail Effect, 2025: "my H100 GPU, which has 132 SMs")
_H100_SXM = (132, "NVIDIA H100 architecture whitepaper (2022): H100 SXM5, 132 SMs")
_H100_PCIE = (114, "NVIDIA H100 architecture whitepaper (2022): H100 PCIe, 114 SMs")
# H200 and the 96 GB H100 are the GH100 as H100 SXM5 ships it (132 SMs) with other HBM; GH200's Hopper is the same
# part (NVIDIA Grace Hopper Superchip Architecture whitepaper, 2023: "the H100 GPU ... 132 SMs")
_GH100_132 = (132, "GH100 as H100 SXM5 ships it, other HBM (H100 whitepaper; Grace Hopper whitepaper: 132 SMs)")
# AMD CDNA 3 architecture whitepaper / AMD Instinct MI300X datasheet: 304 compute units (8 XCDs x 38)
_MI300X = (304, "AMD Instinct MI300X datasheet / CDNA 3 whitepaper: 304 compute units")
# NVIDIA Ada GPU architecture whitepaper (2022), L4 (AD104): 58 SMs
_L4 = (58, "NVIDIA Ada architecture whitepaper (2022): L4, 58 SMs")

SMS: dict[str, tuple[int, str]] = {
    "h100-sxm": _H100_SXM, "h100-pcie": _H100_PCIE, "h100-96g": _GH100_132, "h200": _GH100_132,
    "gh200": _GH100_132, "gh200-144g": _GH100_132, "mi300x": _MI300X, "l4": _L4,
}


def sm_count(gpu) -> int:
    """The GPU's SMs (compute units): the record's num_sms where it has one, else this table's; 0: not known."""
    return gpu.num_sms or SMS.get(gpu.name, (0, ""))[0]
