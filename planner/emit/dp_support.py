"""Which ZeRO stages a framework runs beside pipeline parallelism, from its own code, and
the rounding an export makes when a plan asks for more.

ColossalAI 0.4/0.5, colossalai/booster/plugin/hybrid_parallel_plugin.py, HybridParallelPlugin.__init__:
    assert zero_stage in (0, 1, 2)
    if self.pp_size > 1: ... assert self.zero_stage <= 1, "zero stage must be 0 or 1 when using pipeline parallelism"
DeepSpeed, deepspeed/runtime/pipe/engine.py, PipelineEngine.__init__:
    assert self.zero_optimization_stage() < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
Megatron-LM: the exporter writes --use-distributed-optimizer, which shards the optimizer state
and fp32 master over the data-parallel ranks (ZeRO-1); weights and gradients stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.schema import TrainSetup


@dataclass(frozen=True)
class ZeroLimit:
    target: str
    max_zero: int  # the highest ZeRO stage it runs with more than one pipeline stage
    why: str


LIMITS = {limit.target: limit for limit in (
    ZeroLimit("ColossalAI", 1, "HybridParallelPlugin asserts zero_stage <= 1 when pp_size > 1"),
    ZeroLimit("DeepSpeed", 1, "its PipelineEngine asserts ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                              "parallelism"),
    ZeroLimit("Megatron-LM", 1, "--use-distributed-optimizer shards the optimizer state only (ZeRO-1)"),
)}


def refusal(target: str, setup: TrainSetup) -> str | None:
    """A sentence when `target` cannot run the setup's ZeRO stage with its pipeline; else None."""
    limit = LIMITS.get(target)
    if limit is None or setup.pipeline.stages == 1 or setup.data_parallel.zero <= limit.max_zero:
        return None
    return f"{target} cannot run ZeRO-{setup.data_parallel.zero} with {setup.pipeline.stages} pipeline stages: {limit.why}"


def refused_by(setup: TrainSetup) -> list[str]:
    """The frameworks that refuse this setup's ZeRO stage beside its pipeline."""
    return [target for target in LIMITS if refusal(target, setup)]


def round_zero(rounded, target: str) -> None:
    """Export with the highest ZeRO stage the target runs, saying so (the re-score then shows
    what the unsharded state costs in memory)."""
    sentence = refusal(target, rounded.setup)
    if sentence is None:
        return
    stage = LIMITS[target].max_zero
    rounded.setup = rounded.setup.model_copy(update={"zero": stage})
    rounded.changes.append(f"{sentence}; exported with ZeRO-{stage}")
