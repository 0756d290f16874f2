"""What a GPU's copy engines move from one peer in its node, per direction, where published: the rate
AsyncTP's peer copies run at (planner/cost/comm.py async_tp_pass_ms, planner/cost/asynctp.py).

torch's symmetric-memory fused all-gather + matmul and matmul + reduce-scatter move each chunk with
`d.copy_(s)`, the source (or destination) a peer's symmetric buffer (pytorch/pytorch 006b161f
torch/distributed/_symmetric_memory/__init__.py `_pipelined_multi_all_gather_and_consume`,
`_pipelined_produce_and_all2all`); a copy between two contiguous tensors of one dtype is
`cudaMemcpyAsync` (aten/src/ATen/native/cuda/Copy.cu `copy_device_to_device`, `memcpy_eligible`): a
copy-engine peer copy, not NCCL's ring kernel on the SMs (docs/framework-facts.md §126). Each copy pulls from
one peer while another peer pulls from this rank: a direction's rate with both directions busy.

A GPU absent here keeps the tensor-parallel group's NCCL ring rate (CommSetup.tp_gb_per_s) for those copies,
and the commands say so."""

from __future__ import annotations

_NCCL_1264 = ("p2pBandwidthLatencyTest on HGX H100 (NVLink 4, copy engines): bidirectional 740.6-749.0 GB/s "
              "between GPU 0 and each of its seven peers, mean 743.1, 371.6 a direction (NVIDIA/nccl#1264, 2024-04-24)")
_XGMI = ("MI300X platform: one xGMI link to each of the seven peers, 'rated up to 64 GB/s', 'approximately 48 GB/s "
         "per link' usable (ROCm/rocm-blogs 'Understanding RCCL Bandwidth and xGMI Performance on AMD Instinct "
         "MI300X', 2025-03-02); a peer copy crosses one link")

# GPU name (planner/models/gpus.py) -> (GB/s a direction from one peer, source)
PEER_COPY = {
    "h100-sxm": (371.6, _NCCL_1264),
    # torchtitan's Grand Teton H100s: 8 "fully connected with NVLink", the SXM's NVLink assumed, as its NCCL
    # figures are (gpus.py's h100-96g record)
    "h100-96g": (371.6, f"the H100 SXM's, assumed for this NVLink host: {_NCCL_1264}"),
    "mi300x": (48.0, _XGMI),
}


def peer_copy_rate(gpu_name: str) -> tuple[float, str] | None:
    """(GB/s a direction, source) of a copy-engine copy from one peer on `gpu_name`; None where none is
    published (the ring's rate is charged then)."""
    return PEER_COPY.get(gpu_name)


def tp_in_one_node(tp: int, gpus_per_node: int) -> bool:
    """Whether every tensor-parallel group (tp adjacent ranks, groups aligned at multiples of tp) lies in
    one node: symmetric memory maps peers' buffers over the node's links only."""
    return tp <= gpus_per_node and gpus_per_node % tp == 0


def tp_copy_fields(gpu_name: str, *, tp: int, gpus_per_node: int) -> tuple[dict, str]:
    """CommSetup's tp_copy_gb_per_s for AsyncTP's peer copies of a tensor-parallel group of `tp` on `gpu_name`,
    and what the commands say of it: the copy engines' rate where published and the group lies in one node;
    nothing (the ring's rate charged) otherwise."""
    if not tp_in_one_node(tp, gpus_per_node):
        return {}, (f"AsyncTP's peer copies at the ring's rate: a group of {tp} does not lie in one node of "
                    f"{gpus_per_node}")
    found = peer_copy_rate(gpu_name)
    if found is None:
        return {}, (f"AsyncTP's peer copies at NCCL's ring rate: no copy-engine rate published for {gpu_name} "
                    "(planner/models/copy_engines.py)")
    rate, source = found
    return {"tp_copy_gb_per_s": rate}, f"AsyncTP's peer copies at the copy engines' {rate:g} GB/s a direction ({source})"
