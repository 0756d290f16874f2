"""The data that flows between rooms: profile, training setup, plan and run report.

Every model forbids unknown fields, so a typo in a hand-edited plan or a file from
another tool is rejected with the field's name instead of being silently ignored.
Bytes are ints, times are float milliseconds; names carry their unit. This face hands on the
names of fields.py (shared types, bounds), profile.py, setup.py, plan.py and report.py.
"""
# isort: skip_file
# ruff: noqa: F401  (every import here is handed on: `from planner.schema import X` for any X below)

from planner.schema.fields import (
    CHUNKED_SCHEDULES, MAX_BYTES, MAX_GB_PER_S, MAX_LATENCY_MS, MAX_MICROBATCHES, MAX_MS, MAX_RANKS,
    MAX_SAMPLES, MAX_SCALE, MAX_STAGES, MAX_STEPS, MIN_SCALE, PROFILE_SCHEMA_VERSION, PROFILE_SCHEMA_VERSIONS, SCHEMA_VERSION, SPLIT_BACKWARD_SCHEDULES, Bytes,
    Count, Dtype, FileRef, GbPerS, Ms, Optimizer, Precision, Schedule, Strict)
from planner.schema.profile import (
    OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD, SELECTIVE_CHECKPOINT_PARTS, AllocRecord, CollectiveKind, CompiledTime,
    DeviceInfo, Float8Delayed, Float8Linears, FusedKernelTime, FusedMatmuls, LayerCollective, LayerContextParallel,
    LayerProfile, OptionName, Profile, RecomputeOption, RingGemm, TiedSet,
    runs_split_backward)
from planner.schema.setup import (
    PART_OF_FIELD, SETUP_PARTS, CommSetup, DataParallelSetup, PipelineSetup, Runtime, TimeConstants, TpOverlap,
    TrainSetup, TrainingSetup, nest_setup_fields)
from planner.schema.plan import (
    PLAN_CORE_ATTN_VERSION, PLAN_SCHEMA_VERSION, PLAN_SCHEMA_VERSIONS, BaselineResult, Plan, PlanPredicted, SolverInfo, StagePlan,
    StagePredicted)
from planner.schema.report import (
    Calibration, ChunkMeasured, PlacementFit, RunReport, StageMeasured, StageReport)

