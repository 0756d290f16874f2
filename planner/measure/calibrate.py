"""Fit the cost model's time constants to measurements (pure functions, no I/O).

Three kinds of constant, each from the measurement that shows it alone:

- a send's latency and bandwidth: a line `ms = latency + bytes / bandwidth` through
  one-way times of point-to-point sends of several sizes (planner/profiler/commbench.py);
- the compute scale: how much longer (or shorter) each stage's forward + backward takes
  in the run than the profile says (other threads than profiled, ranks sharing cores),
  the ratio of the summed per-stage measurements to the summed predictions;
- with the above fixed, the one constant the iteration then leaves: the schedule's cost
  per action when every stage has its cores (the iteration grows with it, so it is found by
  bisection), or, when ranks share cores, the sharing factor on the capacity bound (a
  closed form) with the action cost kept from a run that had its cores;
- an iteration faster than its stages' medians predict (measured: ranks computing at once
  slow each other more than in the fill and drain, when some idle) gets no action cost and
  one compute scale fitted to the stages and the iteration together (least squares).

`apply` turns a Calibration into the TrainSetup fields costmodel reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import costmodel
from planner.schema import Calibration, DeviceInfo, PlacementFit, Profile, StagePlan, TrainSetup

BISECT_STEPS = 60


@dataclass(frozen=True)
class SendSample:
    num_bytes: int
    ms: float  # one way, median


@dataclass(frozen=True)
class PipelineSample:
    """One run of `stages`: per stage its compute per microbatch (fwd + bwd), and the iteration."""

    stages: list[StagePlan]
    stage_ms: list[float]
    iteration_ms: float


def fit_send(samples: Sequence[SendSample]) -> tuple[float, float | None]:
    """(latency ms, GB/s) of the least-squares line through the samples; a latency below 0
    is 0, and a line that does not rise with bytes leaves the bandwidth None (not resolved)."""
    if len({s.num_bytes for s in samples}) < 2:
        raise ValueError("a send fit needs samples of at least two sizes")
    n = len(samples)
    mean_x = sum(s.num_bytes for s in samples) / n
    mean_y = sum(s.ms for s in samples) / n
    var_x = sum((s.num_bytes - mean_x) ** 2 for s in samples)
    slope = sum((s.num_bytes - mean_x) * (s.ms - mean_y) for s in samples) / var_x  # ms per byte
    if slope <= 0:
        return max(mean_y, 0.0), None
    return max(mean_y - slope * mean_x, 0.0), 1e-6 / slope


def with_sends(setup: TrainSetup, latency_ms: float, gb_per_s: float | None) -> TrainSetup:
    return setup.model_copy(update={"send_latency_ms": latency_ms, "send_gb_per_s": gb_per_s})


def fit_compute_scale(sample: PipelineSample, profile: Profile, setup: TrainSetup) -> float:
    """Σ measured stage compute / Σ the profile's (setup's own compute scale taken out)."""
    unscaled = setup.model_copy(update={"compute_scale": 1.0})
    cost = costmodel.evaluate(sample.stages, profile, unscaled)
    return sum(sample.stage_ms) / sum(stage.time_ms for stage in cost.stages)


def predicted_ms(sample: PipelineSample, profile: Profile, setup: TrainSetup) -> float:
    return costmodel.evaluate(sample.stages, profile, setup).iteration_ms


def fit_action_overhead(sample: PipelineSample, profile: Profile, setup: TrainSetup) -> float:
    """The action cost (ms, ≥ 0) at which the setup's iteration equals the measured one:
    the iteration only grows with it, so bisection; 0 when even 0 predicts too long."""
    def at(overhead_ms: float) -> float:
        return predicted_ms(sample, profile, setup.model_copy(update={"action_overhead_ms": overhead_ms}))

    if at(0.0) >= sample.iteration_ms:
        return 0.0
    return _bisect(at, sample.iteration_ms, 0.0, sample.iteration_ms)  # one action already takes it all


def _bisect(grows, target: float, low: float, high: float) -> float:
    """Where the nondecreasing function `grows` reaches `target` between low and high."""
    for _ in range(BISECT_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if grows(middle) < target else (low, middle)
    return (low + high) / 2


JOINT_STEPS = 200


def fit_joint_scale(sample: PipelineSample, profile: Profile, setup: TrainSetup) -> float:
    """The compute scale that best fits the stages and the iteration together: least squares
    of relative errors, the iteration weighted as much as all stages, searched on a grid
    between the iteration's own scale and the stages' (setup.time.compute_scale), where the
    optimum lies (each error term is monotone in the scale)."""
    def loss(scale: float) -> float:
        cost = costmodel.evaluate(sample.stages, profile, setup.model_copy(update={"compute_scale": scale}))
        stages = sum(((c.time_ms - m) / m) ** 2 for c, m in zip(cost.stages, sample.stage_ms))
        return stages + len(sample.stage_ms) * ((cost.iteration_ms - sample.iteration_ms) / sample.iteration_ms) ** 2

    high = setup.time.compute_scale
    low = _bisect(lambda scale: predicted_ms(sample, profile, setup.model_copy(update={"compute_scale": scale})),
                  sample.iteration_ms, 0.0, high)  # the iteration's own scale
    return min((low + (high - low) * step / JOINT_STEPS for step in range(JOINT_STEPS + 1)), key=loss)


def fit_cpu_sharing(sample: PipelineSample, profile: Profile, setup: TrainSetup) -> float:
    """The sharing factor h that makes the capacity bound h·(M·Σ busy + Σ step) / C equal
    the measured iteration (ranks sharing cores: the bound is what the run shows)."""
    plain = setup.model_copy(update={"cpu_sharing": 1.0})
    cost = costmodel.evaluate(sample.stages, profile, plain)
    unshared = costmodel.capacity_ms(sum(c.busy_ms for c in cost.stages), sum(c.step_ms for c in cost.stages), plain)
    if unshared <= 0:
        raise ValueError("cpu sharing is fitted only when fewer stages compute at once than there are")
    return sample.iteration_ms / unshared


def fit_placement(sample: PipelineSample, profile: Profile, setup: TrainSetup, *, ranks: int, threads: int,
                  cores: int, plan: str, action_overhead_ms: float | None) -> tuple[PlacementFit, float]:
    """The placement's constants and the action cost: fitted here when every stage has its
    cores, else `action_overhead_ms` (from an earlier run; None: 0) is kept and the sharing
    factor fitted. `setup` carries the send constants; returns (fit, action cost)."""
    before = predicted_ms(sample, profile, uncalibrated(setup))
    scaled = setup.model_copy(update={"compute_scale": fit_compute_scale(sample, profile, setup), "cpu_sharing": 1.0})
    sharing = costmodel.parallel_stages(setup) < setup.pipeline.stages
    if sharing:
        overhead = action_overhead_ms or 0.0
        scaled = scaled.model_copy(update={"action_overhead_ms": overhead})
        scaled = scaled.model_copy(update={"cpu_sharing": fit_cpu_sharing(sample, profile, scaled)})
    elif predicted_ms(sample, profile, scaled) > sample.iteration_ms:
        # faster than its stages say: they slowed each other in the steady state more than in
        # the fill and drain, when some idle; no action cost, one scale for stages and iteration
        overhead = 0.0
        scaled = scaled.model_copy(update={"compute_scale": fit_joint_scale(sample, profile, scaled)})
    else:
        overhead = fit_action_overhead(sample, profile, scaled)
        scaled = scaled.model_copy(update={"action_overhead_ms": overhead})
    fit = PlacementFit(ranks=ranks, threads=threads, cores=cores, compute_scale=scaled.time.compute_scale,
                       cpu_sharing=scaled.time.cpu_sharing, plan=plan, measured_iteration_ms=sample.iteration_ms,
                       predicted_before_ms=before, predicted_after_ms=predicted_ms(sample, profile, scaled))
    return fit, overhead


def thread_scale(device: DeviceInfo, threads: int) -> float:
    """How much longer compute takes with `threads` torch threads than with the profile's:
    the ratio of the whole model's forward + backward that profile timed at both
    (profiler/threads.py); between two timed counts, linear in the count; past the last,
    the last's. 1 when the profile timed none (cuda, or a profile from before)."""
    timed = device.thread_ms
    if not timed or device.threads not in timed:
        return 1.0
    return _interpolated(timed, threads) / timed[device.threads]


def sharing_scale(device: DeviceInfo, *, ranks: int, threads: int, cores: int) -> float:
    """How much longer a 1-thread rank computes while the other ranks compute on the other
    cores (shared caches and memory bandwidth): the whole model's median at 1 thread beside
    min(ranks, cores) - 1 copies over its median alone, as profile timed it; linear in the
    count between the two, the last measured past it. 1 for ranks of several threads, a
    rank alone, or a profile that timed none. Never below 1: a copy on another core cannot make
    a rank faster, so a median beside copies under the one alone is the machine's load changing
    between the two timings (a profile on 2 shared cores timed x0.633), not a speed-up."""
    shared = device.shared_ms
    at_once = min(ranks, cores)
    if not shared or 1 not in shared or threads != 1 or at_once < 2:
        return 1.0
    return max(1.0, _interpolated(shared, at_once) / shared[1])


def _interpolated(timed: dict[int, float], count: int) -> float:
    """The time at `count`: linear between the two timed counts around it, the nearest end's outside them."""
    counts = sorted(timed)
    if count <= counts[0] or count >= counts[-1]:
        return timed[counts[0] if count <= counts[0] else counts[-1]]
    low = max(c for c in counts if c <= count)
    high = min(c for c in counts if c >= count)
    share = 0.0 if high == low else (count - low) / (high - low)
    return timed[low] + share * (timed[high] - timed[low])


def placement_scale(device: DeviceInfo, *, ranks: int, threads: int, cores: int) -> float:
    """The compute scale of an uncalibrated launch: the profile's threads to the rank's
    (thread_scale), times what ranks filling the cores cost each other (sharing_scale)."""
    return thread_scale(device, threads) * sharing_scale(device, ranks=ranks, threads=threads, cores=cores)


def threaded(setup: TrainSetup, device: DeviceInfo, threads: int, *, ranks: int, cores: int) -> TrainSetup:
    """The uncalibrated setup for a launch of `ranks` ranks with `threads` torch threads each
    on `cores`: compute scaled by placement_scale, nothing else charged."""
    return uncalibrated(setup).model_copy(update={
        "compute_scale": placement_scale(device, ranks=ranks, threads=threads, cores=cores),
        "rank_threads": threads if device.type == "cpu" else None})


def uncalibrated(setup: TrainSetup) -> TrainSetup:
    """The setup with every calibrated constant back at the value that charges nothing."""
    return setup.model_copy(update={"send_latency_ms": 0.0, "send_gb_per_s": None, "action_overhead_ms": 0.0,
                                    "compute_scale": 1.0, "cpu_sharing": 1.0, "calibration": None})


def placement_for(calibration: Calibration, *, ranks: int, threads: int) -> PlacementFit | None:
    """The newest fit measured with this many ranks of this many threads, if any."""
    found = [fit for fit in calibration.placements if (fit.ranks, fit.threads) == (ranks, threads)]
    return found[-1] if found else None


def apply(setup: TrainSetup, calibration: Calibration, *, ranks: int, threads: int, source: str,
          device: DeviceInfo | None = None, cores: int | None = None) -> TrainSetup:
    """The setup with the calibration's sends and action cost, and the compute scale and
    sharing measured with this placement (when it was never measured: the profile's
    thread_scale, or 1, and sharing 1; said in `calibration`)."""
    fit = placement_for(calibration, ranks=ranks, threads=threads)
    scale = (placement_scale(device, ranks=ranks, threads=threads, cores=cores or os.cpu_count() or 1)
             if device is not None else 1.0)
    placed = (f"compute x{fit.compute_scale:.3g}, sharing x{fit.cpu_sharing:.3g} measured with {ranks} ranks x "
              f"{threads} threads" if fit else f"no run measured {ranks} ranks x {threads} threads: compute "
              + (f"x{scale:.3g} by the profile's whole-model timing" if scale != 1.0 else "as profiled"))
    return setup.model_copy(update={
        "send_latency_ms": calibration.send_latency_ms, "send_gb_per_s": calibration.send_gb_per_s,
        "action_overhead_ms": calibration.action_overhead_ms,
        "compute_scale": fit.compute_scale if fit else scale, "cpu_sharing": fit.cpu_sharing if fit else 1.0,
        "rank_threads": threads if device is not None and device.type == "cpu" else None,
        "calibration": f"{source} ({calibration.created_at}; {placed})",
    })


# A fit is suspect, and not written unless the user accepts it, when (each a judgement, not
# a measured figure): another process kept more than a quarter of the CPU busy just before
# the run (the fit then measures that process too); a constant moved more than 3x from the
# last fit of the same profile on this machine; or compute came out more than 1.5x off what
# the profile's own timing at the launch's threads says (profiler/threads.py).
BUSY_SHARE = 0.25
MOVED_RATIO = 3.0
SCALE_RATIO = 1.5
ACTION_FLOOR_MS = 0.05  # below this an action cost is noise: moving between two such values is no news


def suspect(new: Calibration, old: Calibration | None, *, expected_scale: float | None,
            busy_share: float | None, oversubscribed: float = 1.0) -> list[str]:
    """Why `new` (one placement fitted by one run) should not replace the constants in use:
    one sentence per reason, none when it looks sound. `oversubscribed`: ranks x threads over
    the cores (at least 1); ranks that time-share the cores compute up to that much longer than
    the profile's timing says, which is no fault of the fit (4 ranks on 2 cores fitted x3.58
    where the profile's timing said x1.82)."""
    reasons = []
    if busy_share is not None and busy_share > BUSY_SHARE:
        reasons.append(f"other work kept {busy_share:.0%} of the CPU busy just before the run")
    fit = new.placements[-1]
    shared = max(oversubscribed, 1.0)
    if expected_scale and not (1 / SCALE_RATIO <= fit.compute_scale / expected_scale <= SCALE_RATIO * shared):
        widened = f" (up to x{expected_scale * shared:.3g} for ranks time-sharing the cores)" if shared > 1 else ""
        reasons.append(f"compute came out x{fit.compute_scale:.3g} the profile's, where the profile's own timing at "
                       f"{fit.threads} thread{'s' if fit.threads > 1 else ''} says x{expected_scale:.3g}{widened}")
    if old is not None:
        before = old.action_overhead_ms
        if max(before, new.action_overhead_ms) > ACTION_FLOOR_MS and not _within(new.action_overhead_ms, before):
            reasons.append(f"the cost per schedule action moved from {before:.3g} ms to "
                           f"{new.action_overhead_ms:.3g} ms since the last calibration")
        last = placement_for(old, ranks=fit.ranks, threads=fit.threads)
        if last is not None and not _within(fit.compute_scale, last.compute_scale):
            reasons.append(f"compute moved from x{last.compute_scale:.3g} to x{fit.compute_scale:.3g} since the last "
                           f"calibration of {fit.ranks} ranks x {fit.threads} threads")
    return reasons


def _within(value: float, reference: float) -> bool:
    low, high = sorted((max(value, ACTION_FLOOR_MS), max(reference, ACTION_FLOOR_MS)))
    return high / low <= MOVED_RATIO


def merged(old: Calibration | None, new: Calibration) -> Calibration:
    """The new calibration, keeping the old one's fits for other placements."""
    if old is None:
        return new
    kept = [fit for fit in old.placements
            if all((fit.ranks, fit.threads) != (other.ranks, other.threads) for other in new.placements)]
    return new.model_copy(update={"placements": kept + new.placements})
