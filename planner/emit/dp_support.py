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

from planner.cost import runtimes
from planner.schema import TrainSetup


@dataclass(frozen=True)
class ZeroLimit:
    target: str
    max_zero: int  # the highest ZeRO stage it runs with more than one pipeline stage
    why: str


# the runtime whose record says what each target runs (cost/runtimes.py: pipeline_max_zero, shard_group_zero)
RUNTIMES = {"ColossalAI": "colossalai", "DeepSpeed": "deepspeed"}


def _record_limit(target: str) -> ZeroLimit:
    record = runtimes.facts(RUNTIMES[target], None)
    return ZeroLimit(target, record.pipeline_max_zero, record.sources["pipeline_max_zero"])


LIMITS = {limit.target: limit for limit in (
    _record_limit("ColossalAI"),
    _record_limit("DeepSpeed"),
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


def round_shard_group(rounded, target: str) -> None:
    """Export over the whole data-parallel group where the target shards over no smaller one at the plan's
    ZeRO stage (its runtime record's shard_group_zero: DeepSpeed since MiCS was removed), saying so, so the
    re-score charges what its config runs."""
    record = runtimes.facts(RUNTIMES[target], None)
    data_parallel = rounded.setup.data_parallel
    group = data_parallel.shard_group
    if record.shard_group_zero is None or not group or group >= data_parallel.dp \
            or data_parallel.zero in record.shard_group_zero:
        return
    rounded.setup = rounded.setup.model_copy(update={"shard_group": None})
    rounded.changes.append(f"{target} shards ZeRO-{data_parallel.zero} over the whole data-parallel group, not in "
                           f"groups of {group} (the {record.name} record's shard_group_zero); exported over all "
                           f"{data_parallel.dp} ranks")
