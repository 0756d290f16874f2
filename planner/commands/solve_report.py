"""Tables `ckplan solve` prints: the plan per stage and the comparison with baselines."""

from __future__ import annotations

import math
from pathlib import Path

from planner.console import bar, console, narrow, percent, table
from planner.units import format_bytes, format_ms


def dp_words(setup) -> str:
    """The data-parallel setup in a few words ('' without it)."""
    from planner.cost import dataparallel

    if setup.data_parallel.dp == 1 and not setup.data_parallel.offload:
        return ""
    return f", dp {setup.data_parallel.dp}, {dataparallel.described(setup)}"


def at_once_words(parallel_stages: int | None, stages: int) -> str:
    """The title's note on stages that share the cores, or nothing when all compute at once."""
    if not parallel_stages or parallel_stages >= stages:
        return ""
    verb = "stage computes" if parallel_stages == 1 else "stages compute"
    return f", {parallel_stages} {verb} at once (shared cores)"


def _layer_range(layers: list[str]) -> str:
    return layers[0] if len(layers) == 1 else f"{layers[0]}–{layers[-1]}"


def _checkpointed(stage) -> str:
    """What the stage recomputes: the checkpointed layers' names when they are few and the only
    option, else each option with how many layers take it ("full 3, attn,mlp-act 12")."""
    if set(stage.recompute.values()) <= {"full"}:
        names = stage.checkpointed
        return ", ".join(names) if len(names) <= 3 else f"{len(names)} layers"
    counts: dict[str, int] = {}
    for name in stage.layers:
        if stage.option(name) != "none":
            counts[stage.option(name)] = counts.get(stage.option(name), 0) + 1
    return ", ".join(f"{option} {count}" for option, count in counts.items())


def device_bytes(predicted) -> int:
    """What a stage takes of its device: the reserved peak and the communication buffers on
    cuda, the peak on cpu."""
    if predicted.reserved_bytes is None:
        return predicted.peak_bytes
    return predicted.reserved_bytes + predicted.workspace_bytes


def reserved_columns(predicted) -> list[str]:
    """cuda: the reserved peak and the communication buffers, beside the allocated peak."""
    return [format_bytes(predicted.reserved_bytes), format_bytes(predicted.workspace_bytes)]


RESERVED_COLUMNS = ["reserved", "nccl"]


def _share(fraction: float, cuda: bool) -> str:
    """Of the cap: a bar, or on cuda, beside the reserved columns, a percentage."""
    return percent(fraction) if cuda else bar(fraction, width=10)


def reserved_note(setup, predicted=()) -> str:
    """How the reserved column is made (cuda plans): by the caching allocator's replay where each
    stage's `predicted.reserved_by` says so (planner/cost/reserve.py), else by the divisor; and
    the stages whose replayed reserve the cap does not hold (the solvers admit a plan by its
    allocated peak under the divisor's margin)."""
    from planner.cost import allocator

    margin = setup.pipeline.fragmentation
    margin = allocator.DEFAULT_FRAGMENTATION if margin is None else margin
    divisor = f"the caching allocator's at {margin:.0%} fragmentation (--fragmentation), in 2 MiB segments"
    replayed = [i for i, p in enumerate(predicted) if p.reserved_by == "replay"]
    from planner.cost import runtimes
    record = runtimes.of(setup.training)
    what = ("torchtitan's FSDP2 step, ordered from the cost model's terms" if record.fsdp2_step_replayed
            else "Megatron-LM's step (its buffers, optimizer and schedule) around each stage's recorded allocations"
            if record.megatron_step_replayed else "each stage's recorded allocations")
    how = divisor if not replayed else (
        f"the caching allocator's rules replayed on {what}" if len(replayed) == len(predicted)
        else f"replayed ({what}) on stages {', '.join(map(str, replayed))}, elsewhere {divisor}")
    over = [i for i, p in enumerate(predicted) if p.reserved_bytes is not None
            and p.reserved_bytes + p.workspace_bytes > setup.pipeline.mem_caps_bytes[i]]
    warning = f"; stages {', '.join(map(str, over))} reserve more than their cap" if over else ""
    rows = (f"the solvers hold the allocated peak to the cap less a {margin:.0%} margin" if not replayed
            else f"the solvers hold the allocated peak to a cap less a {margin:.0%} margin, at caps raised until "
            "they admit every plan the replay admits, and the replay judges their plan")
    return f"peak: allocated; reserved: {how}; nccl: communicator buffers; the cap holds reserved + nccl, {rows}{warning}"



def host_line(stages) -> str:
    """Each stage's rank's host memory (offloaded optimizer and activations), and its share of
    the node's where --host-mem caps it."""
    cap = stages[0].predicted.host_cap_bytes
    each = ", ".join(f"{stage.index}: {format_bytes(stage.predicted.host_bytes)}" for stage in stages)
    return f"host memory per rank by stage: {each}" + (f" (each rank's share of --host-mem: {format_bytes(cap)})"
                                                      if cap is not None else " (not capped: give --host-mem)")


def print_plan(plan, out: Path) -> None:
    caps = plan.setup.pipeline.mem_caps_bytes
    cuda = any(stage.predicted.reserved_bytes is not None for stage in plan.stages)
    rows = [
        [
            str(stage.index),
            " + ".join(_layer_range(chunk) for chunk in stage.chunks or [stage.layers]),
            str(len(stage.layers)),
            _checkpointed(stage),
            format_bytes(stage.predicted.peak_bytes),
            *(reserved_columns(stage.predicted) if cuda else []),
            format_bytes(caps[stage.index]),
            _share(device_bytes(stage.predicted) / caps[stage.index], cuda),
            format_ms(stage.predicted.time_ms),
        ]
        for stage in plan.stages
    ]
    setup = plan.setup
    title = (f"ckplan plan: {setup.pipeline.stages} stages, {setup.pipeline.microbatches} microbatches × {setup.pipeline.micro_batch_size}, "
             f"{setup.pipeline.schedule}, {setup.training.optimizer} {setup.training.precision}{dp_words(setup)}, "
             f"scored for {setup.training.runtime}'s runtime"
             + (", whole-layer recompute only" if setup.training.recompute == "whole-layer" else ""))
    title += at_once_words(setup.pipeline.parallel_stages, setup.pipeline.stages)
    memory = ["peak", *(RESERVED_COLUMNS if cuda else []), "cap"]
    columns = ["stage", "layers", "#", "checkpointed", *memory, "peak / cap", "time/mb"]
    if narrow() or cuda:  # checkpointed layers as a count of the stage's, the bar as a percentage: 80
        # columns, or room for the reserved peak and NCCL's buffers
        columns = ["stage", "layers", "ckpt", *memory, "% cap", "time/mb"]
        rows = [[row[0], row[1], f"{len(stage.recompute)}/{row[2]}", *row[4:]]
                for row, stage in zip(rows, plan.stages)]
    console.print(table(title, columns, rows, right_from=2))
    if (narrow() or cuda) and any(set(stage.recompute.values()) - {"full"} for stage in plan.stages):
        for stage in plan.stages:  # the compact table counts them: say which options
            console.print(f"stage {stage.index} recomputes: {_checkpointed(stage) or 'nothing'}")
    if cuda:
        console.print(reserved_note(setup, [stage.predicted for stage in plan.stages]))
    if any(stage.predicted.host_bytes for stage in plan.stages):
        console.print(host_line(plan.stages))
    print_comparison(plan)
    solver = plan.solver
    gap = "" if solver.gap is None else f", gap {solver.gap:.2e}"
    console.print(f"solver: {solver.name}, {solver.status}{gap} in {solver.wall_s:.2f} s; plan written to {out}")
    for line in (replay_line(solver), cut_short(solver), unproven(plan)):
        if line is not None:
            console.print(line)


def replay_line(solver) -> str | None:
    """What the solver's status proves where the allocator replay judges the plan (planner/solve/replayfit.py)."""
    if solver.replay == "relaxed":
        return (f"the solver's rows admitted every plan the allocator replay admits (each stage's allocated peak up to "
                f"its cap less NCCL's buffers), and the plan they gave fits the replay: '{solver.status}' holds "
                "against the replay")
    if solver.replay == "cut":
        return (f"the solver's rows admitted every plan the allocator replay admits; {solver.solves - 1} of its plans "
                f"the replay put over, each stage's set over excluded and solved again, until this one fit: "
                f"'{solver.status}' holds against the replay, over the checkpoint sets the DP weighs (each range's "
                "undominated sets)")
    if solver.replay == "searched":
        said = ("the plan solved under rows that admit every plan the replay admits does not fit the replay; this is "
                f"the fastest that fits of {solver.solves} solves (the cuts', and the search's under caps between "
                "those rows and the caps given, or the plan that needs least), its gap against the highest of their "
                "bounds: a faster plan may fit")
        return said
    return None


def unproven(plan) -> str | None:
    """Why a plan is "feasible" with no gap where no --time-limit stopped it: a schedule of several stages a rank
    is solved on a linear bound of its time and its plan scored by the simulated schedule (search._checked_chunked),
    a time no bound covers; without this line it read as a solve cut short."""
    solver, pipeline = plan.solver, plan.setup.pipeline
    if solver.status != "feasible" or solver.gap is not None or solver.timed_out or pipeline.chunks < 2:
        return None
    return (f"feasible, not proven optimal: {pipeline.schedule} puts {pipeline.chunks} stages on a rank, which "
            "the MILP solves on a linear bound of the schedule's time and ckplan then scores by walking torch's "
            "action order; no bound covers that time, so no gap is given (the plan fits its caps either way)")


def cut_short(solver) -> str | None:
    """Where --time-limit stopped the solver before it finished, that it did; where it cut the search over caps,
    the rounds left and the limit that would let it finish (the time spent, and each round left at the mean of
    those made: a solve and its plan's replay)."""
    if solver.rounds_left and solver.round_s:
        needed = math.ceil(solver.wall_s + solver.rounds_left * solver.round_s)
        return (f"--time-limit ran out with at most {solver.rounds_left} of the search's solves under caps unmade, "
                f"{solver.round_s:.1f} s each here (a DP and the allocator's replay of every stage): --time-limit "
                f"{needed} lets it finish")
    if solver.timed_out:
        return (f"--time-limit ran out after {solver.wall_s:.1f} s, before the solver finished: this is the best plan "
                "it had then (a baseline where it had none faster); a longer --time-limit lets it finish and may "
                "find a faster plan")
    return None


def print_comparison(plan) -> None:
    full = next((b for b in plan.baselines if b.name == "full-ckpt"), None)
    reference = full.iteration_ms if full else None

    def speedup(ms: float) -> str:
        return f"{reference / ms:.2f}×" if reference else "—"

    rows = [["ckplan", "yes", format_ms(plan.predicted.iteration_ms), speedup(plan.predicted.iteration_ms),
             format_bytes(plan.predicted.peak_bytes_max)]]
    for b in plan.baselines:
        rows.append([b.name, "yes" if b.feasible else "[red]no[/]", format_ms(b.iteration_ms),
                     speedup(b.iteration_ms) if b.feasible else "—", format_bytes(max(b.peak_bytes_per_stage))])
    console.print(table("predicted iteration (same cost model for all)",
                        ["strategy", "fits", "iteration", "vs full ckpt", "max peak"], rows, right_from=2))


def throughput_of(profile, setup, iteration_ms: float):
    """Tokens per second per GPU and MFU of an iteration as torchtitan and Megatron-LM log them
    (planner/profiler/throughput.py); None where the profile records no sequence length."""
    from planner.profiler.throughput import profile_arch, throughput

    facts = profile.assumptions
    seq_len, peak = facts.get("seq_len"), facts.get("gpu_bf16_tflops")
    if not isinstance(seq_len, int) or not isinstance(peak, (int, float)):
        return None
    tp = int(facts.get("tp", 1) or 1)
    gpus = setup.pipeline.stages * setup.data_parallel.dp * tp
    # the setup's dp counts the context-parallel ranks, which share their replica's sequences
    tokens = (setup.pipeline.microbatches * setup.pipeline.micro_batch_size * seq_len * setup.data_parallel.dp
              // setup.training.context_parallel)
    return throughput(iteration_ms=iteration_ms, tokens_per_iteration=tokens, gpus=gpus, peak_tflops=float(peak),
                      arch=profile_arch(facts), seq_len=seq_len)


def throughput_line(found) -> str:
    """The figures in one sentence, as the frameworks' logs print them."""
    if found is None:
        return ("tokens/s and MFU: not known (the profile records no sequence length, or no GPU whose peak MFU is "
                "taken against: a model file's profile measured on the CPU)")
    line = f"as the frameworks log it, on {found.gpus} GPUs: {found.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"
    if found.torchtitan_mfu is not None:
        line += (f", torchtitan mfu {found.torchtitan_mfu:.1%}; Megatron-LM throughput "
                 f"{found.megatron_tflops_per_gpu:.1f} TFLOP/s/GPU ({found.megatron_mfu:.1%} of peak)")
    return line


def throughput_json(found) -> dict | None:
    return None if found is None else found.as_dict()
