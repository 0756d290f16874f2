"""A profile's layers timed as the runtime's own fused kernels run them (RuntimeFacts.fused_kernels).

Under Megatron-LM (Transformer Engine's layers) a dense block's norms, rotary and activation run as
fused kernels, not as the model code's eager ops the profile's passes time: an analytic profile
records the block's passes on those kernels (LayerProfile.te_time, planner/profiler/te_fused.py).
`fused_profile` puts them in place of the layer's forward, backward and reruns (the full one and each
selective option's, a combination the sum of its parts': te_rerun.py), and the record's
Float8 times (TE's fused linears: one input cast each; a selective combination holding a part the Float8
record reruns in FP8 summed from its parts, float8_options) in place of the layer's; where the record has
none, the layer's Float8 record moves by the same differences (its times are the eager passes' with the
linears in FP8, and Float8 changes no norm or activation). A layer without a record keeps its times (measured profiles,
fake profiles of a model file or of a config the architecture reader does not read, MoE blocks, profiles
made before): `untimed_layers` names them for the command to say. Every layer's backward is under Megatron's
gradient-accumulation fusion, record or not: an analytic layer without one (the head, eh_proj's MTP layer, a
block whose fused kernels were not read) loses the eager accumulation its profile timed (wgrad_accumulate_ms).
"""

from __future__ import annotations

from collections import Counter

from planner.schema import OPTION_FULL, LayerProfile, Profile

BLOCK_KINDS = ("decoder_block", "moe_block")


def fused_profile(profile: Profile, fused_kernels: str | None, *, unfused_accumulation: bool = False,
                  router_scores: str = "logits") -> Profile:
    """The profile with each layer that recorded `te_time` timed by it where the runtime's layers run
    Transformer Engine's kernels (`fused_kernels` == "transformer-engine"); else the profile itself. The
    record's backward is under Megatron's gradient-accumulation fusion; `unfused_accumulation`
    (--no-gradient-accumulation-fusion) adds back the eager accumulation pass (FusedKernelTime.accumulate_ms).
    A layer without a record runs its linears' wgrad under the same fusion (Megatron-core's output layer and
    eh_proj: ColumnParallelLinear with gradient_accumulation_fusion; the blocks' TE linears): its backward loses
    the eager pass the profile timed (LayerProfile.wgrad_accumulate_ms) unless `unfused_accumulation`. A MoE
    block's record is TE v2.9's router dtypes; where the runtime's TE writes its router intermediates in fp32
    (`router_scores`, RuntimeFacts.te_router_scores: "fp32" from TE v2.13) what they add is charged (scores_at)."""
    if fused_kernels != "transformer-engine":
        return profile
    layers = [_timed(scores_at(layer, router_scores), unfused_accumulation) if layer.te_time is not None
              else layer if unfused_accumulation else _fused_accumulation(layer) for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def scores_at(layer: LayerProfile, router_scores: str) -> LayerProfile:
    """`layer` with its TE record's passes (and its Float8 record's) at the router dtypes `router_scores` says: as it
    is at "logits" (TE v2.9-v2.12, the record's own); at "fp32" the forward, the full and `mlp` reruns (the MoE
    layer's checkpoint reruns the router: te_rerun.py) and the backward take what the fp32 intermediates add
    (FusedKernelTime.fp32_scores_fwd_ms / _bwd_ms; framework-facts §543, §588)."""
    timed = layer.te_time
    fwd, bwd = timed.fp32_scores_fwd_ms, timed.fp32_scores_bwd_ms
    if router_scores != "fp32" or not (fwd or bwd):
        return layer

    def moved(passes):
        reruns = {name: ms + fwd if name in (OPTION_FULL, "mlp") else ms for name, ms in passes.recompute_ms.items()}
        return passes.model_copy(update={"fwd_ms": passes.fwd_ms + fwd, "bwd_ms": passes.bwd_ms + bwd,
                                         "recompute_ms": reruns})

    fp8 = None if timed.float8 is None else moved(timed.float8)
    if fp8 is not None and fp8.delayed is not None:
        fp8 = fp8.model_copy(update={"delayed": moved(fp8.delayed)})
    timed = moved(timed).model_copy(update={"float8": fp8, "fp32_scores_fwd_ms": 0.0, "fp32_scores_bwd_ms": 0.0})
    return layer.model_copy(update={"te_time": timed})


def _fused_accumulation(layer: LayerProfile) -> LayerProfile:
    """`layer`'s backward (and its Float8 record's) without the eager weight-gradient accumulation its profile
    timed (wgrad_accumulate_ms), which the fused wgrad GEMM does in its epilogue."""
    gone = layer.wgrad_accumulate_ms
    if not gone:
        return layer
    bwd = max(0.0, layer.bwd_ms - gone)
    fp8 = None if layer.float8 is None else layer.float8.model_copy(
        update={"bwd_ms": max(0.0, layer.float8.bwd_ms - gone)})
    return layer.model_copy(update={"bwd_ms": bwd, "bwd_ms_min": max(0.0, layer.bwd_ms_min - gone),
                                    "bwd_ms_max": max(0.0, layer.bwd_ms_max - gone), "float8": fp8,
                                    "wgrad_accumulate_ms": 0.0})


def blocks(profile: Profile) -> list[LayerProfile]:
    """The profile's blocks: an analytic profile's block kinds; in a fake or measured profile, whose
    kinds are the model's class names, the layers that hold a record or whose kind repeats (the
    model's block class; its embedding and head are one each)."""
    counts = Counter(layer.kind for layer in profile.layers)
    return [layer for layer in profile.layers
            if layer.kind in BLOCK_KINDS or layer.te_time is not None or counts[layer.kind] > 1]


def untimed_layers(profile: Profile) -> list[str]:
    """The blocks with no record of their passes on Transformer Engine's kernels."""
    return [layer.name for layer in blocks(profile) if layer.te_time is None]


def rerun_on_te(name: str, reruns: dict[str, float]) -> float | None:
    """An option's rerun on TE's kernels from the record's (`reruns`: the full rerun and each selective part's,
    te_rerun.part_reruns): the full one by name, a selective combination the sum of its parts' (as
    analytic_kept.selective_options sums the eager ones); None where a part has none (offload, op-level AC,
    whole-attention `attn`, a record made before)."""
    if name == OPTION_FULL:
        return reruns.get(OPTION_FULL)
    parts = name.split(",")
    if OPTION_FULL in parts or not all(part in reruns for part in parts):
        return None
    return sum(reruns[part] for part in parts)


def float8_options(fp8, reruns: dict[str, float], names: list[str]):
    """The TE record's Float8 record (`fp8`) with each selective combination among `names` that holds a part the
    Float8 record reruns in FP8 (te_rerun.float8_parts: `mlp`, a MoE block's `mlp-act`): its rerun the sum of its
    parts', the FP8 ones' from `fp8` and the rest's from `reruns` (the bf16 record's: no FP8 linear), and its weights'
    casts the FP8 parts'. As it is where no name combines such a part."""
    combined, casts = {}, {}
    for name in names:
        parts = name.split(",")
        if name in fp8.recompute_ms or not any(part in fp8.recompute_ms for part in parts):
            continue
        rerun = rerun_on_te(name, {**reruns, **fp8.recompute_ms})
        if rerun is not None:
            combined[name] = rerun
            casts[name] = sum(fp8.rerun_weight_cast_ms.get(part, 0.0) for part in parts)
    if not combined:
        return fp8
    return fp8.model_copy(update={"recompute_ms": {**fp8.recompute_ms, **combined},
                                  "rerun_weight_cast_ms": {**fp8.rerun_weight_cast_ms, **casts}})


def _timed(layer: LayerProfile, unfused_accumulation: bool = False) -> LayerProfile:
    timed = layer.te_time
    if unfused_accumulation and timed.accumulate_ms:  # the eager pass the fused wgrad GEMM does not run
        timed = timed.model_copy(update={"bwd_ms": timed.bwd_ms + timed.accumulate_ms, "float8": None if timed.float8
                                         is None else timed.float8.model_copy(update={
                                             "bwd_ms": timed.float8.bwd_ms + timed.accumulate_ms})})
    full = timed.recompute_ms.get(OPTION_FULL)
    saved_fwd, saved_bwd = layer.fwd_ms - timed.fwd_ms, layer.bwd_ms - timed.bwd_ms
    saved_rerun = (layer.recompute_ms - full) if full is not None and layer.recompute_ms is not None else 0.0
    options, saved_by_option = [], {}  # each option's rerun on TE's kernels; how much less than its eager one
    for option in layer.recompute_options:
        rerun = rerun_on_te(option.name, timed.recompute_ms)
        if rerun is None or option.name == OPTION_FULL and full is None:
            options.append(option)
            continue
        saved_by_option[option.name] = option.recompute_ms - rerun
        options.append(option.model_copy(update={"recompute_ms": rerun}))
    update = {"fwd_ms": timed.fwd_ms, "bwd_ms": timed.bwd_ms, "fwd_ms_min": timed.fwd_ms, "fwd_ms_max": timed.fwd_ms,
              "bwd_ms_min": timed.bwd_ms, "bwd_ms_max": timed.bwd_ms, "recompute_options": options, "te_time": None,
              "wgrad_accumulate_ms": timed.accumulate_ms if unfused_accumulation else 0.0}
    if full is not None:
        update["recompute_ms"] = full
    if layer.float8 is not None and timed.float8 is not None:  # the record's own, on TE's fused linears
        update["float8"] = float8_options(timed.float8, timed.recompute_ms, [option.name for option in options])
    elif layer.float8 is not None:
        fp8 = layer.float8
        saved_by_option[OPTION_FULL] = saved_rerun
        reruns = {name: max(0.0, ms - saved_by_option.get(name, 0.0)) for name, ms in fp8.recompute_ms.items()}
        update["float8"] = fp8.model_copy(update={"fwd_ms": max(0.0, fp8.fwd_ms - saved_fwd),
                                                  "bwd_ms": max(0.0, fp8.bwd_ms - saved_bwd),
                                                  "recompute_ms": reruns})
    return layer.model_copy(update=update)
