"""Two facts of a cluster's topology, kept apart (planner/models/gpus.py GPU.gpus_per_node, GPU.nvlink_domain):

- the host: the GPUs one host (node) runs: its processes (torchrun's --nproc-per-node, Slurm's --gpus-per-node), the
  host memory its ranks share (--host-mem), its NICs. `--gpus-per-node`, else the GPU record's (a DGX's 8; a GB200
  compute tray's 4);
- the NVLink domain: the GPUs that reach each other over NVLink, which a collective's link is chosen by (NVLink inside,
  the NICs between). `--nvlink-domain`, else the GPU record's where it spans hosts (GB200 NVL72: 72), else the host.
  A job placed in smaller blocks of a domain (Megatron-Bridge's Slurm `--segment` of 16 GB200 trays, 64 GPUs:
  scripts/performance/utils/executors.py 113-121 at 00b7660b) gives that block.

A domain holds whole hosts: one not a multiple of the host's GPUs is refused."""

from __future__ import annotations

from planner.errors import UserError


def host_gpus(gpu, gpus_per_node: int | None) -> int:
    """GPUs one host runs: --gpus-per-node, else the GPU record's."""
    return gpus_per_node or gpu.gpus_per_node


def nvlink_domain(gpu, gpus_per_node: int | None, domain: int | None) -> int:
    """GPUs one NVLink domain holds: --nvlink-domain, else the record's where it names one (a rack of several hosts),
    else the host's (host_gpus); refused where it is not a whole number of hosts."""
    host = host_gpus(gpu, gpus_per_node)
    found = domain or gpu.nvlink_domain or host
    if found % host:
        said = (f"--nvlink-domain {domain}" if domain else f"{gpu.name}'s NVLink domain of {found} GPUs")
        raise UserError(f"{said} is not a whole number of hosts of {host} GPUs (--gpus-per-node): give an "
                        f"--nvlink-domain that is a multiple of {host}")
    return found
