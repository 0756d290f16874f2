"""A pipeline schedule's time: a discrete-event simulation of all ranks running torch's order
(planner/cost/schedules.py builds the order; this module reads it and is imported by name).

Time model (`simulate_time`). Every rank runs its list in order; an action starts when its
rank is free and its input is there: F of stage k needs F of stage k-1 (same microbatch), B or
I of stage k needs B or I of stage k+1 (the last stage: its own F), W its own I. Crossing
ranks adds `send_ms` (a latency: sends overlap compute); a V schedule's turn, two stages on one
rank, sends nothing. DualPipeV's overlapped F+B pair is one unit, as in torch's runtime
(without a custom overlap function): it receives both inputs first, runs its halves back to
back, and sends both outputs after. Sends are latencies: they never hold up a rank's compute.
A stage's gradient reductions that its runtime runs after its M-th backward (B or W; StageTimes
.reduce_ms, planner/cost/pipereduce.py) lengthen that action on its rank, and its send with it.

Lockstep (`simulate_lockstep`, where the runtime's record says multi_schedule_lockstep): torch
2.6.0's PipelineScheduleMulti runs a rank's list by torch's time steps (its pipeline_order, idle
steps included), and after each step's action waits for one batch of that step's p2p: its own
send (F to the next stage's rank, B or I to the previous one's) and the receives its neighbours'
actions of the same step send it. A send or receive completes once both ranks have queued it, each
after its own action of the step (both NCCL streams wait for their compute streams), so a rank
starts its next step only when it and every rank it exchanges with that step are done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the orders' types, for the annotations only
    from planner.cost.schedules import Action, Schedule


@dataclass(frozen=True)
class StageTimes:
    """One microbatch's compute on one stage (ms). A full backward B takes I + W."""

    forward_ms: float
    input_grad_ms: float
    weight_grad_ms: float
    reduce_ms: float = 0.0  # after the stage's M-th backward, on its rank, before its send (pipereduce.py)

    @property
    def backward_ms(self) -> float:
        return self.input_grad_ms + self.weight_grad_ms

    @property
    def busy_ms(self) -> float:
        return self.forward_ms + self.backward_ms

    def of(self, kind: str) -> float:
        return {"F": self.forward_ms, "B": self.backward_ms,
                "I": self.input_grad_ms, "W": self.weight_grad_ms}[kind]


@dataclass(frozen=True)
class Issue:
    """A collective a rank issues on its side stream (one FIFO stream a rank, beside its compute):
    `ms` long, issued when its action is due ("start", before the action waits), when the action
    ends ("end"), or a fraction of the action's time after it starts; `key`, if an action waits for it;
    `share`, the share of the GPU's SMs its CTAs hold while it runs (nccl_sms.collective_shares): the
    rank's compute beside it runs at 1 - share of its rate (nccl_sms.py's first order, §128)."""

    ms: float
    when: str | float = "end"
    key: object = None
    share: float = 0.0


@dataclass(frozen=True)
class SideStream:
    """The collectives a runtime runs beside the compute (planner/cost/megatron_dp.py): per rank
    those issued at the iteration's start (`opening`), per (rank, action index) those an action
    issues (`issues`), the keys it waits for before it starts (`waits`) and the time it runs longer
    (`extend_ms`, collectives waited for inside it). A rank ends when its compute and its stream do."""

    opening: tuple[tuple[Issue, ...], ...]
    issues: dict = field(default_factory=dict)
    waits: dict = field(default_factory=dict)
    extend_ms: dict = field(default_factory=dict)


class _Stream:
    """The side streams' clocks while a simulation runs."""

    def __init__(self, side: SideStream | None, num_ranks: int):
        self.side = side
        self.free_ms = [0.0] * num_ranks
        self.done: dict = {}
        self.slowing: list[list[tuple[float, float, float]]] = [[] for _ in range(num_ranks)]  # (from, to, share)
        for rank in range(num_ranks if side else 0):
            for issue in side.opening[rank]:
                self.put(rank, issue, 0.0)

    def put(self, rank: int, issue: Issue, at_ms: float) -> None:
        begin = max(self.free_ms[rank], at_ms)
        self.free_ms[rank] = begin + issue.ms
        if issue.share > 0 and issue.ms > 0:
            self.slowing[rank].append((begin, self.free_ms[rank], min(issue.share, 1.0)))
        if issue.key is not None:
            self.done[issue.key] = self.free_ms[rank]

    def run(self, rank: int, index: int, due_ms: float, base_ms: float) -> tuple[float, float]:
        """(start, duration) of the rank's action `index`, due at `due_ms`, `base_ms` long."""
        if self.side is None:
            return due_ms, base_ms
        issues = self.side.issues.get((rank, index), ())
        for issue in issues:
            if issue.when == "start":
                self.put(rank, issue, due_ms)
        start = max([due_ms] + [self.done.get(key, 0.0) for key in self.side.waits.get((rank, index), ())])
        work = base_ms + self.side.extend_ms.get((rank, index), 0.0)
        clock, done = start, 0.0
        for issue in sorted((i for i in issues if not isinstance(i.when, str)), key=lambda i: i.when):
            clock, done = self.advance(rank, clock, issue.when * work - done), issue.when * work
            self.put(rank, issue, clock)  # issued once that share of the action's work is done
        clock = self.advance(rank, clock, work - done)
        for issue in issues:
            if issue.when == "end":
                self.put(rank, issue, clock)
        return start, clock - start

    def advance(self, rank: int, at_ms: float, work_ms: float) -> float:
        """When the rank's compute, from `at_ms`, has done `work_ms` of work: at 1 - share of its rate while a
        collective of the rank's stream that takes a share of the SMs runs (the stream is FIFO: one at a time),
        at full rate otherwise; idle time costs nothing."""
        clock, work = at_ms, work_ms
        for begin, end, share in self.slowing[rank]:
            if end <= clock:
                continue
            if begin > clock:
                if clock + work <= begin:
                    return clock + work
                work, clock = work - (begin - clock), begin
            rate = 1.0 - share
            if rate > 0 and clock + work / rate <= end:
                return clock + work / rate
            work, clock = work - (end - clock) * rate, end
        return clock + work


@dataclass(frozen=True)
class Timeline:
    """When every action ran, and what that makes of the iteration."""

    makespan_ms: float
    busy_ms: tuple[float, ...]  # per rank
    start_ms: tuple[tuple[float, ...], ...]  # per rank, per action of Schedule.actions[rank]

    @property
    def bubble_fraction(self) -> tuple[float, ...]:
        """Per rank, the share of the iteration it idles."""
        return tuple(1.0 - busy / self.makespan_ms for busy in self.busy_ms)

    @property
    def mean_bubble_fraction(self) -> float:
        return 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * self.makespan_ms)


def simulate_time(
    schedule: Schedule, *, stage_times: Sequence[StageTimes], send_ms: float = 0.0,
    side: SideStream | None = None, stage_sends: Sequence[tuple[float, float]] | None = None,
) -> Timeline:
    """Run every rank's list in order; each unit (an action, or DualPipeV's overlapped F+B
    pair) starts once its rank is free and its inputs have arrived (`send_ms` after the
    producer finished, when the producer is another rank). As torch's runtime does, a pair
    receives both inputs before it starts, runs its halves back to back and sends after both.
    `side`: collectives on a stream beside each rank's compute, which an action may wait for.
    `stage_sends`, per stage: (its output's send, its input gradient's send), ms more a receiver on
    another rank waits (sends run beside the compute: planner/cost/stagesends.py); but a rank's warm-up
    forwards (warmup_forwards) wait for their output's send before the rank's next
    action, as Megatron-core's blocking warm-up sends do: the send holds the sender, and the receiver
    waits for nothing more (planner/cost/stagesends.py)."""
    stream = _Stream(side, schedule.num_ranks)
    finished: dict[tuple[int, str, int], float] = {}  # (stage, F|I|W, microbatch) -> ms
    backwards = [0] * schedule.num_stages  # B or W actions run per stage: the M-th reduces
    next_action = [0] * schedule.num_ranks
    free_ms = [0.0] * schedule.num_ranks
    starts: list[list[float]] = [[] for _ in range(schedule.num_ranks)]
    remaining = sum(len(actions) for actions in schedule.actions)
    warm = [warmup_forwards(schedule, rank) if stage_sends else 0 for rank in range(schedule.num_ranks)]
    held: set[tuple[int, int]] = set()  # (stage, microbatch): its output sent in the sender's warm-up
    while remaining:
        progressed = False
        for rank, actions in enumerate(schedule.actions):
            while next_action[rank] < len(actions):
                first = next_action[rank]
                unit = [a for a in actions[first:first + 2] if a.unit == actions[first].unit]
                ready = [_input_ready_ms(schedule, a, finished, send_ms, stage_sends, held) for a in unit]
                if None in ready:
                    break
                clock = max(free_ms[rank], *ready)
                for offset, a in enumerate(unit):
                    start, duration = stream.run(rank, first + offset, clock, stage_times[a.stage].of(a.kind))
                    starts[rank].append(start)
                    clock = start + duration
                    warm_send = a.kind == "F" and first + offset < warm[rank] and _crosses(schedule, a)
                    if warm_send and stage_sends[a.stage][0]:
                        clock += stage_sends[a.stage][0]  # a warm-up forward's send, waited at once
                        held.add((a.stage, a.microbatch))
                    if a.kind in ("B", "W"):
                        backwards[a.stage] += 1
                        if backwards[a.stage] == schedule.num_microbatches:
                            clock += stage_times[a.stage].reduce_ms
                free_ms[rank] = clock
                for a in unit:  # a pair's outputs leave together, after both halves
                    for done in {"F": "F", "B": "IW", "I": "I", "W": "W"}[a.kind]:
                        finished[(a.stage, done, a.microbatch)] = clock
                next_action[rank] += len(unit)
                remaining -= len(unit)
                progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule.name}: no rank can run its next action (deadlock)")
    ends = [max(free, side_free) for free, side_free in zip(free_ms, stream.free_ms)]
    return Timeline(max(ends), _busy(schedule, stage_times), tuple(tuple(s) for s in starts))


def simulate_lockstep(
    schedule: Schedule, *, stage_times: Sequence[StageTimes], send_ms: float = 0.0
) -> Timeline:
    """Run every rank's list by torch's time steps (Action.time_step), each step ending on a rank
    when its own action and those of the ranks it exchanges tensors with that step are done (plus
    `send_ms` where it exchanges any), as torch 2.6.0's PipelineScheduleMulti._step_microbatches
    waits each step's batched p2p (schedules.py 1236-1355). A stage's M-th backward (B or W) carries
    its reductions, as in simulate_time."""
    at = [{a.time_step: [] for a in actions} for actions in schedule.actions]
    for rank, actions in enumerate(schedule.actions):
        for index, a in enumerate(actions):
            at[rank][a.time_step].append(index)
    steps = max((a.time_step for actions in schedule.actions for a in actions), default=-1) + 1
    ready = [0.0] * schedule.num_ranks
    starts: list[list[float]] = [[0.0] * len(actions) for actions in schedule.actions]
    backwards = [0] * schedule.num_stages
    for step in range(steps):
        end = list(ready)
        for rank, actions in enumerate(schedule.actions):
            for index in at[rank].get(step, ()):
                a = actions[index]
                starts[rank][index] = end[rank]
                end[rank] += stage_times[a.stage].of(a.kind)
                if a.kind in ("B", "W"):
                    backwards[a.stage] += 1
                    if backwards[a.stage] == schedule.num_microbatches:
                        end[rank] += stage_times[a.stage].reduce_ms
        peers = _step_peers(schedule, at, step)
        ready = [max([end[rank]] + [max(end[rank], end[q]) + send_ms for q in peers[rank]])
                 for rank in range(schedule.num_ranks)]
    return Timeline(max(ready, default=0.0), _busy(schedule, stage_times), tuple(tuple(s) for s in starts))


def _busy(schedule: Schedule, stage_times: Sequence[StageTimes]) -> tuple[float, ...]:
    """Per rank, its actions' time and its stages' reductions after their last backward."""
    return tuple(sum(stage_times[a.stage].of(a.kind) for a in actions)
                 + sum(stage_times[s].reduce_ms for s in schedule.stages_of(rank))
                 for rank, actions in enumerate(schedule.actions))


def _step_peers(schedule: Schedule, at: list[dict], step: int) -> list[set[int]]:
    """Per rank, the ranks it sends to or receives from in time step `step`: an F sends its output
    to the next stage's rank, a B or I its input gradient to the previous stage's (W sends
    nothing); a pair exchanges both ways."""
    peers: list[set[int]] = [set() for _ in range(schedule.num_ranks)]
    for rank, actions in enumerate(schedule.actions):
        for index in at[rank].get(step, ()):
            a = actions[index]
            to = a.stage + 1 if a.kind == "F" else a.stage - 1 if a.kind in ("B", "I") else None
            if to is None or not 0 <= to < schedule.num_stages or schedule.stage_to_rank[to] == rank:
                continue
            peers[rank].add(schedule.stage_to_rank[to])
            peers[schedule.stage_to_rank[to]].add(rank)
    return peers


def makespan_ms(schedule: Schedule, *, stage_times: Sequence[StageTimes], lockstep: bool = False,
                stage_sends: Sequence[tuple[float, float]] | None = None) -> float:
    """The iteration's compute, every rank's list run: the simulation (simulate_time); for a
    schedule without actions (pipeline_schedule: 1F1B, GPipe) the closed form the solvers
    optimise, fill and drain (every stage once) plus M - 1 steady steps of the slowest stage,
    plus every stage's reductions after its last backward: the drain runs the last microbatch's
    backward from the last stage to the first, each stage's waiting on the one after's send
    (exact for equal stages: tests/test_pipereduce.py holds it to the simulation). `lockstep`: a
    schedule of several stages a rank runs in torch 2.6.0's time steps (simulate_lockstep). `stage_sends`:
    simulate_time's."""
    if schedule.actions and lockstep and schedule.several_stages_a_rank:
        return simulate_lockstep(schedule, stage_times=stage_times).makespan_ms
    if schedule.actions:
        return simulate_time(schedule, stage_times=stage_times, stage_sends=stage_sends).makespan_ms
    busy = [times.busy_ms for times in stage_times]
    drain = sum(times.reduce_ms for times in stage_times)
    return sum(busy) + (schedule.num_microbatches - 1) * max(busy) + drain


def warmup_forwards(schedule: Schedule, rank: int) -> int:
    """How many of a rank's first actions are its warm-up's forwards: Megatron-core's count for its
    interleaved schedule, (P - rank - 1) x 2 + (V - 1) x P of its M x V forwards, at most all of them
    (schedules.py get_pp_rank_microbatches, 955-978 at d98e8a64, 728-751 at 92c8482e; the group of
    microbatches a chunk runs at a time, microbatch_group_size_per_vp_stage, P by default:
    model_parallel_config.py 400-401 at 92c8482e). Torch's interleaved order runs the same forwards
    first (tests/test_stagesends.py); its first backward follows one forward more, the steady state's."""
    p, v = schedule.num_ranks, schedule.num_chunks
    if v == 1:
        return 0  # one stage a rank: no overlap_p2p_comm (stagesends.py), every send in the passes
    return min((p - rank - 1) * 2 + (v - 1) * p, schedule.num_microbatches * v)


def _crosses(schedule: Schedule, a: Action) -> bool:
    """Whether a forward's output goes to another rank."""
    after = a.stage + 1
    return after < schedule.num_stages and schedule.stage_to_rank[after] != schedule.stage_to_rank[a.stage]


def _input_ready_ms(schedule: Schedule, a: Action, finished: dict, send_ms: float,
                    stage_sends: Sequence[tuple[float, float]] | None = None,
                    held: set | frozenset = frozenset()) -> float | None:
    """When the input of `a` is on its rank, or None while its producer has not run."""
    if a.kind == "F":
        producer = (a.stage - 1, "F") if a.stage > 0 else None
    elif a.kind == "W":
        producer = (a.stage, "I")
    elif a.stage == schedule.num_stages - 1:
        producer = (a.stage, "F")  # the loss's gradient
    else:
        producer = (a.stage + 1, "I")
    if producer is None:
        return 0.0
    done = finished.get((producer[0], producer[1], a.microbatch))
    if done is None:
        return None
    crosses = schedule.stage_to_rank[producer[0]] != schedule.stage_to_rank[a.stage]
    if not crosses:
        return done
    if producer[1] == "F" and (producer[0], a.microbatch) in held:
        return done + send_ms  # the sender waited for its send: done is after it
    beside = stage_sends[producer[0]][0 if producer[1] == "F" else 1] if stage_sends else 0.0
    return done + send_ms + beside
