"""Option names that changed meaning, read from the files written before (planner/io.py calls these on a
file's data before validating it).

Until profile schema version 2 and plan schema version 3, an analytic profile's `attn` was the attention
core alone (Megatron-LM's --recompute-modules core_attn: Q, K and V kept), while a fake or measured
profile's `attn` checkpointed the whole attention module (planner/runtime/recompute.py). The core is now
`core-attn` in every file, and `attn` is the whole module everywhere (docs/framework-facts.md §82). So an
older analytic profile, or a plan made from one, is read with its `attn` as `core-attn`; older fake and
measured files keep their `attn`, which always was the whole module.
"""

from __future__ import annotations

CORE_ATTN = "core-attn"
OLD_CORE_ATTN = "attn"  # an analytic profile's name for the core before PROFILE_SCHEMA_VERSION 2
# a layer's fields keyed by option name (planner/schema/profile.py LayerProfile and the records inside it)
_KEYED = ("alloc_records", "compiled_kept_bytes", "recompute_ms", "rerun_weight_cast_ms")
_RECORDS = ("compiled_time", "te_time", "float8")  # a layer's records that hold such fields


def core_attention_named(option: str) -> str:
    """An option name (parts joined by commas) as an older analytic file wrote it, in today's names."""
    return ",".join(CORE_ATTN if part == OLD_CORE_ATTN else part for part in option.split(","))


def _renamed_keys(record: dict) -> dict:
    """A layer (or a record in it) with its option-keyed fields' keys in today's names."""
    out = dict(record)
    for key in _KEYED:
        if isinstance(out.get(key), dict):
            out[key] = {core_attention_named(name) if isinstance(name, str) else name: value
                        for name, value in out[key].items()}
    for key in _RECORDS:
        if isinstance(out.get(key), dict):
            out[key] = _renamed_keys(out[key])
    return out


def _renamed_layer(layer):
    if not isinstance(layer, dict):
        return layer  # validation says what is wrong with it
    out = _renamed_keys(layer)
    if isinstance(out.get("recompute_options"), list):
        out["recompute_options"] = [
            {**option, "name": core_attention_named(option["name"])}
            if isinstance(option, dict) and isinstance(option.get("name"), str) else option
            for option in out["recompute_options"]]
    return out


def profile_in_current_names(data: dict, version: int | None, current: int) -> dict:
    """An analytic profile of a version before `current` with its core attention named `core-attn`."""
    if version is None or version >= current or data.get("source") != "analytic":
        return data
    layers = data.get("layers")
    return {**data, "layers": [_renamed_layer(layer) for layer in layers] if isinstance(layers, list) else layers}


def _renamed_stage(stage):
    if not isinstance(stage, dict) or not isinstance(stage.get("recompute"), dict):
        return stage
    return {**stage, "recompute": {layer: core_attention_named(option) if isinstance(option, str) else option
                                   for layer, option in stage["recompute"].items()}}


def plan_in_current_names(data: dict, version: int | None, renamed_from: int) -> dict:
    """A plan of a version before `renamed_from` made from an analytic profile, its layers' (and its
    baselines' layers') core attention named `core-attn`."""
    if version is None or version >= renamed_from or data.get("profile_source") != "analytic":
        return data
    out = dict(data)
    if isinstance(out.get("stages"), list):
        out["stages"] = [_renamed_stage(stage) for stage in out["stages"]]
    if isinstance(out.get("baselines"), list):
        out["baselines"] = [{**base, "stages": [_renamed_stage(stage) for stage in base["stages"]]}
                            if isinstance(base, dict) and isinstance(base.get("stages"), list) else base
                            for base in out["baselines"]]
    return out
