"""How a plan's ranks share one machine's CPU cores: the torch threads a launch gives each rank, and so
how many pipeline stages compute at once. Pure arithmetic on counts, in one place so that the launch
(planner/runtime/launcher.py), the calibration it is fitted for (planner/commands/calibration.py,
calibrate.py) and the setup every planning command predicts with (planner/commands/setup_options.py)
place the ranks alike."""

from __future__ import annotations


def placement_threads(profile_threads: int | None, ranks: int, cores: int) -> tuple[int, str]:
    """(torch threads per rank, "plan" | "cpu_count") a launch uses by default: the profile's
    threads when every rank can have them (times comparable with the profile), else the
    cores shared evenly among the ranks, at least one: ranks x threads never exceed the
    cores unless the ranks alone do."""
    fair = max(1, cores // ranks)
    if profile_threads and profile_threads <= fair:
        return profile_threads, "plan"
    return fair, "cpu_count"


def stages_at_once(*, cores: int, threads: int, stages: int, dp: int) -> int | None:
    """How many stages compute at once on CPU (the setup's parallel_stages) when every rank
    of a stage's dp replicas runs `threads` threads on `cores`: None when all of them do."""
    fit = max(1, cores // (threads * dp))
    return fit if fit < stages else None
