"""The calibration beside a profile: where it lies, how it is read, and the setup `solve` plans
with once it is applied for the placement a launch will use (calibrate.py writes it; setup_options
and calibrate_log read it, so it sits below both)."""

from __future__ import annotations

import os
from pathlib import Path


def calibration_path(profile_path: Path) -> Path:
    return profile_path.with_name(f"{profile_path.stem}.calibration.json")


def load_calibration(path: Path):
    from planner import io
    from planner.schema import Calibration

    remedy = "delete it or re-run `ckplan calibrate`"
    return io.load_model(Calibration, path, "calibration", remedy)


def resolve_profile(plan, plan_path: Path) -> Path:
    from planner import io

    return io.plan_profile_path(plan, plan_path, remedy="run from the directory the plan was made in")


def calibrated_setup(profile, profile_path: Path, setup) -> tuple:
    """(the setup `solve` plans with, sentences for the user): the calibration beside the
    profile applied for the placement a launch will use, and where its constants came
    from; or, with none, that there is none and what the prediction then assumes."""
    from planner.placement import placement_threads

    cores = os.cpu_count() or 1
    ranks = setup.pipeline.stages * setup.data_parallel.dp
    threads, _ = placement_threads(profile.device.threads, ranks, cores)
    path = calibration_path(profile_path)
    if profile.source in ("analytic", "fake"):  # nothing ran to fit constants to: suggest nothing that cannot run
        sends = ("sends between stages at the topology's link (planner/cost/comm.py), the schedule's cost per action "
                 "not charged" if setup.comm.pp_gb_per_s is not None else
                 "sends between stages and the schedule's cost per action are not charged")
        return setup, [f"{profile.source} profile: {sends} (calibration runs a measured profile's plan on the machines "
                       "that train)"]
    untrusted = profile.assumptions.get("timing_noise")
    if untrusted:
        said = [f"warning: the profile's timings cannot be trusted ({untrusted}): the plan's times may be far off; "
                "profile again on a quiet machine (or with --threads 1 where more threads ran slower)"]
        planned, notes = _calibrated(profile, profile_path, setup, path, ranks=ranks, threads=threads, cores=cores)
        return planned, [*notes, *said]
    return _calibrated(profile, profile_path, setup, path, ranks=ranks, threads=threads, cores=cores)


def _calibrated(profile, profile_path: Path, setup, path: Path, *, ranks: int, threads: int, cores: int) -> tuple:
    from planner.measure import calibrate

    if path.is_file():
        calibration = load_calibration(path)
        if calibration.profile.sha256 != _sha_or_none(profile_path):
            return setup, [f"{path} was fitted to another version of {profile_path} and is not applied (its sha256 "
                           "differs); re-run `ckplan calibrate PLAN` for this profile"]
        applied = calibrate.apply(setup, calibration, ranks=ranks, threads=threads, source=str(path),
                                  device=profile.device, cores=cores)
        return applied, [f"time constants from {applied.time.calibration}", *_far_from_one(applied.time)]
    notes = []
    if profile.device.type == "cpu" and profile.device.threads:
        scale = calibrate.thread_scale(profile.device, threads)
        sharing = calibrate.sharing_scale(profile.device, ranks=ranks, threads=threads, cores=cores)
        setup = setup.model_copy(update={"compute_scale": scale * sharing, "rank_threads": threads})
        said = []
        if threads != profile.device.threads and scale != 1.0:
            said.append(f"x{scale:.3g} as the profile timed the whole model at {profile.device.threads} threads and "
                        f"{threads}")
        if sharing != 1.0:
            said.append(f"x{sharing:.3g} for {min(ranks, cores)} ranks computing at once, as it timed the model "
                        "beside a copy on every other core")
        if said:
            notes.append(f"a launch gives each of the {ranks} ranks {threads} thread{'s' if threads > 1 else ''} "
                         f"({cores} cores): compute " + ", and ".join(said))
        elif threads != profile.device.threads:
            notes.append(f"the profile was measured with {profile.device.threads} threads; a launch gives each of "
                         f"the {ranks} ranks {threads} ({cores} cores): the predicted times are for "
                         f"{profile.device.threads} threads (the profile did not time other thread counts; "
                         "profile again, or `ckplan calibrate PLAN` measures the difference)")
    notes.append("not calibrated: " + ("sends between stages at the topology's link, the schedule's cost per action "
                                       "not charged" if setup.comm.pp_gb_per_s is not None else
                                       "sends between stages and the schedule's cost per action are not charged")
                 + "; `ckplan calibrate PLAN` measures them on this machine")
    return setup, [*notes, *_far_from_one(setup.time)]


# A compute scale below this says a launch runs much faster than the profile timed it: the
# profile (or the run calibrated against it) was slowed by other work. One above FAR_ABOVE is
# more than ranks sharing the cores of a machine cost each other in any run measured.
FAR_BELOW = 1 / 1.5
FAR_ABOVE = 4.0


def _far_from_one(time) -> list[str]:
    """A sentence when the compute scale the plan will be scored with is far from 1, never
    applied without a word."""
    scale = time.compute_scale * time.cpu_sharing
    if FAR_BELOW <= scale <= FAR_ABOVE:
        return []
    faster = scale < 1
    return [f"warning: every stage's compute is scaled x{scale:.3g}, so the plan is predicted "
            f"{1 / scale if faster else scale:.3g}x {'faster' if faster else 'slower'} than the profile's times: "
            + ("the profile was likely timed while other work kept the machine busy; "
               if faster else "the ranks were likely slowed by other work when this was measured; ")
            + "profile again on a quiet machine, or check the plan with `ckplan launch` before trusting its times"]


def _sha_or_none(path: Path) -> str | None:
    from planner import io

    return io.sha256_file(path) if path.is_file() else None
