"""Everything that can be wrong with a plan, found before any process starts.

A plan that is stale (its model file changed), for another model (layer names not
found), malformed (stages not contiguous, a layer twice or never) or asking a layer for a
recompute option it does not have is refused with a sentence that says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from planner.cost import costmodel
from planner.errors import UserError
from planner.io import sha256_file
from planner.models.modelfile import Layers, ModelFile, load_model_file, pipeline_layers
from planner.runtime.recompute import option_error
from planner.runtime.stagemodule import stage_options, torch_dtype
from planner.schema import OPTION_OFFLOAD, Plan, StagePlan


@dataclass
class Strategy:
    """What one run executes: ckplan's stages or a baseline's, and their prediction."""

    name: str
    stages: list[StagePlan]
    predicted_iteration_ms: float


def resolve_model_file(plan: Plan, plan_file: str | Path | None) -> Path:
    """plan.model.file: absolute as is; relative against the current directory, then
    against the plan file's directory."""
    file = Path(plan.model.file)
    candidates = [file] if file.is_absolute() else [Path.cwd() / file]
    if not file.is_absolute() and plan_file is not None:
        candidates.append(Path(plan_file).resolve().parent / file)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = " or ".join(dict.fromkeys(str(c) for c in candidates))
    raise UserError(f"the plan's model file {plan.model.file} was not found (looked for {tried}); "
                    "run from the directory the plan was made in, or fix model.file in the plan")


def check_model_hash(plan: Plan, model_path: Path, *, force: bool) -> None:
    actual = sha256_file(model_path)
    if actual == plan.model.sha256 or force:
        return
    raise UserError(
        f"the plan is stale: model file {model_path} has sha256 {actual}, the plan was made for "
        f"sha256 {plan.model.sha256}; re-run `ckplan profile` and `ckplan solve`, or pass --force "
        "to run it anyway"
    )


def select_strategy(plan: Plan, name: str) -> Strategy:
    """'ckplan' is the plan's own stages; any other name is one of plan.baselines."""
    if name == "ckplan":
        return Strategy(name, plan.stages, plan.predicted.iteration_ms)
    for baseline in plan.baselines:
        if baseline.name == name:
            if not baseline.stages:
                raise UserError(f"baseline {name!r} in the plan carries no stages to run; "
                                "re-create the plan with `ckplan solve`")
            return Strategy(name, baseline.stages, baseline.iteration_ms)
    known = ", ".join(["ckplan"] + [b.name for b in plan.baselines])
    raise UserError(f"the plan has no strategy {name!r}; it has: {known}")


def check_stage_layout(stages: list[StagePlan], layer_names: list[str], *, what: str, model_path: Path) -> None:
    """Every pipeline layer exactly once, stages contiguous and in model order."""
    position = {name: idx for idx, name in enumerate(layer_names)}
    unknown = [name for stage in stages for name in stage.layers if name not in position]
    if unknown:
        raise UserError(
            f"{what} name layers {unknown[:3]} that are not pipeline layers of {model_path} "
            f"(its layers are {layer_names[0]} ... {layer_names[-1]}); the plan is for a different "
            "model: re-create it with `ckplan solve`"
        )
    seen: dict[str, int] = {}
    for stage in stages:
        for name in stage.layers:
            if name in seen:
                raise UserError(f"{what}: layer {name!r} is in stage {seen[name]} and stage {stage.index}; "
                                "each layer must be in exactly one stage")
            seen[name] = stage.index
    missing = [name for name in layer_names if name not in seen]
    if missing:
        raise UserError(f"{what}: layers {missing[:3]} are in no stage; every pipeline layer must be in one")
    flat = [name for stage in stages for name in stage.layers]
    if flat != layer_names:
        first = next(idx for idx, (got, want) in enumerate(zip(flat, layer_names, strict=False)) if got != want)
        raise UserError(
            f"{what}: stages must hold contiguous runs of layers in model order; stage "
            f"{seen[flat[first]]} has {flat[first]!r} where {layer_names[first]!r} belongs"
        )


def check_chunks(plan: Plan, ranks: list[StagePlan]) -> None:
    """Every rank holds the chunks its schedule gives it."""
    setup = plan.setup.pipeline
    bad = [rank.index for rank in ranks if setup.chunks > 1 and len(rank.chunks) != setup.chunks]
    if bad:
        raise UserError(f"rank {bad[0]} of the plan holds {len(ranks[bad[0]].chunks) or 1} chunks where "
                        f"{setup.schedule} gives every rank {setup.chunks}; re-create the plan with `ckplan solve`")


def check_stage_options(stages: list[StagePlan], layers: Layers, *, what: str) -> None:
    """Every layer's recompute option is one it has (planner/recompute.find_options)."""
    by_name = dict(layers)
    for stage in stages:
        for name, option in stage_options(stage).items():
            problem = option_error(name, by_name[name], option)
            if problem is not None:
                raise UserError(f"{what}: stage {stage.index}'s {problem}; re-create the plan with `ckplan solve` "
                                "from a profile of this model")


def check_setup(plan: Plan, strategy: Strategy) -> None:
    setup = plan.setup
    offloaded = [name for stage in strategy.stages for name in stage.layers if stage.option(name) == OPTION_OFFLOAD]
    if setup.pipeline.chunks > 1 and offloaded:
        raise UserError(f"{strategy.name}'s layer {offloaded[0]} offloads its activations, which ckplan's runtime "
                        f"does under 1F1B and GPipe only, not {setup.pipeline.schedule} with {setup.pipeline.chunks} "
                        "chunks per rank; re-solve the plan (a chunked solve offloads nothing)")
    if setup.pipeline.schedule == "1F1B" and setup.pipeline.microbatches < setup.pipeline.stages:
        raise UserError(f"1F1B needs at least as many microbatches as stages; the plan has "
                        f"{setup.pipeline.microbatches} microbatches for {setup.pipeline.stages} stages")
    if len(strategy.stages) != setup.pipeline.stages:
        raise UserError(f"{strategy.name} has {len(strategy.stages)} stages but setup.pipeline.stages is {setup.pipeline.stages}")


@dataclass
class Prepared:
    model_file: ModelFile
    model_path: Path
    strategy: Strategy


def check_runnable(plan: Plan) -> None:
    """Refuse a plan this runtime cannot run as planned: one of a model it does not build, or
    one whose predictions are another runtime's."""
    if plan.profile_source == "analytic":
        raise UserError("this plan comes from an analytic profile (`ckplan profile --arch`) of a model this "
                        "runtime does not build; export it to your framework with `ckplan export` instead")
    if plan.profile_source == "fake":
        raise UserError("this plan comes from a --fake profile, whose times are rooflines for a GPU, not this "
                        "machine's; export it with `ckplan export`, or profile the model without --fake to launch it")
    if plan.setup.training.runtime != "ckplan":
        raise UserError(f"this plan is scored for {plan.setup.training.runtime}'s runtime, whose pipeline and "
                        "checkpointing differ from ckplan's; export it with `ckplan export`, or solve with "
                        "--runtime ckplan to run it here")
    training = plan.setup.training
    if training.compile or training.compile_loss:
        raise UserError("this plan is scored with torch.compile (--compile), and ckplan's runtime runs each stage's "
                        "layers eager (planner/runtime calls no torch.compile), so its memory and time would not be "
                        "the plan's; solve without --compile to launch it")
    if plan.setup.pipeline.chunks > 1 and plan.setup.data_parallel.zero >= 2 and plan.setup.data_parallel.dp > 1:
        raise UserError(f"this plan runs {plan.setup.pipeline.schedule} with {plan.setup.pipeline.chunks} chunks per "
                        f"rank under ZeRO {plan.setup.data_parallel.zero}, and ckplan's runtime shards chunked "
                        "stages only with ZeRO 0 or 1; solve with --zero 1, or with --schedule 1F1B, to launch it")


def prepare(plan: Plan, *, plan_file: str | Path | None, strategy: str = "ckplan", force: bool = False) -> Prepared:
    """All checks that need no process group: model file found, unchanged and matching
    the plan's layer names; the strategy's stages a valid cut of the model."""
    check_runnable(plan)
    model_path = resolve_model_file(plan, plan_file)
    check_model_hash(plan, model_path, force=force)
    chosen = select_strategy(plan, strategy)
    check_setup(plan, chosen)
    torch_dtype(plan.dtype)  # a dtype torch does not know is refused here, not on every rank
    model_file = load_model_file(model_path)
    layers = pipeline_layers(_build_for_names(model_file), model_path)
    check_chunks(plan, chosen.stages)
    check_stage_layout(costmodel.pipeline_stages(chosen.stages, plan.setup), [name for name, _ in layers],
                       what=f"{chosen.name}'s stages", model_path=model_path)
    check_stage_options(chosen.stages, layers, what=f"{chosen.name}'s stages")
    return Prepared(model_file, model_path, chosen)


def _build_for_names(model_file: ModelFile) -> torch.nn.Module:
    """The model for its layer names only: on the meta device, so checking a plan for a
    model larger than this machine's memory costs none; a model file whose
    build_model() cannot run on meta is built normally."""
    try:
        with torch.device("meta"):
            return model_file.build_model()
    except UserError:
        return model_file.build_model()


def zero_one_partition(numels: list[int], ranks: int) -> list[int]:
    """Parameters per rank as ZeroRedundancyOptimizer partitions whole tensors: largest
    first, each to the rank with the fewest so far."""
    from planner.cost.zeroone import greedy_loads

    return [sum(held) for held in greedy_loads(numels, ranks)]


def zero_one_imbalance(plan: Plan, plan_file: str | Path | None) -> list[str]:
    """ZeRO 1 runs on ZeroRedundancyOptimizer, which gives each rank of a shard group whole
    tensors. The cost model charges its exact partition where the profile records each trained
    tensor's size (zeroone.py); a profile from before charges only the largest tensor whole
    (several large tensors can hold more), or none where it records no largest. A sentence
    per stage whose fullest rank will hold more static memory than the plan predicted, from
    the model's tensor sizes (built on meta)."""
    from planner.cost.dataparallel import (
        bytes_per_param,
        shard_size,
        whole_tensor_optim_bytes,
        zero_one_excess_bytes,
    )
    from planner.units import format_bytes

    setup = plan.setup
    ranks, optim = shard_size(setup), whole_tensor_optim_bytes(setup)
    if not optim:
        return []
    model_path = resolve_model_file(plan, plan_file)
    layers = dict(pipeline_layers(_build_for_names(load_model_file(model_path)), model_path))
    notes = []
    for stage in plan.stages:
        params = {id(p): p for name in stage.layers for p in layers[name].parameters() if p.requires_grad}
        numels = [p.numel() for p in params.values()]
        # the cost model's static, with the exact partition's fullest rank where it charges the largest tensor
        fullest = sum(numels) * bytes_per_param(setup) + zero_one_excess_bytes(
            sum(numels), max(zero_one_partition(numels, ranks)), setup)
        over = fullest - stage.predicted.static_bytes
        if over > 0.01 * stage.predicted.static_bytes:
            notes.append(f"stage {stage.index}: ZeroRedundancyOptimizer (ZeRO 1) gives each rank whole tensors "
                         f"(the largest has {max(numels):,} parameters), so one rank in each shard group holds "
                         f"{format_bytes(fullest)} of weights, gradients and optimizer state, {format_bytes(over)} "
                         "more than the plan's static prediction; expect its peak that much over too (ZeRO 2, or "
                         "a smaller --shard-group, shards evenly; a profile made before ckplan recorded tensor "
                         "sizes charges none of this: re-run `ckplan profile`)")
    return notes


def unsupported_setup(plan: Plan) -> list[str]:
    """Parts of the plan's setup this runtime does not reproduce: the run still happens,
    but its measurements do not include them."""
    setup = plan.setup
    notes = []
    runs_as = {"float32": "fp32", "bfloat16": "bf16"}.get(plan.dtype.removeprefix("torch."))
    if setup.training.precision != runs_as:
        notes.append(f"precision {setup.training.precision} is not emulated: every stage runs in {plan.dtype} "
                     "with optimizer state in that dtype")
    return notes
