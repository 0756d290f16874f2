"""A plan's offloaded layers as Megatron-LM writes them: Transformer Engine's window,
`--cpu-offloading --cpu-offloading-num-layers N` (the first N decoder layers' saved activations on the host),
where the plan is that window as megatron-core runs it (planner/cost/te_offload.plan_window: one stage of one
chunk, the decoder layers' first N offloaded, nothing recomputed beside them; TransformerConfig refuses the rest,
docs/framework-facts.md §321). Any other offloaded layer is rounded to whole-layer recompute
(rounding.offloaded_as_full), and the export says so."""

from __future__ import annotations

from collections.abc import Callable

from planner.cost import costmodel, te_offload
from planner.emit import rounding
from planner.schema import Plan, Profile, StagePlan, TrainSetup


def count(plan: Plan, profile: Profile) -> int | None:
    """N where the plan's offloaded layers are TE's window over the model's decoder layers under Megatron-LM's
    runtime; None where they are not (or it offloads nothing)."""
    return count_of(plan.stages, plan.setup, profile)


def count_of(ranks: list[StagePlan], setup: TrainSetup, profile: Profile) -> int | None:
    """count, of a plan's ranks under its setup."""
    roles = rounding.llm_roles(profile)
    if roles is None:
        return None
    stages = costmodel.pipeline_stages(ranks, setup)
    setup = setup.model_copy(update={"training": setup.training.model_copy(update=rounding.as_runtime("megatron"))})
    names = [name for stage in stages for name in stage.layers]
    options = [stage.option(name) for stage in stages for name in stage.layers]
    kind = {layer.name: layer.kind for layer in profile.layers}
    found = te_offload.plan_window([kind[name] for name in names], options, setup)
    if found is None:
        return None
    block, num = found
    return num if [names[i] for i in block] == roles.decoder else None


def arguments(rounded: rounding.Rounded, profile: Profile, arg: Callable[..., str]) -> list[str]:
    """The window's flags where the rounded plan is one (count), else none; `arg` writes a flag and its values as
    quoted bash words (megatron.arg)."""
    num = count_of(rounded.ranks(), rounded.setup, profile)
    if num is None:
        return []
    return [f"# Transformer Engine's activation offload: the first {num} decoder layers' saved tensors on the host",
            arg("--cpu-offloading"), arg("--cpu-offloading-num-layers", num)]
