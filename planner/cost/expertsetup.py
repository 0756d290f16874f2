"""The setup a layer's routed experts see (dataparallel.expert_setup), made once per setup: the cost model asks it
of most terms of every MoE layer, and each copy is a validated TrainSetup (508,067 copies, 26.7 s of a 155 s
search: docs/published-runs.md §42.profspeed). The copy is a function of the setup's value alone; it is kept
beside a snapshot of that value and given again only while the setup still equals the snapshot (a setup changed
in place gets a new copy). The copy given out is shared: nothing in planner/ changes a setup in place."""

from __future__ import annotations

from planner.schema import TrainSetup

_KEPT = 64  # setups remembered (the bounds and a solve ask one setup at a time)
_MADE: dict[int, tuple[TrainSetup, TrainSetup, TrainSetup]] = {}  # id -> (setup, its value then, its copy)


def made(setup: TrainSetup) -> TrainSetup:
    """dp / E replicas of each expert, ZeRO over shard groups of K / E; the setup itself without expert
    parallelism."""
    dp = setup.data_parallel
    if dp.ep == 1:
        return setup
    entry = _MADE.get(id(setup))
    if entry is not None and entry[0] is setup and entry[1] == setup:
        return entry[2]
    group = None if dp.shard_group is None else dp.shard_group // dp.ep
    copy = setup.model_copy(update={"dp": dp.dp // dp.ep, "ep": 1, "shard_group": group})
    if len(_MADE) >= _KEPT:
        _MADE.clear()
    _MADE[id(setup)] = (setup, setup.model_copy(deep=True), copy)
    return copy
