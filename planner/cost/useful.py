"""The options a plan may choose for a layer (useful_options): the undominated ones among those the setup
allows, read by the solvers through costmodel."""

from __future__ import annotations

from planner.cost import megatron_fsdp_moments, splittime, te_offload
from planner.cost.gathered import fsdp_unit_layer_bytes
from planner.cost.layers import LayerCost
from planner.cost.terms import Context, layer_value
from planner.schema import (
    CHUNKED_SCHEDULES,
    OPTION_OFFLOAD,
    SPLIT_BACKWARD_SCHEDULES,
    Profile,
    TrainSetup,
    runs_split_backward,
)


def useful_options(layer: LayerCost, ctx: Context) -> list[int]:
    """The options past none a plan may choose for this layer: each keeps fewer bytes than
    none, and no other keeps no more, adds no more time and no more extra peak while better in
    one (a dominated option never lowers a peak or a time; host bytes count as one more
    resource, and so does a split backward's time past the first stage). Whole-layer plans (the setup's recompute): full alone. A chunked schedule's
    stages take no option that offloads (their host bytes per rank are not modelled yet), nor does a stage whose
    offload is Transformer Engine's window (te_offload.window_runs: a choice of the stage, not of a layer; the
    solvers choose it whole, planner/solve/dpwindow.py), nor one of a pipeline the runtime runs no offload beside
    (te_offload.pipeline_refuses)."""
    whole_layer = ctx.setup.training.recompute == "whole-layer"
    candidates = [1] if whole_layer else range(1, len(layer.options))
    # torchtitan's op-level policy (profiler/opsac.py): among the options where the setup asks for
    # it and the layer offers it, never otherwise (no other framework's export can say it)
    op_sac = [o for o in range(len(layer.options)) if layer.options[o].name == "op-sac"]
    candidates = [o for o in candidates if o not in op_sac]
    if ctx.setup.training.op_level_sac:
        candidates += op_sac
    if ctx.setup.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES:
        candidates = [o for o in candidates if runs_split_backward(layer.options[o].name)]
    if ctx.setup.pipeline.schedule in CHUNKED_SCHEDULES:
        candidates = [o for o in candidates if not layer.options[o].host_bytes]
    # where the runtime offloads as Transformer Engine's window (te_offload.window_runs), evaluate charges the
    # stage's offloaded layers together (the block's first N), which no per-layer row of the solvers sums to
    # and where the runtime refuses offload beside this pipeline (te_offload.pipeline_refuses), none is offered
    if te_offload.window_runs(ctx.setup) or te_offload.pipeline_refuses(ctx.setup):
        candidates = [o for o in candidates if layer.options[o].name != OPTION_OFFLOAD]
    # under a split backward an option's time on a stage past the first has its passes' extra
    # (splittime.layer_extra_ms) and on the first not: both, so no option is dropped on either
    split = ctx.setup.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES
    held = megatron_fsdp_moments.held_layers(ctx)
    rows = {o: (layer_value("kept", layer, o, ctx), layer_value("time", layer, o, ctx),
                _extra(layer, o, ctx, held), layer_value("offloaded", layer, o, ctx),
                layer_value("time", layer, o, ctx) + (splittime.layer_extra_ms(layer, o, ctx.setup) if split else 0.0))
            for o in range(len(layer.options))}
    found = []
    for o in candidates:
        if rows[o][0] >= rows[0][0]:
            continue
        if any(p != o and all(a <= b for a, b in zip(rows[p], rows[o])) and rows[p] != rows[o]
               for p in candidates):
            continue
        found.append(o)
    return found


def _extra(layer: LayerCost, option: int, ctx: Context, held: dict) -> float:
    """The option's extra peak as the solvers place it: with a unit's Megatron-FSDP moments
    (megatron_fsdp_moments.unit_extra; `held`: held_layers, {} where they do not apply)."""
    extra = layer_value("extra", layer, option, ctx)
    if not held:
        return extra
    return megatron_fsdp_moments.unit_extra(layer, option, extra, layer_value("kept", layer, option, ctx), held, ctx)


def least_kept_bytes(layer: LayerCost, ctx: Context) -> float:
    """The least a plan of the setup keeps of this layer, whatever it chooses: its options' least, and 0 where
    Transformer Engine's window may offload it (te_offload.window_runs and the layer offers the offload option:
    the window keeps nothing of the block's first N, te_offload.window_per_layer). The bounds read it."""
    least = min(layer_value("kept", layer, o, ctx) for o in range(len(layer.options)))
    if te_offload.window_runs(ctx.setup) and any(option.name == OPTION_OFFLOAD for option in layer.options):
        return min(least, 0.0)
    return least


def unit_layer_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """gathered.fsdp_unit_layer_bytes with the layer's kept bytes under `option` (layer_value's "kept")."""
    ctx = Context(profile, setup)
    return fsdp_unit_layer_bytes(layer, option, profile, setup, lambda: layer_value("kept", layer, option, ctx))
