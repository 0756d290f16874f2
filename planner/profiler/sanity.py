"""Measurements a busy machine gets wrong, found before they reach a profile.

Two shapes of nonsense came out of profiles taken under load: a recompute of 0 ms
for a layer that saves tensors past its own input (checkpointing it must re-run at
least part of its forward), and one layer's optimizer step a hundred times slower
than the same step on the other layers of its kind. Milder disagreements — layers of
one kind whose times differ by more than `SPREAD` — are worth re-measuring too. The
profiler re-measures every suspect. A recompute still lost in the noise is charged a
whole forward (an upper bound), a step that stays absurd its kind's median (the same
work on identical layers), each said aloud: no profile carries the nonsense.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from planner.profiler import noise
from planner.schema import LayerProfile

SPREAD = 1.5  # same-kind layers whose times differ by more than this are re-measured
STEP_ABSURD = 100.0  # an optimizer step this many times its kind's median is nonsense
STEP_SUSPECT = 5.0  # ... and one this many times it is re-measured
FLOOR_MS = 0.5  # below this, jitter is the measurement; nothing is judged
RECOMPUTE_SPREAD = 3.0  # a recompute (a difference of two medians) this far from its kind's is replaced
MIN_KIND = 3  # a kind of fewer layers has no median that outvotes one of them


def suspects(layers: list[LayerProfile]) -> set[int]:
    """Indices of layers whose times look wrong: worth measuring again."""
    found = set(zero_recompute(layers))
    found |= {i for i, _ in step_outliers(layers, STEP_SUSPECT)}
    for same in _by_kind(layers).values():
        typical = median(_compute_ms(layers[i]) for i in same)
        if typical < FLOOR_MS:
            continue
        found |= {i for i in same if not typical / SPREAD <= _compute_ms(layers[i]) <= typical * SPREAD}
    return found | set(robust_figures(layers)) | set(noise.spread_layers(layers))


def nonsense(layers: list[LayerProfile]) -> str:
    """What no profile may say, as a phrase; "" when there is none."""
    for layer in layers:
        if _zero_recompute(layer):
            return (f"layer {layer.name} saves tensors for backward but measured no recompute time "
                    f"(forward {layer.fwd_ms:.3g} ms)")
    for i, (optimizer, typical) in step_outliers(layers, STEP_ABSURD):
        return (f"the {optimizer} step of layer {layers[i].name} took {layers[i].step_ms[optimizer]:.3g} ms, "
                f"over {STEP_ABSURD:.0f}x the {typical:.3g} ms of the other {layers[i].kind} layers")
    return ""


def zero_recompute(layers: list[LayerProfile]) -> list[int]:
    """Indices of layers that save tensors past their input yet measured no recompute."""
    return [i for i, layer in enumerate(layers) if _zero_recompute(layer)]


def _compute_ms(layer: LayerProfile) -> float:
    return layer.fwd_ms + layer.bwd_ms


def _zero_recompute(layer: LayerProfile) -> bool:
    saves_more_than_input = layer.act_bytes > layer.input_in_act_bytes
    return layer.recompute_ms == 0.0 and saves_more_than_input and layer.fwd_ms >= FLOOR_MS


def _by_kind(layers: list[LayerProfile]) -> dict[tuple[str, str | None], list[int]]:
    """Layer indices per kind and variant (a global layer is not judged by its sliding ones' median)."""
    groups: dict[tuple[str, str | None], list[int]] = {}
    for i, layer in enumerate(layers):
        groups.setdefault((layer.kind, layer.variant), []).append(i)
    return groups


def step_outliers(layers: list[LayerProfile], factor: float) -> list[tuple[int, tuple[str, float]]]:
    """(layer index, (optimizer, its kind's median step)) for steps over `factor` times
    that median; kinds of fewer than three layers have no median to judge by."""
    found = []
    for same in _by_kind(layers).values():
        if len(same) < 3:
            continue
        for optimizer in layers[same[0]].step_ms:
            typical = median(layers[i].step_ms.get(optimizer, 0.0) for i in same)
            for i in same:
                step = layers[i].step_ms.get(optimizer, 0.0)
                if step >= FLOOR_MS and step > factor * typical:
                    found.append((i, (optimizer, typical)))
    return found


@dataclass(frozen=True)
class Fixed:
    """A layer's figures replaced by its kind's medians: which, what was wrong, the median said."""

    values: dict[str, float]  # fwd_ms, bwd_ms, recompute_ms
    what: str  # "forward + backward measured 99 ms, 3.2x its kind's median"
    typical: str  # "31 ms"


def robust_figures(layers: list[LayerProfile]) -> dict[int, Fixed]:
    """Per layer index, the kind's median figures for each layer of a kind of MIN_KIND or more
    whose forward + backward lies outside SPREAD of the kind's median, or whose recompute lies
    outside RECOMPUTE_SPREAD of it (above FLOOR_MS): the same work measured under load."""
    found: dict[int, Fixed] = {}
    for same in _by_kind(layers).values():
        if len(same) < MIN_KIND:
            continue
        fwd, bwd = median(layers[i].fwd_ms for i in same), median(layers[i].bwd_ms for i in same)
        typical = fwd + bwd
        for i in same:
            compute = _compute_ms(layers[i])
            if typical >= FLOOR_MS and not typical / SPREAD <= compute <= typical * SPREAD:
                found[i] = Fixed({"fwd_ms": fwd, "bwd_ms": bwd}, f"forward + backward measured {compute:.3g} ms, "
                                 f"{max(compute / typical, typical / compute):.2g}x off", f"{typical:.3g} ms")
        recomputes = [layers[i].recompute_ms for i in same if layers[i].recompute_ms is not None]
        if len(recomputes) < MIN_KIND:
            continue
        usual = median(recomputes)
        for i in same:
            value = layers[i].recompute_ms
            if value is None or max(value, usual) < FLOOR_MS or usual / RECOMPUTE_SPREAD <= value <= usual * RECOMPUTE_SPREAD:
                continue
            before = found.get(i)
            found[i] = Fixed({**(before.values if before else {}), "recompute_ms": usual},
                             (f"{before.what} and " if before else "") + f"recompute measured {value:.3g} ms",
                             (f"{before.typical} and " if before else "") + f"{usual:.3g} ms of recompute")
    return found


THREADS_SLOWER = 1.2  # the whole model this much slower at more threads than at fewer contradicts itself


def slower_with_more_threads(thread_ms: dict[int, float]) -> list[int]:
    """The thread counts at which the whole model ran over THREADS_SLOWER times slower than at
    some fewer threads: torch's threads do not slow work down; a busy machine does."""
    counts = sorted(thread_ms)
    return [count for i, count in enumerate(counts)
            if any(thread_ms[count] > THREADS_SLOWER * thread_ms[fewer] for fewer in counts[:i])]

