"""The decoder blocks of an analytic profile, each distinct block built once.

A block's record depends on its index only through the layer's kind (`arch.layer(i)`: its window,
its rotary), whether its MLP is the experts (`is_moe_layer(i)`) and its name `layers.{i}`, which the
Float8 and Transformer Engine records write into their linears' names (float8.block_record's and
te_fused.te_time's `prefix`). So the first block of each (layer arch, MoE or not) is built and the
others are that block with its name rewritten: a Qwen3-30B-A3B profile builds one of its 48 blocks
(issue 35: ~70 ms each, the whole of a MoE profile's time, and `ckplan search` builds one profile per
configuration). tests/test_analytic_blocks.py holds every block equal to the one block_layer builds
at its own index.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel

from planner.models.archs import Arch
from planner.schema import LayerProfile


def block_name(index: int) -> str:
    return f"layers.{index}"


def blocks(build: Callable[..., LayerProfile], arch: Arch, shape, gpu, mfu: float | None, *,
           compiled: bool) -> list[LayerProfile]:
    """Decoder blocks 0 .. num_layers - 1 as `build` (analytic.block_layer) makes them, each with its
    variant (arch.layer_variant): a block whose (layer arch, MoE) was built before is that one renamed."""
    built: dict[tuple[Arch, bool], tuple[int, LayerProfile, object]] = {}
    out = []
    for i in range(arch.num_layers):
        kind = arch.layer(i)
        key = (kind, kind.is_moe_layer(i))
        if key not in built:
            layer = build(i, kind, shape, gpu, mfu, compiled=compiled)
            built[key] = (i, layer, naming(layer, block_name(i)))
        first, layer, where = built[key]
        out.append(renamed(layer, where, block_name(first), block_name(i)).model_copy(
            update={"variant": arch.layer_variant(i)}))
    return out


def _pattern(name: str) -> re.Pattern:
    """`name` itself or as the head of a dotted module name (`layers.1.attention`, not `layers.10`)."""
    return re.compile(rf"(?<![\w.]){re.escape(name)}(?![\w])")


def naming(value, name: str):
    """Where in `value` a string names `name`: True at such a string, a {field or position: where} map
    down to it, None where nothing under it does (renamed walks only these)."""
    if isinstance(value, str):
        return True if _pattern(name).search(value) else None
    if isinstance(value, BaseModel):
        items = ((field, getattr(value, field)) for field in type(value).model_fields)
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, (dict, set, frozenset)):  # keys or members: walked whole where one names it
        return True if name in repr(value) else None
    else:
        return None
    found = {key: where for key, item in items if (where := naming(item, name)) is not None}
    return found or None


def renamed(value, where, old: str, new: str):
    """`value` with every string that names `old` at `where` (naming's) naming `new` instead; the rest
    shared, not copied."""
    if where is None or old == new:
        return value
    if where is True:
        pattern = _pattern(old)
        return _walk(value, lambda text: pattern.sub(new, text))
    if isinstance(value, BaseModel):
        return value.model_copy(update={field: renamed(getattr(value, field), sub, old, new)
                                         for field, sub in where.items()})
    items = list(value)
    for index, sub in where.items():
        items[index] = renamed(items[index], sub, old, new)
    return type(value)(items)


def _walk(value, rename: Callable[[str], str]):
    if isinstance(value, str):
        return rename(value)
    if isinstance(value, BaseModel):
        return value.model_copy(update={field: _walk(getattr(value, field), rename)
                                        for field in type(value).model_fields})
    if isinstance(value, dict):
        return {_walk(key, rename): _walk(item, rename) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_walk(item, rename) for item in value)
    return value
