"""What a runtime runs, from its record (runtimes.facts): the ZeRO stages (its bf16 optimizer's only one,
bf16_zero; the highest beside a pipeline, pipeline_max_zero; those it shards over a group smaller than the
data-parallel ranks at, shard_group_zero), microbatches without a pipeline (accumulates_without_pipeline) and tied
weights beside one (ties_across_stages).
The single-setup commands refuse the rest in one sentence (commands/setup_options.check_zero_runtime); the
whole-job search skips them (solve/jobsearch)."""

from __future__ import annotations

from planner.cost import runtime_fp16
from planner.cost.runtimes import facts


def zero_refused(runtime: str, version: str | None, *, precision: str, zero: int, dp: int) -> str | None:
    """A sentence where the runtime's bf16-mixed optimizer runs another ZeRO stage than the one asked (its
    record's bf16_zero) over more than one data-parallel rank; else None."""
    record = facts(runtime, version)
    if record.bf16_zero is None or precision != "bf16-mixed" or dp == 1 or zero == record.bf16_zero:
        return None
    return (f"--zero {zero} under --runtime {runtime} {record.version}: its bf16 optimizer (BF16_Optimizer) shards "
            f"the fp32 master and Adam's states over the data-parallel ranks and keeps the weights and gradients "
            f"whole, whatever its config says, which ckplan counts as ZeRO {record.bf16_zero}: give --zero "
            f"{record.bf16_zero}")


def data_parallel_refused(runtime: str, version: str | None, *, precision: str, zero: int, dp: int,
                          shard_group: int | None, stages: int) -> str | None:
    """A sentence where the runtime cannot run this ZeRO stage: under its bf16 optimizer (zero_refused), beside
    a pipeline of `stages` (its record's pipeline_max_zero), or over a shard group of fewer ranks than `dp`
    (shard_group_zero), or in a precision it does not train (fp16-mixed: runtime_fp16.refusal); else None. The single-setup commands refuse it, the whole-job search skips it."""
    # one data-parallel rank: the setup holds ZeRO 0 whatever the config's stage (nothing to shard), so which fp16
    # optimizer runs is not known from it: the stage is given to the fp16 refusal only where it shards
    refused = runtime_fp16.refusal(precision, facts(runtime, version), zero if dp > 1 else None) \
        or zero_refused(runtime, version, precision=precision, zero=zero, dp=dp)
    if refused:
        return refused
    record = facts(runtime, version)
    if record.pipeline_max_zero is not None and stages > 1 and zero > record.pipeline_max_zero:
        return (f"--zero {zero} with {stages} pipeline stages under --runtime {runtime} {record.version}: its pipeline "
                f"runs ZeRO {record.pipeline_max_zero} at most ({record.sources['pipeline_max_zero'].split(' (')[0]}); "
                f"give --zero {record.pipeline_max_zero} or one stage")
    if (record.shard_group_zero is not None and shard_group is not None and shard_group < dp
            and zero not in record.shard_group_zero):
        stages_ok = " or ".join(str(z) for z in record.shard_group_zero)
        where = f"only at ZeRO {stages_ok}" if stages_ok else "at no ZeRO stage"
        return (f"--shard-group {shard_group} at --zero {zero} under --runtime {runtime} {record.version}: it shards "
                f"over a group smaller than the {dp} data-parallel ranks {where}; drop --shard-group")
    return None


def accumulation_refused(runtime: str, version: str | None, *, stages: int, microbatches: int) -> str | None:
    """A sentence where the runtime runs one batch a step without a pipeline and the setup asks for several
    microbatches on one stage (its record's accumulates_without_pipeline); else None."""
    record = facts(runtime, version)
    if record.accumulates_without_pipeline or stages > 1 or microbatches == 1:
        return None
    return (f"--microbatches {microbatches} on one stage under --runtime {runtime} {record.version}: it runs one "
            f"batch a step without a pipeline, no gradient accumulation "
            f"({record.sources['accumulates_without_pipeline']}); give --microbatches 1 or a later --runtime-version")


def tied_refused(runtime: str, version: str | None, *, stages: int, tied: list) -> str | None:
    """A sentence where the model ties parameters (`tied`, the profile's tied sets) and the runtime refuses tying
    beside a pipeline of `stages` > 1 (its record's ties_across_stages); else None."""
    record = facts(runtime, version)
    if record.ties_across_stages or stages == 1 or not tied:
        return None
    # one set a parameter: a block shared whole (a ViT applying it twice) ties every one of its tensors, same layers
    shared = ", ".join(list(dict.fromkeys(" and ".join(item.layers) for item in tied))[:2])
    return (f"the model ties weights ({shared} share a parameter) and --runtime {runtime} {record.version} does not "
            f"tie them beside a pipeline of {stages} stages ({record.sources['ties_across_stages'].split(' (')[0]}); "
            f"give one stage, untie the weights, or another --runtime")


def offload_refused(runtime: str, version: str | None, *, stages: int, offloaded: list[str]) -> str | None:
    """A sentence where a plan offloads layers' activations (`offloaded`: their names) over a pipeline of `stages`
    > 1 (chunks counted) and the runtime runs no offload beside a pipeline (its record's offload_refuses_pipeline);
    else None."""
    record = facts(runtime, version)
    if not record.offload_refuses_pipeline or stages == 1 or not offloaded:
        return None
    return (f"the plan offloads {len(offloaded)} layers' activations to the host ({offloaded[0]} first) over "
            f"{stages} pipeline stages, and --runtime {runtime} {record.version} refuses CPU offloading with pipeline "
            f"parallelism ({record.sources['offload_refuses_pipeline'].split(' (')[0]}); solve it again, or give "
            "one stage")
