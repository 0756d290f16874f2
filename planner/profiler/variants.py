"""Each decoder block's variant (Arch.layer_variant: its window, its rotary, where a model's layers differ) on a
profile that ran the model's own code (--hf-config, fake or measured), whose wrapper names decoder layer i
`layers.{i}` (planner/models/hfmodels.py) as the analytic profile does: the cost model then normalises its layers
within kind and variant (planner/cost/layers.py), so Gemma 3's global layers are not its sliding ones' mean."""

from __future__ import annotations

import re

from planner.models.archs import Arch
from planner.schema import LayerProfile

_BLOCK = re.compile(r"layers\.(\d+)")


def with_variants(layers: list[LayerProfile], arch: Arch) -> list[LayerProfile]:
    """The layers with each decoder block's variant recorded; the same layers where every block is alike."""
    found = []
    for layer in layers:
        match = _BLOCK.fullmatch(layer.name)
        index = int(match.group(1)) if match else None
        variant = arch.layer_variant(index) if index is not None and index < arch.num_layers else None
        found.append(layer if variant is None else layer.model_copy(update={"variant": variant}))
    return found
