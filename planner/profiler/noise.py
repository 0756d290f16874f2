"""Is a profile's timing trustworthy? On a busy machine it is not, and the solver
would then plan around noise: say so instead of failing quietly."""

from __future__ import annotations

from planner.schema import LayerProfile, Profile

SPREAD = 1.5  # the profile's own noise bound: a layer's slowest repeat over its fastest
FLOOR_MS = 1.0  # layers under this are left out: their jitter costs nothing


def spread_layers(layers: list[LayerProfile], *, spread: float = SPREAD, floor_ms: float = FLOOR_MS) -> list[int]:
    """Indices of the layers whose repeats differ by more than `spread` (over `floor_ms`)."""
    return [i for i, layer in enumerate(layers) if layer.fwd_ms + layer.bwd_ms >= floor_ms
            and layer.fwd_ms_max + layer.bwd_ms_max > spread * (layer.fwd_ms_min + layer.bwd_ms_min)]


def noisy_timings(profile: Profile, *, spread: float = SPREAD, floor_ms: float = FLOOR_MS) -> str:
    """Why the times look unreliable, or "" when they do not: one layer whose repeats
    differ by more than `spread`, or layers of one kind (the same computation) whose
    medians do. Layers under `floor_ms` are left out: their jitter costs nothing."""
    by_kind: dict[tuple[str, str | None], list[float]] = {}  # a kind's variants (a global layer) apart
    for layer in profile.layers:
        median_ms = layer.fwd_ms + layer.bwd_ms
        if median_ms < floor_ms:
            continue
        fastest_ms, slowest_ms = layer.fwd_ms_min + layer.bwd_ms_min, layer.fwd_ms_max + layer.bwd_ms_max
        if slowest_ms > spread * fastest_ms:
            return f"the repeats of layer {layer.name} take from {fastest_ms:.3g} to {slowest_ms:.3g} ms"
        by_kind.setdefault((layer.kind, layer.variant), []).append(median_ms)
    for (kind, _), medians in by_kind.items():
        if max(medians) > spread * min(medians):
            return f"identical {kind} layers take from {min(medians):.3g} to {max(medians):.3g} ms"
    return ""
