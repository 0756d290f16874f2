"""The vocabulary every record shares: versions, the schedules, optimizers and dtypes by name, the
bounds a measured number or a count must keep, and the base model that forbids unknown fields."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1  # run reports
# profiles: 2 names the attention core `core-attn` (analytic profiles named it `attn` before, which is
# the whole attention module in every profile now); version 1 analytic profiles load with their
# `attn` read as `core-attn` (planner/schema/renames.py)
PROFILE_SCHEMA_VERSION = 2
PROFILE_SCHEMA_VERSIONS = (1, 2)

Schedule = Literal["1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV"]
# schedules whose ranks hold several stages (chunks) each: planner/cost/schedules.py simulates them
CHUNKED_SCHEDULES = ("interleaved-1F1B", "ZB", "ZBV", "DualPipeV")
# schedules that split a backward into its input- and weight-gradient passes (two autograd calls)
SPLIT_BACKWARD_SCHEDULES = ("ZB", "ZBV", "DualPipeV")
Optimizer = Literal["adam", "sgd"]
Precision = Literal["fp32", "bf16", "bf16-mixed", "fp16-mixed"]  # fp16-mixed: fp16 with a loss scaler
Dtype = Literal["float32", "bfloat16", "float16"]  # what the profiler casts to and the runtime runs in

# Measured numbers must be finite and not negative; past these bounds a value is a
# corrupt or hand-mangled file, not a measurement (2**60 bytes is an exbibyte, 1e9 ms
# eleven days for one layer on one microbatch).
MAX_BYTES = 2**60
MAX_MS = 1e9
Bytes = Annotated[int, Field(ge=0, le=MAX_BYTES)]
Count = Annotated[int, Field(ge=0, le=MAX_BYTES)]
# Counts a setup holds. Past these a file is mangled, not a job: no pipeline has 16,384 stages,
# 65,536 microbatches per iteration (a replay or a schedule of them runs for hours), a
# microbatch of a million samples or a million data-parallel replicas.
MAX_STAGES = 1 << 14
MAX_MICROBATCHES = 1 << 16
MAX_SAMPLES = 1 << 20
MAX_RANKS = 1 << 20
MAX_STEPS = 1 << 20
Ms = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileRef(Strict):
    """A file other files depend on, pinned by content."""

    file: str
    sha256: str


# A link or copy bandwidth past this is no hardware (HBM moves ~5e3 GB/s); a host step past
# MAX_MS ms per parameter is a mangled file, not a measurement.
MAX_GB_PER_S = 1e5
GbPerS = Annotated[float, Field(ge=1e-6, le=MAX_GB_PER_S, allow_inf_nan=False)]  # 1 kB/s .. 100 TB/s

# A scale past this (a stage 1000x slower than profiled, or 1000x faster) or a latency past a
# second is a fit gone wrong, not a machine.
MAX_SCALE = 1e3
MIN_SCALE = 1 / MAX_SCALE
MAX_LATENCY_MS = 1e3
