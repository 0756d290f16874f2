"""Tensor parallelism's gathered inputs as a runtime saves them: where DTensor's ColwiseParallel (torchtitan)
saves the all-gathered input whole, what an analytic TP + SP profile's sequence shard leaves out, kept by a layer
that keeps its activations and held by a fully recomputed layer's rerun forward (the terms tp_gathered_kept and
tp_gathered_extra, planner/cost/terms.py)."""

from __future__ import annotations

from planner.cost.layers import LayerCost
from planner.cost.rules import profile_tp, runtime_facts
from planner.schema import Profile, TrainSetup

# Inputs a layer's column-parallel linears all-gather under TP with sequence parallelism: a
# block's QKV (or MLA down-projection) input and its MLP input; the LM head's input
# (torchtitan's apply_tp, 9dec370 parallelize_llama.py 117-191).
GATHERED_INPUTS = {"decoder_block": 2, "moe_block": 2, "norm+lm_head": 1}


def tp_gathered_input_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """Where the runtime's record says its column-parallel linears save the all-gathered input
    whole (DTensor's ColwiseParallel, torchtitan), the bytes beyond the 1/TP sequence shard an
    analytic TP + SP profile counts for them: (t - 1) x the layer's (sequence-sharded) input for
    each gathered input. 0 elsewhere (Megatron-LM saves the shard and re-gathers in backward;
    a measured profile ran no TP). Where the runtime gathers a Float8 linear's input in float8
    (record.tp_gathers_float8) and the setup runs Float8, the whole is t x the shard at 1 B: (t/2 - 1)
    x the bf16 shard beyond it."""
    t = profile_tp(profile)
    if t == 1 or profile.assumptions.get("sp") is not True or profile.source != "analytic":
        return 0
    record = runtime_facts(setup)
    if not record.tp_saves_gathered_input:
        return 0
    gathered = t * layer.input_bytes
    if setup.training.float8 and layer.float8_param_count and record.tp_gathers_float8:
        gathered //= 2  # cast to float8 before the all-gather: 1 B an element (record.tp_gathers_float8)
    return GATHERED_INPUTS.get(layer.kind, 0) * max(0, gathered - layer.input_bytes)


def tp_gathered_kept_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """tp_gathered_input_bytes kept to the backward by a layer that keeps its activations (none)."""
    return tp_gathered_input_bytes(layer, profile, setup) if option == 0 else 0


def tp_gathered_extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """tp_gathered_input_bytes held at once by a fully recomputed layer's rerun forward."""
    return tp_gathered_input_bytes(layer, profile, setup) if option == 1 else 0
