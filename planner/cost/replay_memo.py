"""The replays of FSDP2's, Megatron-LM's, DeepSpeed's and Megatron-FSDP's steps remembered, as reserve.replay_stage
remembers ckplan's own (docs/published-runs.md §43.solvespeed, §44.smallfix): a solve scores a few hundred plans that
share stages, and each of these replays makes its events inside its own function from the stage's plan, its cost,
its place, the profile and the setup, then plays them under a cap or none. Its figure is a function of those alone
(each reads no other state), so the key is all of them as values:
- the stage's plan: its layers, checkpointed layers, recompute options and chunks (not its `predicted`, which no
  replay reads and which every solver rewrites);
- its StageCost (its repr: every field, floats exactly);
- its index, the setup (its JSON: every part), the cap and the allocator's setting;
- the profile: the object and its layers and tied sets by identity, as layers.layer_costs remembers them (the cost
  model changes a profile by a copy or by replacing a layer), and its other fields by value (their JSON).
At most _REMEMBERED figures, the oldest dropped first."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

from planner.schema import Profile, StagePlan, TrainSetup

_REMEMBERED = 2048
_FIGURES: dict = {}
_PROFILES: dict[int, tuple] = {}  # id(profile) -> (a weak reference to it, its parts' ids, its token)
_TOKENS = itertools.count()


def stage_key(route, plan: StagePlan, cost, index: int, *, profile: Profile, setup: TrainSetup) -> tuple:
    """What a replay of `route` (its function) reads of one stage, as values (the module's text), cap and allocator
    aside."""
    stage = (plan.index, tuple(plan.layers), tuple(plan.checkpointed), tuple(sorted(plan.recompute.items())),
             tuple(map(tuple, plan.chunks)))
    return route, stage, repr(cost), index, _profile_key(profile), setup.model_dump_json()


def remembered(key: tuple, make: Callable[[], object]):
    """The figure remembered under `key`, else make() remembered."""
    if key in _FIGURES:
        return _FIGURES[key]
    if len(_FIGURES) >= _REMEMBERED:
        del _FIGURES[next(iter(_FIGURES))]
    found = _FIGURES[key] = make()
    return found


def forget() -> None:
    _FIGURES.clear()


def _profile_key(profile: Profile) -> tuple:
    parts = (tuple(map(id, profile.layers)), tuple(map(id, profile.tied)))
    known = _PROFILES.get(id(profile))
    if known is None or known[0]() is not profile or known[1] != parts:  # a token never given before
        if len(_PROFILES) > 64:
            _PROFILES.clear()
        known = _PROFILES[id(profile)] = (weakref.ref(profile), parts, next(_TOKENS))
    return known[2], profile.model_dump_json(exclude={"layers"})
