"""`ckplan search`'s output: the ranked table (fitting 80 and 120 columns), the published and
hand configurations beside it, the JSON of the whole ranking, the plan written, and the
explanation when nothing fits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.units import format_bytes, format_ms


def mfu_named(runtime: str) -> str:
    """Whose MFU the search prints: the figure the runtime logs (planner/profiler/throughput.py: torchtitan's
    metrics.py under torchtitan, Megatron-LM's num_floating_point_operations elsewhere), as evaluate prints it."""
    return "torchtitan" if runtime == "torchtitan" else "Megatron-LM"


@dataclass
class Row:
    """One configuration's line: what the table and the JSON say of it."""

    name: str
    degrees: object
    iteration_ms: float | None
    fits: bool
    device_bytes: int | None  # the busiest rank's reserved peak + NCCL's buffers (cuda), else its peak
    cap_bytes: int
    recomputed: int | None  # layers with a recompute option other than none, over all ranks
    bound_ms: float | None = None
    note: str = ""
    source: str = ""
    why_not: str = ""


def _device_bytes(cost) -> int:
    return max((c.reserved_bytes if c.reserved_bytes is not None else c.peak_bytes) + c.workspace_bytes
               for c in cost.stages)


def _recomputed(stages) -> int:
    return sum(len(s.recompute) + len(set(s.checkpointed) - set(s.recompute)) for s in stages)


def solved_row(solved, index: int) -> Row:
    return Row(name=f"#{index + 1}", degrees=solved.degrees, iteration_ms=solved.iteration_ms, fits=True,
               device_bytes=_device_bytes(solved.cost), cap_bytes=solved.candidate.setup.pipeline.mem_caps_bytes[0],
               recomputed=_recomputed(solved.stages), bound_ms=solved.candidate.bounds.time_ms)


def scored_row(scored) -> Row:
    config = scored.config
    if scored.cost is None:
        return Row(name=config.name, degrees=scored.degrees, iteration_ms=None, fits=False, device_bytes=None,
                   cap_bytes=0, recomputed=None, note=scored.note, source=config.source, why_not=scored.why_not)
    return Row(name=config.name, degrees=scored.degrees, iteration_ms=scored.cost.iteration_ms,
               fits=scored.cost.feasible, device_bytes=_device_bytes(scored.cost),
               cap_bytes=scored.setup.pipeline.mem_caps_bytes[0], recomputed=_recomputed(scored.stages),
               note="; ".join(x for x in (scored.note, config.not_expressible and
                                          f"not charged: {config.not_expressible}") if x),
               source=config.source)


def compared(arch_name, hand, *, gpus, global_batch, options, profile_for, seq_len, gpu, imported=(),
             profile_for_model=None, deadline=None) -> list:
    """The published configurations of the model (with --compare), the hand one and `imported`
    ones, scored. `imported`: configurations read from a framework's own files
    (`--from-megatron ARGS`, `--from-torchtitan TOML`), as Published records
    (search_compare.from_framework_job); one that carries its own model (Megatron-LM's padded
    vocabulary) is profiled by `profile_for_model(model)`. `deadline`: the search's, which they are
    scored inside before it runs: a configuration whose recompute is ckplan's plan is solved for
    60 s at most and, together with the others, within half of what the limit has left, the search
    keeping the other half."""
    from planner.commands import search_compare
    from planner.solve.deadline import Deadline

    left = None if deadline is None else deadline.remaining_s()
    share = Deadline(None if left is None else left / 2)
    configs = search_compare.matching(arch_name) + ([hand] if hand is not None else []) + list(imported)
    return [search_compare.score(c, gpus=gpus, global_batch=global_batch, options=options,
                                 profile_for=profile_for if c.model is None else profile_for_model(c.model),
                                 time_limit_s=_solve_limit_s(share), seq_len=seq_len, gpu=gpu) for c in configs]


def _solve_limit_s(share) -> float:
    """A compared plan's solve: 60 s, or what the compared configurations' share of the limit has left."""
    left = share.remaining_s()
    return 60.0 if left is None else min(60.0, left)


class Report:
    def __init__(self, outcome, compared, *, job, options, gpu, arch, seq_len, global_batch, out,
                 timed_on: str | None = None):
        self.outcome, self.job, self.options, self.gpu, self.out = outcome, job, options, gpu, out
        self.seq_len, self.global_batch = seq_len, global_batch  # seq_len 0: a profile that records none
        self.timed_on = timed_on  # the device a measured profile's times are from, where not the GPU named
        self.arch = arch
        self.rows = [solved_row(s, i) for i, s in enumerate(outcome.ranked)]
        self.others = [scored_row(s) for s in compared]

    # ------------------------------------------------------------ figures of a row

    def tokens_per_gpu_s(self, row: Row) -> float | None:
        """None where not known: no iteration, or a profile that records no sequence length (a model file's)."""
        if row.iteration_ms is None or not self.seq_len:
            return None
        return self.global_batch * self.seq_len / (row.iteration_ms / 1e3) / self.job.gpus

    def mfu(self, row: Row) -> float | None:
        """The MFU the runtime logs for this iteration (mfu_named), as evaluate's throughput line gives it."""
        if row.iteration_ms is None or self.arch is None:
            return None
        from planner.profiler.throughput import throughput

        found = throughput(iteration_ms=row.iteration_ms, tokens_per_iteration=self.global_batch * self.seq_len,
                           gpus=self.job.gpus, peak_tflops=self.gpu.bf16_tflops, arch=self.arch, seq_len=self.seq_len)
        return found.torchtitan_mfu if mfu_named(self.options.runtime) == "torchtitan" else found.megatron_mfu

    def differs(self, index: int) -> str:
        from planner.solve.degrees import differences

        if index + 1 >= len(self.rows):
            return "-"
        here, after = self.rows[index], self.rows[index + 1]
        words = differences(here.degrees, after.degrees)
        if here.recomputed != after.recomputed:
            words.append(f"recompute {here.recomputed}→{after.recomputed}")
        return ", ".join(words) or "the same degrees, another plan"

    # ------------------------------------------------------------ printing

    def print(self) -> None:
        from planner.commands.search_settings import spelled, stated
        from planner.console import console, table

        batch = f"{self.global_batch} x {self.seq_len} tokens" if self.seq_len else f"{self.global_batch} samples"
        timed = f" (times as profiled on {self.timed_on})" if self.timed_on else ""
        title = (f"ckplan search: {self.job.gpus} x {self.gpu.name}{timed}, batch {batch}, "
                 f"{self.options.runtime}'s runtime")
        columns = ["#", "configuration", "iteration", "tok/s/GPU", f"MFU ({mfu_named(self.options.runtime)}'s)",
                   "reserved", "% card"]
        rows = [self._cells(row) for row in self.rows]
        if rows:
            console.print(table(title, columns, rows, right_from=2, whole=(), wrap=("configuration",)))
            for index, row in enumerate(self.rows[:-1]):
                console.print(f"  {row.name} differs from {self.rows[index + 1].name}: {self.differs(index)}",
)
        if self.others:
            cells = [self._cells(row) for row in self.others]
            console.print(table("beside it, same cost model", columns, cells, right_from=2, whole=(),
                                wrap=("configuration",)))
            for row in self.others:
                said = row.why_not or row.note
                console.print(f"  {row.name}: {said or 'as published'}" + (f" [{row.source}]" if row.source else ""),
                              markup=False)
        console.print(self.counts())
        settings = stated(self.options.training, self.options.tp_overlap)
        if settings:
            console.print(f"every configuration scored with {spelled(settings)}", markup=False)
        if self.out is not None:
            console.print(f"best written to {self.out} (`ckplan export {self.out} --to megatron|torchtitan|...`)",
                          markup=False)

    def _cells(self, row: Row) -> list[str]:
        ranked = row.name.startswith("#")
        label = row.degrees.label() if ranked else row.name
        if row.iteration_ms is None:
            return ["-", label, "-", "-", "-", "-", "-"]
        tokens, mfu = self.tokens_per_gpu_s(row), self.mfu(row)
        share = row.device_bytes / row.cap_bytes
        fits = "" if row.fits else " NO"
        return [row.name if ranked else "-", label, format_ms(row.iteration_ms), f"{tokens:,.0f}" if tokens is not None else "-",
                f"{mfu:.3f}" if mfu is not None else "-",
                format_bytes(row.device_bytes), f"{share * 100:.0f}%{fits}"]

    def counts(self) -> str:
        o = self.outcome
        done = "complete" if o.complete else (f"cut short by --time-limit ({_left(o)}): the ranking is the best of "
                                              "what was solved")
        return (f"{o.considered} configurations considered ({o.duplicates} the same setup as another, {o.refused} "
                f"refused): {o.pruned_memory} pruned by the memory bound, {o.pruned_time} by the time bound{_bubble(o)}, "
                f"{o.solved} solved ({o.solved_without_plan} without a plan that fits or beats the bound"
                f"{_early(o)}){_bounded(o)}; "
                f"{o.profiles} profiles; {o.wall_s:.1f} s; {done}")

    # ------------------------------------------------------------ JSON

    def as_json(self) -> str:
        o = self.outcome

        def one(row: Row, index: int | None = None) -> dict:
            return {"name": row.name, "degrees": row.degrees.as_dict() if row.degrees is not None else None,
                    "iteration_ms": row.iteration_ms, "fits": row.fits, "bound_ms": row.bound_ms,
                    "tokens_per_s_per_gpu": self.tokens_per_gpu_s(row), "mfu": self.mfu(row),
                    "mfu_of": mfu_named(self.options.runtime),
                    "device_bytes_max": row.device_bytes, "cap_bytes": row.cap_bytes,
                    "recomputing_layers": row.recomputed, "note": row.note or None, "source": row.source or None,
                    "why_not": row.why_not or None,
                    **({"differs_from_next": self.differs(index)} if index is not None else {})}

        ranked = [one(row, i) | {"stages": _stages(solved)} for i, (row, solved) in enumerate(zip(self.rows, o.ranked))]
        from planner.commands.search_settings import stated

        return json.dumps({
            "plan": str(self.out) if self.out is not None else None,
            "settings": stated(self.options.training, self.options.tp_overlap),
            "counts": {"considered": o.considered, "duplicates": o.duplicates, "refused": o.refused,
                       "pruned_memory": o.pruned_memory, "pruned_time": o.pruned_time,
                       "pruned_bubble": o.pruned_bubble, "solved": o.solved,
                       "solved_without_plan": o.solved_without_plan, "profiles": o.profiles,
                       "unexplored": o.unexplored, "not_solved": len(o.unsolved), "solved_early": o.solved_early,
                       "deferred": o.deferred,
                       "best_unsolved_bound_ms": best_unsolved_ms(o),
                       "complete": o.complete, "cut_short": o.cut_short,
                       "wall_s": o.wall_s},
            "ranked": ranked, "compared": [one(row) for row in self.others]}, indent=2)


def _early(o) -> str:
    """The solves run while the enumeration still ran (under a limit, in bound order, half its time to each)."""
    if not o.solved_early:
        return ""
    return (f"; {o.solved_early} of them solved in bound order while the enumeration ran, half the time spent "
            "to each")


def _bounded(o) -> str:
    """The solves stopped at their share of the time while the enumeration ran (planner/solve/searchqueue.py)."""
    if not o.deferred:
        return ""
    return (f"; {o.deferred} solve{'s' if o.deferred > 1 else ''} stopped at the solves' share of the time while "
            "the enumeration ran, the configuration waiting for its end")


def _bubble(o) -> str:
    """How many of those the time bound pruned were interleaved ones pruned by their bubble (chunkbound.py)."""
    return f" ({o.pruned_bubble} of them interleaved, by the bound with its bubble)" if o.pruned_bubble else ""


def _left(o) -> str:
    """What a search cut short by its deadline left: configurations never reached (neither profiled nor bounded),
    those bounded below the bar and not solved, and the best bound among them against the best time found (the
    gap the user is left with)."""
    unexplored = (f"{o.unexplored} configurations not explored, the deadline passing before them "
                  f"(profiles built: {o.profiles}); " if o.unexplored else "")
    bound = best_unsolved_ms(o)
    if bound is None:
        gap = ""
    elif o.ranked:
        gap = (f", the best of them bounded at {format_ms(bound)} against {format_ms(o.ranked[0].iteration_ms)} "
               "found")
    else:
        gap = f", the best of them bounded at {format_ms(bound)}"
    cut = (f"; {o.cut_short} solve{'s' if o.cut_short != 1 else ''} stopped by it, {'their' if o.cut_short != 1 else 'its'} "
           "plan so far ranked" if o.cut_short else "")
    return f"{unexplored}{len(o.unsolved)} passing the memory bound not solved{gap}{cut}"


def best_unsolved_ms(o) -> float | None:
    """The least time bound among the configurations left unsolved: no plan left could be faster."""
    return min((c.bounds.time_ms for c in o.unsolved), default=None)


def _stages(solved) -> list[dict]:
    from planner.commands.stage_json import stages_json

    return stages_json(solved.stages, solved.cost)


def write_plan(best, out: Path, profile_out: Path, model_ref) -> None:
    """The best configuration as plan.yaml (its profile beside it): what `ckplan export` reads."""
    from datetime import datetime, timezone

    from planner import io
    from planner.schema import FileRef, Plan, PlanPredicted, SolverInfo
    profile, setup = best.candidate.plan_profile or best.candidate.profile, best.candidate.setup
    io.save_profile(profile, profile_out)
    plan = Plan(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                model=FileRef(file=profile.model.file, sha256=profile.model.sha256),
                profile=FileRef(file=profile_out.name, sha256=io.sha256_file(profile_out)),
                device=profile.device, dtype=profile.dtype, profile_source=profile.source, setup=setup,
                stages=best.stages,
                predicted=PlanPredicted(iteration_ms=best.iteration_ms,
                                        peak_bytes_max=max(best.cost.peak_bytes_per_stage)),
                solver=SolverInfo(name=best.solve.solver, status=best.solve.status, objective=best.solve.objective,
                                  bound=best.solve.bound, gap=best.solve.gap, wall_s=round(best.solve.wall_s, 4),
                                  replay=best.solve.replay, solves=best.solve.solves))
    # no baselines: the search ranks configurations; `ckplan solve --profile PLAN.profile.json` with
    # the plan's degrees scores them (on 405B they take longer than the whole search's solves)
    io.save_plan(plan, out)


def nothing_fits(report: Report, job, options, profile_for, *, time_limit_s: float | None = None) -> str:
    """Which resource, by how much, and what would fit; `time_limit_s`: the --time-limit given."""
    import dataclasses

    from planner.solve import jobsearch

    o = report.outcome
    if not o.complete and (o.unsolved or o.unexplored):
        # the limit given, which the command's own start (the settings' sample profile) shares with the
        # search: o.wall_s is the search's part alone (0.0 s where the sample used it all)
        limit = f" {time_limit_s:g} s" if time_limit_s is not None else ""
        return (f"no configuration was solved to a plan that fits before --time-limit{limit} ran out (the search "
                f"itself {o.wall_s:.1f} s of it): {_left(o)}; raise --time-limit")
    near = o.nearest
    if near is not None and o.solved == 0:
        need, limit = near.bounds.static_bytes, near.bounds.limit_bytes
        if limit <= 0:
            return (f"no configuration fits: --mem {format_bytes(options.mem_cap_bytes)} is less than NCCL's "
                    "communicator buffers and the caching allocator's margin alone; raise --mem")
        over = f"{(need / limit - 1) * 100:.0f}% over"
        what = (f"no configuration fits {job.gpus} x {report.gpu.name}: even the nearest ({near.degrees.label()}) "
                f"holds at least {format_bytes(need)} of weights, gradients and optimizer state per GPU, against "
                f"{format_bytes(max(0, limit))} it may allocate of {format_bytes(options.mem_cap_bytes)} ({over})")
    else:
        what = (f"no configuration fits {job.gpus} x {report.gpu.name}: {o.solved} passed the memory bound, and the "
                "exact plan of each needs more than the card once activations are counted")
    for factor in (2, 4, 8):
        more = dataclasses.replace(job, gpus=job.gpus * factor)
        passing = jobsearch.memory_passing(more, options, profile_for)
        if passing:
            return (f"{what}. With --gpus {more.gpus}, {passing} configuration{'s' if passing > 1 else ''} pass"
                    f"{'' if passing > 1 else 'es'} the memory bound; try that, a "
                    "card with more memory, or a smaller --global-batch")
    return (f"{what}. Not even {job.gpus * 8} GPUs pass the memory bound at --global-batch {job.global_batch} (the "
            "batch bounds data parallelism, and so ZeRO's sharding): raise --global-batch, or use a larger card")
