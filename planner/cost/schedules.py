"""Pipeline schedules as torch builds them: per-rank action lists, the activations each rank
holds at its peak, and the time the schedule takes.

Pure: no process group, no real stages. `build_schedule` asks torch's own schedule classes
(`torch.distributed.pipelining.schedules`) for the order every rank runs, the way torch's
`_schedule_visualizer.get_schedule_ops` does: a schedule constructor computes
`pipeline_order` (rank -> actions) for all ranks from `num_stages`, `group_size` and the
microbatch count alone, so stand-in stages carrying those numbers are enough.

Names: P ranks, V chunks per rank (P·V stages), M microbatches. A chunk is a rank's local
stage, numbered as torch numbers them (a rank's stages in increasing order):

    placement  stage of (rank r, chunk c)        schedules
    loop       c·P + r                           1F1B, GPipe (V = 1), interleaved-1F1B, ZB
    v          c = 0: r;  c = 1: 2P - 1 - r      ZBV, DualPipeV (V = 2)

Memory model (`peak_in_flight`). Walking a rank's actions in order: F of (chunk, mb) makes
that microbatch's activations of the chunk live; a full backward B frees them. A split
backward frees in two parts: I (input gradient) frees the activations the weight gradient
does not need, W frees the rest (the inputs of the weight-holding ops, which torch's
`stage_backward_input` keeps for `stage_backward_weight`). So each chunk has two counts:

    activations          microbatches past F, before I or B      (hold everything)
    weight_grad_inputs   microbatches past F, before W or B      (hold what W needs; >= the above)

A rank's live bytes after each action are sum_c activations_c · freed_at_input_grad_c +
weight_grad_inputs_c · kept_for_weight_grad_c, plus what its sends hold: torch's runtime for
several stages per rank (`_PipelineScheduleRuntime`) waits for its sends only when the step
ends, and a send holds its tensor until then (a V's turn hands the tensor to the other stage's
receive buffer, where it stays as long), so a microbatch's output stays from its B or W on and
its input gradient from its B or I on (sent_output_c, sent_input_grad_c per such microbatch); a
split backward's I leaves the gradients its W reads (held_for_weight_grad_c · microbatches
between I and W). The peak is after an action or during a backward pass (B, I or W, whose
weight pass recomputes a checkpointed region again), that pass's transient on top of the counts
before it.

Time model: planner/cost/schedule_time.py (`simulate_time`, `makespan_ms`), which reads these orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import SimpleNamespace

from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

from planner.errors import UserError

SCHEDULES = ("1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV", "DualPipeV")

# torch's class for each schedule: the runtime runs them; build_schedule asks them for their
# order, but 1F1B's, which is written here (see _one_f_one_b_order).
TORCH_CLASSES = {
    "1F1B": torch_schedules.Schedule1F1B,
    "GPipe": torch_schedules.ScheduleGPipe,
    "interleaved-1F1B": torch_schedules.ScheduleInterleaved1F1B,
    "ZB": torch_schedules.ScheduleInterleavedZeroBubble,
    "ZBV": torch_schedules.ScheduleZBVZeroBubble,
    "DualPipeV": torch_schedules.ScheduleDualPipeV,
}
_V_PLACED = ("ZBV", "DualPipeV")
_COMPUTE_KINDS = ("F", "B", "I", "W")
_BACKWARDS = ("B", "I", "W")  # passes with a transient (W's: ChunkBytes.weight_pass_transient)


@dataclass(frozen=True)
class Action:
    """One compute action of a rank: kind F (forward), B (full backward), I (input gradient)
    or W (weight gradient) of one microbatch on one stage (the rank's chunk `chunk`)."""

    stage: int
    chunk: int
    kind: str
    microbatch: int
    unit: int  # torch's action it is part of: DualPipeV's overlapped F+B is one unit of two
    time_step: int = field(default=-1, compare=False)  # its index in torch's pipeline_order (-1: not built from it)


@dataclass(frozen=True)
class Schedule:
    """A schedule's order: what each rank computes, in the order it computes it."""

    name: str
    num_ranks: int
    num_chunks: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]  # per rank

    @property
    def num_stages(self) -> int:
        return self.num_ranks * self.num_chunks

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The rank's stages, chunk 0 first."""
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    @property
    def splits_backward(self) -> bool:
        """Whether the order runs a backward as two passes, I (input gradient) then W (weight gradient)."""
        return any(a.kind == "I" for actions in self.actions for a in actions)

    @property
    def holds_sends(self) -> bool:
        """Whether a send holds its tensor until the step ends (ChunkBytes.sent_output): torch's
        runtime for several stages per rank (PipelineScheduleMulti) waits for its sends only then;
        a single-stage schedule waits for each before its next action."""
        return self.several_stages_a_rank

    @property
    def several_stages_a_rank(self) -> bool:
        """Whether torch runs it as a PipelineScheduleMulti (every schedule but 1F1B and GPipe):
        at torch 2.6.0 in time steps, each step's sends and receives waited before the next
        (schedule_time.simulate_lockstep)."""
        return not issubclass(TORCH_CLASSES[self.name], torch_schedules.PipelineScheduleSingle)


def one_chunk_in_flight(name: str, *, num_ranks: int, num_microbatches: int, rank: int) -> int:
    """1F1B's and GPipe's in-flight microbatches at rank `rank`'s peak, in closed form (the count
    peak_in_flight reads off their order; tests/test_schedules.py holds the two equal): GPipe
    all M, 1F1B its warm-up's min(P - r, M)."""
    return num_microbatches if name == "GPipe" else min(num_ranks - rank, num_microbatches)


def closed_form(name: str, num_chunks: int) -> bool:
    """Whether the cost model reads the schedule in closed form (one_chunk_in_flight, makespan_ms)
    rather than walking its actions: 1F1B and GPipe, one stage per rank."""
    return num_chunks == 1 and name in ("1F1B", "GPipe")


@lru_cache(maxsize=256)
def pipeline_schedule(name: str, *, num_ranks: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """The schedule as the cost model reads it. A schedule of one stage per rank (1F1B, GPipe)
    answers its counts (one_chunk_in_flight) and its time (makespan_ms) in closed form, so its
    Schedule carries no actions (a solve of thousands of microbatches never walks them; 1F1B
    with fewer microbatches than stages, which torch refuses, still scores); build_schedule
    gives them where they are wanted."""
    if closed_form(name, num_chunks):
        return Schedule(name, num_ranks, 1, num_microbatches, tuple(range(num_ranks)), ())
    return build_schedule(name, num_ranks=num_ranks, num_microbatches=num_microbatches, num_chunks=num_chunks)


@lru_cache(maxsize=256)  # torch's constructors take ~1 s at P = 32; a Schedule is immutable
def build_schedule(
    name: str, *, num_ranks: int, num_microbatches: int, num_chunks: int | None = None
) -> Schedule:
    """The order torch runs `name` in with `num_ranks` ranks, `num_chunks` stages per rank
    (default: 1 for 1F1B and GPipe, 2 otherwise) and `num_microbatches` microbatches."""
    if num_chunks is None:
        num_chunks = 1 if name in ("1F1B", "GPipe") else 2
    _check(name, num_ranks=num_ranks, num_chunks=num_chunks, num_microbatches=num_microbatches)
    placement = "v" if name in _V_PLACED else "loop"
    stage_map = generate_stage_to_rank_mapping(num_ranks, num_ranks * num_chunks, style=placement)
    stage_to_rank = tuple(stage_map[s] for s in range(num_ranks * num_chunks))
    if name == "1F1B":
        order = _one_f_one_b_order(num_ranks, num_microbatches)
    else:
        order = _torch_order(name, num_ranks=num_ranks, num_chunks=num_chunks,
                             num_microbatches=num_microbatches)
    # a rank's chunks are its stages in increasing order
    chunk_of = {s: sum(stage_to_rank[t] == stage_to_rank[s] for t in range(s))
                for s in range(len(stage_to_rank))}
    actions = tuple(
        tuple(Action(a.stage_index, chunk_of[a.stage_index], a.computation_type.value,
                     a.microbatch_index, unit, step)
              for unit, step, a in _compute_actions(order[rank]))
        for rank in range(num_ranks)
    )
    return Schedule(name, num_ranks, num_chunks, num_microbatches, stage_to_rank, actions)


def _check(name: str, *, num_ranks: int, num_chunks: int, num_microbatches: int) -> None:
    """Refuse what torch's constructors refuse (and the chunk counts a schedule has no use for)."""
    P, V, M = num_ranks, num_chunks, num_microbatches
    if name not in SCHEDULES:
        raise UserError(f"Unknown pipeline schedule {name!r}: choose one of "
                        f"{', '.join(SCHEDULES)}.")
    if min(P, V, M) < 1:
        raise UserError(f"{name} needs at least one rank, chunk and microbatch, not P={P}, "
                        f"V={V}, M={M}.")
    if name in ("1F1B", "GPipe") and V != 1:
        raise UserError(f"{name} runs one stage per rank, not {V}: use interleaved-1F1B or ZB "
                        "for more.")
    if name in _V_PLACED and V != 2:
        raise UserError(f"{name} runs exactly two chunks per rank (a V), not {V}.")
    if name in ("interleaved-1F1B", "ZB") and M % max(1, M // P) != 0:
        raise UserError(f"{name} needs the {M} microbatches to be a multiple of its {M // P} "
                        f"rounds (max(1, M // P), torch): try {M // P * P} or {(M // P + 1) * P}.")
    stages = 2 * P if name == "DualPipeV" else P
    if name in ("1F1B", "DualPipeV") and M < stages:
        raise UserError(f"{name} needs at least as many microbatches as stages (torch): "
                        f"{M} < {stages}.")


def _torch_order(name: str, *, num_ranks: int, num_chunks: int, num_microbatches: int) -> dict:
    """torch's `pipeline_order` for all ranks. The constructors read only these attributes of
    a stage (and `submod`, for their torch.compile check), and set stage_index_to_group_rank."""
    stages = [SimpleNamespace(num_stages=num_ranks * num_chunks, group_size=num_ranks,
                              group_rank=0, submod=None)
              for _ in range(num_chunks)]
    cls = TORCH_CLASSES[name]
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
    try:
        return cls(stages[0] if single else stages, num_microbatches).pipeline_order
    except ValueError as exc:  # a check this torch has and _check does not know yet
        raise UserError(f"torch refuses {name} with P={num_ranks}, V={num_chunks}, "
                        f"M={num_microbatches}: {exc}") from exc


def _compute_actions(rank_order: list) -> list:
    """(unit, time step, action) for the compute actions in run order: idle steps (None) and
    REDUCE_GRAD dropped, an overlapped F+B pair (DualPipeV) as its two halves sharing one unit;
    the time step is the action's index in torch's list."""
    units = [(step, a) for step, a in enumerate(rank_order)
             if a is not None and (a.sub_actions or a.computation_type.value in _COMPUTE_KINDS)]
    return [(unit, step, sub) for unit, (step, a) in enumerate(units)
            for sub in (a.sub_actions or (a,))]


def _one_f_one_b_order(num_ranks: int, num_microbatches: int) -> dict:
    """The order `Schedule1F1B._step_microbatches` runs: min(M, P - r) forwards, then one
    backward and one forward until the forwards are done, then the remaining backwards.
    Written here because Schedule1F1B's `pipeline_order` (which only torch's visualiser reads)
    numbers the last rank's forwards 1..M instead of 0..M-1; see tests/test_schedules.py."""
    F, B = torch_schedules.FORWARD, torch_schedules.FULL_BACKWARD
    order = {}
    for rank in range(num_ranks):
        warmup = min(num_microbatches, num_ranks - rank)
        ops = [torch_schedules._Action(rank, F, mb) for mb in range(warmup)]
        for mb in range(num_microbatches):
            ops.append(torch_schedules._Action(rank, B, mb))
            if warmup + mb < num_microbatches:
                ops.append(torch_schedules._Action(rank, F, warmup + mb))
        order[rank] = ops
    return order


# ---------------------------------------------------------------------------------------------
# Memory: in-flight microbatches per chunk at each rank's peak


@dataclass(frozen=True)
class ChunkBytes:
    """What one microbatch of one stage keeps, by when it is freed (bytes, or any unit)."""

    freed_at_input_grad: float = 1.0  # activations I (or B) frees: W does not need them
    kept_for_weight_grad: float = 0.0  # what W still needs (freed at W, or at B)
    # held until the step ends (torch's runtime for several stages per rank waits its sends only
    # then, and a V's turn leaves the tensor handed over in the receiving stage's buffer): the
    # output from its B or W on (before, it is among the activations above), the input gradient
    # from its B or I on
    sent_output: float = 0.0
    sent_input_grad: float = 0.0
    held_for_weight_grad: float = 0.0  # made by I, freed by W: the gradients the weight pass reads
    transient: float = 0.0  # held over the live bytes while the chunk's B runs (its recompute)
    input_pass_transient: float = 0.0  # ... while its I runs
    weight_pass_transient: float = 0.0  # ... while its W runs (recomputing checkpointed regions again)
    # the whole gradients a runtime allocates at the chunk's first backward (B or I) and frees
    # after its last (B or W), its reduce-scatter (planner/cost/gradtiming.py): counted while held
    late_grad: float = 0.0


@dataclass(frozen=True)
class ChunkInFlight:
    """One chunk's live microbatches at its rank's peak."""

    chunk: int
    stage: int
    activations: int  # past F, before I or B
    weight_grad_inputs: int  # past F, before W or B


@dataclass(frozen=True)
class RankPeak:
    """A rank at the action after which it holds the most (the first such action)."""

    rank: int
    step: int  # index into Schedule.actions[rank]
    live: float  # sum over chunks of the counts times their ChunkBytes, the transient included
    chunks: tuple[ChunkInFlight, ...]
    transient: float = 0.0  # of the chunk whose backward runs at the peak (counts before it); 0: after the action
    late_grads: float = 0.0  # the chunks' late gradients (ChunkBytes.late_grad) held at the peak, among `live`

    @property
    def activations(self) -> int:
        return sum(c.activations for c in self.chunks)

    @property
    def weight_grad_inputs(self) -> int:
        return sum(c.weight_grad_inputs for c in self.chunks)


def rank_peak(schedule: Schedule, rank: int, *, stage_bytes: Mapping[int, ChunkBytes] | Sequence[ChunkBytes]) -> RankPeak:
    """The rank's peak (peak_in_flight; `stage_bytes` by stage, the rank's own read); a schedule
    without actions (pipeline_schedule: 1F1B, GPipe) in closed form, its one chunk's in-flight
    microbatches all live as its backward starts."""
    if schedule.actions:
        return _rank_peak(schedule, rank, stage_bytes)
    held = stage_bytes[rank]
    k = one_chunk_in_flight(schedule.name, num_ranks=schedule.num_ranks, num_microbatches=schedule.num_microbatches,
                            rank=rank)
    live = k * (held.freed_at_input_grad + held.kept_for_weight_grad) + held.transient
    return RankPeak(rank, -1, live, (ChunkInFlight(0, rank, k, k),), held.transient)


def peak_in_flight(
    schedule: Schedule, *, stage_bytes: Sequence[ChunkBytes] | None = None
) -> tuple[RankPeak, ...]:
    """Per rank, the step where its live activations (weighted by `stage_bytes`, one per
    stage; default 1 freed at I and 0 kept for W) are highest, and each chunk's counts there."""
    stage_bytes = stage_bytes or [ChunkBytes()] * schedule.num_stages
    return tuple(_rank_peak(schedule, rank, stage_bytes) for rank in range(schedule.num_ranks))


def live_counts(schedule: Schedule, rank: int, *, until_weight_grad: bool) -> list[tuple[int, ...]]:
    """Every distinct vector of per-chunk counts the rank passes through after an action, in
    order of first appearance: for each chunk, the microbatches live (past F and before I or B;
    with `until_weight_grad`, before W or B), then for each chunk the microbatches past B or W
    (whose output stays: ChunkBytes.sent_output), then past B or I (whose input gradient stays:
    sent_input_grad), then past I and before W (held_for_weight_grad), then 1 where the chunk holds
    its late gradients (late_grad: from its first B or I to its last B or W, that one included). A rank's peak for any
    chunk bytes is the largest of these vectors' weighted sums or of backward_moments', so a
    solver can bound it by one linear row each."""
    return list(dict.fromkeys(vector for vector, *_ in _moments(schedule, rank, until_weight_grad)[1]))


def backward_moments(schedule: Schedule, rank: int, *,
                     until_weight_grad: bool) -> list[tuple[tuple[int, ...], int, str]]:
    """Every distinct (vector, chunk, kind) where the chunk's B, I or W starts: the counts as
    live_counts gives them, before that pass frees anything, when the chunk's transient of that
    pass (ChunkBytes.transient, input_pass_transient, weight_pass_transient) adds to them."""
    return list(dict.fromkeys(_moments(schedule, rank, until_weight_grad)[0]))


@dataclass(frozen=True)
class _Counts:
    """Per chunk of a rank: microbatches past F and before I or B (acts), before W or B
    (wgrad), past B or W (outputs: their output stays), past B or I (grads: their input
    gradient stays). wgrad - acts is the microbatches past I and before W."""

    acts: tuple[int, ...]
    wgrad: tuple[int, ...]
    outputs: tuple[int, ...]
    grads: tuple[int, ...]
    late: tuple[int, ...]  # 1 where the chunk holds its late gradients (ChunkBytes.late_grad)

    def vector(self, until_weight_grad: bool) -> tuple[int, ...]:
        """live_counts' vector: live, outputs, grads, past I before W, late gradients held."""
        live = self.wgrad if until_weight_grad else self.acts
        return (*live, *self.outputs, *self.grads, *(w - a for w, a in zip(self.wgrad, self.acts)), *self.late)


def _walk(schedule: Schedule, rank: int) -> list[tuple[int, Action, _Counts, _Counts]]:
    """The rank's actions in order, each with (step, action, counts before it, counts after it)."""
    chunks = len(schedule.stages_of(rank))
    acts, wgrad, outputs, grads = ([0] * chunks for _ in range(4))
    walked = []
    for step, a in enumerate(schedule.actions[rank]):
        # late gradients: made by the chunk's first B or I, freed after its last B or W (the
        # reduce-scatter that follows it: gradtiming), so held still as that last one ends
        held = [int(g > 0 and o < schedule.num_microbatches) for g, o in zip(grads, outputs)]
        before = _Counts(tuple(acts), tuple(wgrad), tuple(outputs), tuple(grads), tuple(held))
        acts[a.chunk] += {"F": 1, "B": -1, "I": -1}.get(a.kind, 0)
        wgrad[a.chunk] += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
        outputs[a.chunk] += a.kind in ("B", "W")
        grads[a.chunk] += a.kind in ("B", "I")
        held[a.chunk] |= a.kind in ("B", "I")
        walked.append((step, a, before, _Counts(tuple(acts), tuple(wgrad), tuple(outputs), tuple(grads), tuple(held))))
    assert acts == [0] * chunks and wgrad == [0] * chunks, "unbalanced schedule"
    return walked


def _moments(schedule: Schedule, rank: int, until_weight_grad: bool) -> tuple[list, list]:
    walked = _walk(schedule, rank)
    before = [(counts.vector(until_weight_grad), a.chunk, a.kind) for _, a, counts, _ in walked if a.kind in _BACKWARDS]
    after = [(counts.vector(until_weight_grad), None, None) for *_, counts in walked]
    return before, after


def _rank_peak(schedule: Schedule, rank: int, stage_bytes: Sequence[ChunkBytes]) -> RankPeak:
    stages = schedule.stages_of(rank)
    mine = [stage_bytes[s] for s in stages]

    def live(counts: _Counts) -> float:
        return sum(counts.acts[c] * b.freed_at_input_grad + counts.wgrad[c] * b.kept_for_weight_grad
                   + counts.outputs[c] * b.sent_output + counts.grads[c] * b.sent_input_grad
                   + (counts.wgrad[c] - counts.acts[c]) * b.held_for_weight_grad + counts.late[c] * b.late_grad
                   for c, b in enumerate(mine))

    best = None
    for step, a, before, after in _walk(schedule, rank):
        held = stage_bytes[a.stage]
        extra = {"B": held.transient, "I": held.input_pass_transient, "W": held.weight_pass_transient}.get(a.kind, 0)
        # during a backward pass, its transient on top of the counts before it frees anything; then after it
        for counts, transient in ([(before, extra)] if extra else []) + [(after, 0.0)]:
            total = live(counts) + transient
            if best is None or total > best.live:
                chunks = tuple(ChunkInFlight(c, s, counts.acts[c], counts.wgrad[c]) for c, s in enumerate(stages))
                late = sum(counts.late[c] * b.late_grad for c, b in enumerate(mine))
                best = RankPeak(rank, step, total, chunks, transient, late)
    return best
