"""What a run measured (RunReport) and the time constants `ckplan calibrate` fitted (Calibration)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from planner.schema.fields import (
    MAX_LATENCY_MS,
    MAX_MICROBATCHES,
    MAX_RANKS,
    MAX_SCALE,
    MAX_STAGES,
    MAX_STEPS,
    MIN_SCALE,
    SCHEMA_VERSION,
    Bytes,
    FileRef,
    GbPerS,
    Ms,
    Strict,
)
from planner.schema.plan import StagePredicted
from planner.schema.profile import DeviceInfo

# ---------------------------------------------------------------- run report


class ChunkMeasured(Strict):
    """One pipeline stage of a rank (a chunk), per microbatch, medians: what the schedule's
    simulation takes as an action's time (planner/cost/schedule_time.py StageTimes)."""

    stage: int = Field(ge=0, le=MAX_STAGES)  # the pipeline stage (torch's stage_index)
    fwd_ms: float  # F; the last stage's includes the loss
    bwd_ms: float  # B, or I (the input-gradient pass) where the schedule splits the backward
    weight_grad_ms: float = 0.0  # W, the weight-gradient pass of a split backward (0 where none)


class StageMeasured(Strict):
    peak_bytes: int
    fwd_ms: float  # per microbatch, median
    bwd_ms: float  # per microbatch, median (includes recompute)
    time_ms: float  # fwd + bwd for one microbatch
    step_ms: float | None = None  # optimizer step, median over the timed steps
    static_bytes: int | None = None  # weights + grads + optimizer state on the device, the most at once in a step, largest dp rank
    host_bytes: int | None = None  # the offloaded optimizer's host memory, largest dp rank
    reserved_bytes: int | None = None  # cuda: torch.cuda.max_memory_reserved, largest dp rank
    chunks: list[ChunkMeasured] = []  # per stage the rank holds, chunk 0 first (reports before: none)


class StageReport(Strict):
    index: int = Field(ge=0, le=MAX_STAGES)
    cap_bytes: Bytes
    predicted: StagePredicted | None = None  # None when the plan's stage carried no prediction
    measured: StageMeasured


class RunReport(Strict):
    schema_version: int = SCHEMA_VERSION
    created_at: str
    plan: FileRef
    strategy: str = "ckplan"
    device: DeviceInfo  # device.threads: torch threads per rank
    # the profile's threads, cores / ranks, or --threads
    threads_source: Literal["plan", "cpu_count", "option"] | None = None
    backend: str
    steps: int = Field(ge=0, le=MAX_STEPS)
    warmup_steps: int = Field(ge=0, le=MAX_STEPS)
    microbatches: int = Field(gt=0, le=MAX_MICROBATCHES)
    iteration_ms: float  # median over measured steps
    iteration_ms_all: list[float]
    predicted_iteration_ms: float
    losses: list[float]
    stages: list[StageReport]


# ---------------------------------------------------------------- calibration


class PlacementFit(Strict):
    """What one pipeline run with `ranks` processes of `threads` torch threads each, on a
    machine of `cores` cores, measured against the profile's prediction."""

    ranks: int = Field(gt=0, le=MAX_RANKS)
    threads: int = Field(gt=0, le=1 << 16)
    cores: int = Field(gt=0, le=1 << 16)
    compute_scale: float = Field(ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)  # measured / profiled compute per stage
    cpu_sharing: float = Field(default=1.0, ge=MIN_SCALE, le=MAX_SCALE, allow_inf_nan=False)  # fitted only when ranks share cores
    plan: str  # the plan that ran
    measured_iteration_ms: Ms
    predicted_before_ms: Ms  # the plan's iteration by the uncalibrated cost model
    predicted_after_ms: Ms  # and with these constants


class Calibration(Strict):
    """Time constants fitted to measurements by `ckplan calibrate`; `solve` reads them
    from the file beside the profile (<profile>.calibration.json)."""

    schema_version: int = SCHEMA_VERSION
    created_at: str
    profile: FileRef
    backend: str  # gloo, nccl
    device_type: Literal["cpu", "cuda"]
    send_latency_ms: float = Field(ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    send_gb_per_s: GbPerS | None = None
    action_overhead_ms: float = Field(default=0.0, ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)
    placements: list[PlacementFit] = []
    notes: list[str] = []  # what was measured, how each constant was fitted
