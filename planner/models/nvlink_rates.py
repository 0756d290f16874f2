"""What NCCL's transfers reach over a GPU's NVLinks inside a node (docs/framework-facts.md §102): NCCL's own
effective figure for one NVLink by compute capability, times the GPU's links. The GPU records (gpus.py) read it
for an expert-parallel all-to-all inside a node."""

from __future__ import annotations

# NCCL's effective bandwidth of one NVLink, GB/s one way, by the GPU's compute capability (src/graph/topo.h
# SM80_NVLINK_BW 20.0 (read again at NVIDIA/nccl 069a3d4f; NVLink 3: 25 GB/s a link, 12 on an A100 SXM for its 300),
# SM90_NVLINK_BW 20.6 since 2.20.3-1, SM100_NVLINK_BW 40.1 since 2.27.5-1, read at NVIDIA/nccl 5067397c), which
# topo.cc multiplies by the GPU's NVLink count (count * nvlBw) for its link to the NVSwitch; against the line rate of
# one link (NVLink 4: 25 GB/s, 18 on an H100 SXM for its 450; NVLink 5: 50 GB/s, 18 on a B200 for its 900): an SM's
# 128-byte payloads and NCCL's protocol (an NCCL maintainer, NVIDIA/nccl-tests#212: "450GB/s is the line rate. With
# the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as
# 'BusBw' when running non-allreduce operations")
NCCL_NVLINK_LINK_GB_PER_S = {80: (20.0, 25.0), 90: (20.6, 25.0), 100: (40.1, 50.0)}  # compute capability x 10: (NCCL's, line rate)
NCCL_NVLINK_SOURCE = ("NCCL src/graph/topo.h: SM80_NVLINK_BW 20.0 (069a3d4f), SM90_NVLINK_BW 20.6, SM100_NVLINK_BW 40.1 GB/s a link (NVIDIA/nccl "
                      "5067397c; 2.20.3-1 and 2.27.5-1 on), x the GPU's NVLinks (topo.cc count * nvlBw); an NCCL "
                      "maintainer: \"an effective NVLink bandwidth of 370GB/s\" on H100 for non-allreduce operations "
                      "(NVIDIA/nccl-tests#212); alltoall_perf on 4 H100 in a node, 524 MB: busbw 334.9 / 338.0 GB/s "
                      "(NVIDIA/nccl#2169); NCCL's maxBw 721.8 on B200 (NVIDIA/nccl#1807)")


def nccl_nvlink_rate(link_gb_per_s: float, capability: int) -> float:
    """GB/s one way NCCL's transfers reach over a GPU's NVLinks to its NVSwitch: the datasheet's one-way rate over
    one link's line rate (its NVLink count) times NCCL's effective rate a link (NCCL_NVLINK_LINK_GB_PER_S)."""
    nccl, line = NCCL_NVLINK_LINK_GB_PER_S[capability]
    return round(round(link_gb_per_s / line) * nccl, 1)
