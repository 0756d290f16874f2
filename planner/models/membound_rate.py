"""The rate memory-bound kernels reach on a GPU, from its record alone (planner/models/gpus.py's
membound_*_efficiency fields, each with its source): planner/profiler/membound.py times kernels by it, and the
cost model's few kernels no profile records (TE's userbuffers reduce, planner/cost/ub_sms.py) read it here, below
both rooms."""

from __future__ import annotations

from typing import Literal

from planner.models.gpus import GPU

MemboundKind = Literal["eager", "fused"]


def fraction(gpu: GPU, kind: MemboundKind = "eager", op_class: str | None = None) -> float:
    """The fraction of the datasheet bandwidth memory-bound kernels of `kind` (and eager `op_class`)
    reach on `gpu`: the class's own where measured on the GPU's architecture, else the eager mean."""
    if kind == "fused":
        return gpu.membound_fused_efficiency
    return dict(gpu.membound_class_efficiency).get(op_class, gpu.membound_eager_efficiency)


def achieved_tbps(gpu: GPU, kind: MemboundKind = "eager", op_class: str | None = None) -> float:
    """The bandwidth memory-bound kernels of `kind` (and eager `op_class`) are measured to reach on `gpu`, TB/s."""
    return gpu.hbm_tbps * fraction(gpu, kind, op_class)
