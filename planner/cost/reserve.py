"""A stage's reserved peak on cuda from the caching allocator's replay (allocator.replay) of its
steady-state step: the allocations and frees each layer's profile recorded (schema.AllocRecord,
per recompute option), in the order the schedule runs the stage's passes, after the memory the
runtime allocates first.

The step as ckplan's runtime runs it (planner/runtime/replay.py, stagemodule.py):
- static first: each parameter's weight, then its gradient (allocate_grads), the receive
  buffers, then the optimizer state (created at the first step), per parameter;
- the rank's actions in torch's order (schedules.build_schedule: 1F1B's warm-up forwards, then
  one backward and one forward, then the cool-down backwards; GPipe's forwards then backwards),
  1F1B over its warm-up and two steady pairs only (replayed_microbatches);
- a forward runs its layers in order, each its recorded forward; a layer's input (the previous
  layer's output) is freed after that layer's forward unless the layer keeps it (it saves its
  input, or recomputes or offloads from it), else after its backward; the stage's output waits
  for its backward (fwd_cache); the last stage's loss follows its last layer;
- a backward runs the loss's, then the layers' recorded backwards in reverse; each frees the
  gradient it received, and what its forward left (saved tensors the record did not see freed);
- offload (planner/runtime/recompute.py, offloaded_activations): the forward's saved storages
  are copied out on a copy stream with record_stream, so their blocks are cached again only
  once the copy completes. Timed (the host link: --host-bandwidth or the GPU's PCIe figure), each
  copy out is issued as its tensor is saved (the forward's time spread evenly over its events),
  runs on one stream in issue order at that rate, and its block is cached once the compute
  reaches its end; untimed, what the code guarantees
  is that it is done when the layer's backward starts (the copy back waits for it, the compute
  waits for the copy back), and that copies complete in the order issued (one stream). The
  replay holds each block until then: an upper bound on the reserve. The copies back are
  allocated on the compute stream as the backward reaches the layer;
- the optimizer step's scratch (foreach: every parameter's at once), then freed.

Nothing here reads a file or prints; it runs once per stage of an evaluated plan, never per
solver node (the solvers constrain the allocated peak; see costmodel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from planner.cost import allocator, dataparallel, gpipeheld
from planner.cost.allocator import Alloc, Event, Free, Ready, Replayed
from planner.cost.fsdp2_layers import replayed_microbatches  # shared by both replays
from planner.errors import UserError
from planner.schema import (
    OPTION_NONE,
    OPTION_OFFLOAD,
    AllocRecord,
    LayerProfile,
    Profile,
    TrainSetup,
)


@dataclass(frozen=True)
class StageMemory:
    """What the replay needs of a stage beyond its layers: the cost model's totals."""

    static_bytes: int
    buffer_bytes: int
    scratch_bytes: int
    # of buffer_bytes, the stage output a 1F1B warm-up send keeps (warmupsend.py): a block of its own, not spread
    # over the receive buffers (4 x 1 MiB + 1 MiB spread made 4 x 1.25 MiB, from a large segment, not small ones)
    held_send_bytes: int = 0


def plan_records(plan, profile, names: Sequence[str] | None = None):
    """(layers, options, records) of the plan's layers (or `names`, a chunk's) in `profile`: each layer's profile, its
    option and its record for it (records None where a layer has none: records_for)."""
    by_name = {layer.name: layer for layer in profile.layers}
    names = plan.layers if names is None else names
    layers = [by_name[name] for name in names]
    options = [plan.option(name) for name in names]
    return layers, options, records_for(layers, options)


def records_for(layers: Sequence[LayerProfile], options: Sequence[str]) -> list[AllocRecord] | None:
    """Each layer's record for its option (offload: none's, its copies added by the replay);
    None where a layer has none for it (profiles without records: the divisor stays)."""
    found = []
    for layer, option in zip(layers, options, strict=True):
        record = layer.alloc_records.get(OPTION_NONE if option == OPTION_OFFLOAD else option)
        if record is None:
            return None
        found.append(record)
    return found


def stage_events(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord], *,
                 actions: Sequence[tuple[str, int]], memory: StageMemory, num_microbatches: int,
                 loss: AllocRecord | None, copy_ms_per_byte: float | None = None,
                 keeps: Sequence[bool] | None = None, sends_held: bool = False) -> list[Event]:
    """The stage's step as allocator events: static, then `actions` ((F|B, microbatch), in run
    order), then the optimizer step. `loss`: the last stage's loss record, else None.
    `copy_ms_per_byte`: offload's copies timed at this rate against the layers' fwd_ms and
    bwd_ms; None: each saved block held until its layer's backward (an upper bound). `keeps`: whether each layer
    holds its input to its backward (None: _keeps_input of each). `sends_held`: each input gradient sent is held by
    its send to the end of the actions (GPipe: gpipeheld.sends_held). Of a layer only fwd_ms and bwd_ms are read here."""
    events = _static_events(records, memory, num_microbatches)
    step = _Step(layers, options, records, loss, events, copy_ms_per_byte, keeps, sends_held=sends_held)
    for kind, mb in actions:
        step.forward(mb) if kind == "F" else step.backward(mb)
    events += [Free(key) for key in step.sent or ()]  # GPipe's bwd_sends_to_wait, waited after the last backward
    events += _scratch_events(records, memory.scratch_bytes)
    return events


def replay_stage(layers: Sequence[LayerProfile], options: Sequence[str], *, stage: int, setup: TrainSetup,
                 memory: StageMemory, loss: AllocRecord | None, copy_ms_per_byte: float | None = None,
                 expandable: bool = False, cap_bytes: int | None = None) -> Replayed | None:
    """The caching allocator's peaks over the stage's step (`expandable`: under expandable segments; `cap_bytes`:
    the bytes it may reserve, None: no cap); None
    where the layers carry no records or the schedule runs several chunks per rank (not replayed yet).
    A pure function of what the step's events are made from (_StageInputs): a stage whose inputs equal one
    replayed before gets that replay's result (the solvers score many plans that share a stage)."""
    inputs = _stage_inputs(layers, options, stage=stage, setup=setup, memory=memory, loss=loss,
                           copy_ms_per_byte=copy_ms_per_byte)
    if inputs is None:
        return None
    key = (inputs, expandable, cap_bytes)
    found = _REPLAYED.get(key)
    if found is None:
        found = _remember(_REPLAYED, key, allocator.replay(_events_of(inputs), expandable=expandable,
                                                           cap_bytes=cap_bytes))
    return found


def held_bytes(layers: Sequence[LayerProfile], options: Sequence[str], *, stage: int, setup: TrainSetup,
               memory: StageMemory, loss: AllocRecord | None, copy_ms_per_byte: float | None = None) -> int | None:
    """The most bytes the stage's step holds live at once, each request rounded as the allocator rounds it
    (allocator.held_peak): a floor under its reserved peak under any cap (replay_stage's arguments; None where it
    replays none)."""
    inputs = _stage_inputs(layers, options, stage=stage, setup=setup, memory=memory, loss=loss,
                           copy_ms_per_byte=copy_ms_per_byte)
    if inputs is None:
        return None
    found = _HELD.get(inputs)
    if found is None:
        found = _remember(_HELD, inputs, allocator.held_peak(_events_of(inputs)))
    return found


class _StageInputs(NamedTuple):
    """Everything stage_events reads, as values: equal inputs make equal events. `records` (the layers' records
    for their options) and `loss` are compared by their content (`contents`), the rest as they are."""

    records: tuple[AllocRecord, ...]
    loss: AllocRecord | None
    contents: tuple  # each record's content, then the loss's (None: none)
    options: tuple[str, ...]
    times: tuple[tuple[float, float], ...]  # each layer's (fwd_ms, bwd_ms): offload's copies are timed by them
    keeps: tuple[bool, ...]  # each layer's _keeps_input
    actions: tuple[tuple[str, int], ...]
    memory: StageMemory
    num_microbatches: int
    copy_ms_per_byte: float | None
    sends_held: bool  # gpipeheld.sends_held

    def _key(self) -> tuple:
        return self[2:]

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other) -> bool:
        return isinstance(other, _StageInputs) and self._key() == other._key()

    def __ne__(self, other) -> bool:
        return not self == other


# Replays already made, by their inputs (_StageInputs, expandable, cap), and the held floors: a solve scores a few
# hundred plans, and each entry is a few thousand small ints of records; past _REMEMBERED the oldest go first.
_REMEMBERED = 2048
_REPLAYED: dict = {}
_HELD: dict = {}
_EVENTS: dict = {}  # the last stage's events: its replay under a cap (capped_reserve) follows the one without


def _remember(memo: dict, key, value):
    if len(memo) >= _REMEMBERED:
        del memo[next(iter(memo))]
    memo[key] = value
    return value


def _record_content(record: AllocRecord | None) -> tuple | None:
    if record is None:
        return None
    return (tuple(record.forward), tuple(record.backward), record.output, record.input_grad, tuple(record.params))


def _stage_inputs(layers: Sequence[LayerProfile], options: Sequence[str], *, stage: int, setup: TrainSetup,
                  memory: StageMemory, loss: AllocRecord | None, copy_ms_per_byte: float | None) -> _StageInputs | None:
    """What replay_stage's events are made from; None where it replays none."""
    from planner.cost.schedules import build_schedule  # torch's pipelining: only when replaying

    records = records_for(layers, options)
    pipeline = setup.pipeline
    if records is None or pipeline.chunks != 1 or (stage == pipeline.stages - 1 and loss is None):
        return None
    order = build_schedule(pipeline.schedule, num_ranks=pipeline.stages,
                           num_microbatches=replayed_microbatches(pipeline, stage))
    loss = loss if stage == pipeline.stages - 1 else None
    return _StageInputs(
        records=tuple(records), loss=loss, contents=(*map(_record_content, records), _record_content(loss)),
        options=tuple(options), times=tuple((layer.fwd_ms, layer.bwd_ms) for layer in layers),
        keeps=tuple(_keeps_input(*found) for found in zip(layers, options, records, strict=True)),
        actions=tuple((a.kind, a.microbatch) for a in order.actions[stage]), memory=memory,
        num_microbatches=pipeline.microbatches, copy_ms_per_byte=copy_ms_per_byte,
        sends_held=gpipeheld.sends_held(stage, setup))


def _events_of(inputs: _StageInputs) -> list[Event]:
    """The stage's events (stage_events) from its inputs alone; the last made kept for the replay that follows."""
    events = _EVENTS.get(inputs)
    if events is None:
        _EVENTS.clear()
        events = _EVENTS[inputs] = stage_events(
            [_Times(*times) for times in inputs.times], inputs.options, inputs.records, actions=inputs.actions,
            memory=inputs.memory, num_microbatches=inputs.num_microbatches, loss=inputs.loss,
            copy_ms_per_byte=inputs.copy_ms_per_byte, keeps=inputs.keeps, sends_held=inputs.sends_held)
    return events


class _Times(NamedTuple):
    """What the step's passes read of a layer beyond its record and whether it keeps its input."""

    fwd_ms: float
    bwd_ms: float


def reserved_bytes(replayed: Replayed, peak_bytes: int) -> int:
    """The stage's reserved peak: the replay's, plus what the cost model's allocated peak holds
    beyond the replay's allocated peak (bytes the recorded sequence does not show, which need
    segments too), in 2 MiB segments."""
    beyond = max(0, peak_bytes - replayed.allocated_peak_bytes)
    return replayed.reserved_peak_bytes + -(-beyond // allocator.ROUND_LARGE) * allocator.ROUND_LARGE


# ---------------------------------------------------------------- static and the step's scratch


def _static_events(records: Sequence[AllocRecord], memory: StageMemory, num_microbatches: int) -> list[Event]:
    """Weights, gradients, receive buffers, optimizer state, as the runtime allocates them: the
    stage's static bytes as copies of each parameter (a copy's bytes the parameter's, as
    recorded: weights, gradients, each state; a fraction of a copy where the precision or a
    ZeRO shard makes the static bytes no whole multiple), the first two (weights, gradients)
    before the receive buffers, the rest (the optimizer state, made at the first step) after."""
    params = [size for record in records for size in record.params]
    total = sum(params)
    whole, part = divmod(memory.static_bytes, total) if total else (0, memory.static_bytes)
    copies = [[Alloc(("static", copy, i), size) for i, size in enumerate(params)] for copy in range(whole)]
    copies.append([Alloc(("static", "part", i), part * size // total) for i, size in enumerate(params)]
                  if total else [Alloc(("static", "part"), part)])
    per_buffer, rest = divmod(memory.buffer_bytes - memory.held_send_bytes, num_microbatches)
    buffers = [Alloc(("buffer", mb), per_buffer) for mb in range(num_microbatches)] + [Alloc(("buffer", "rest"), rest)]
    if memory.held_send_bytes:
        buffers.append(Alloc(("buffer", "send"), memory.held_send_bytes))
    return [*(event for copy in copies[:2] for event in copy), *buffers,
            *(event for copy in copies[2:] for event in copy)]


def _scratch_events(records: Sequence[AllocRecord], scratch_bytes: int) -> list[Event]:
    params = [size for record in records for size in record.params]
    total = sum(params) or 1
    made = [Alloc(("scratch", i), scratch_bytes * size // total) for i, size in enumerate(params)] or \
        [Alloc(("scratch",), scratch_bytes)]
    return made + [Free(event.key) for event in made]


# ---------------------------------------------------------------- the passes


class RecordPlayer:
    """What every step player does with a layer's record (its `records` and `events`): play a pass, free what the
    backward left alive, free a layer's output. Keys: (*scope, id) for a recorded allocation."""

    events: list
    records: Sequence[AllocRecord]

    def _play(self, codes: Sequence[int], scope: tuple, *, start: int, rename: dict | None = None) -> int:
        """A recorded pass whose first allocation is id start + 1; a free of a key in `rename`
        frees what stands for it. Returns the last id made."""
        count, add = start, self.events.append
        for code in codes:
            if code > 0:
                count += 1
                add(Alloc((*scope, count), code))
            else:
                key = (*scope, -code)
                add(Free(rename.get(key, key) if rename else key))
        return count

    def _free_left(self, record: AllocRecord, scope: tuple, *, keep: tuple, skip: set = frozenset()) -> None:
        """After the backward: whatever of the forward and backward is still alive, but the ids in
        `keep` (the forward's output, its consumer frees it; the gradient handed back)."""
        for ident in _alive([*record.forward, *record.backward]):
            if ident not in keep and (*scope, ident) not in skip:
                self.events.append(Free((*scope, ident)))

    def _loss_backward(self, key) -> tuple | None:
        """The loss's backward of microbatch (or step key) `key` (its record: `self.loss`), what it leaves freed; the
        key of the gradient it hands the last layer (None: none recorded)."""
        self._play(self.loss.backward, (key, "loss"), start=_count(self.loss.forward))
        self._free_left(self.loss, (key, "loss"), keep=(self.loss.input_grad, self.loss.output))
        return (key, "loss", self.loss.input_grad) if self.loss.input_grad else None

    def _free_output(self, key, i: int) -> None:
        """Layer i's output of microbatch (or step key) `key`, freed where its consumer is done with it."""
        output = self.records[i].output
        if output:
            self.events.append(Free((key, i, output)))


class _Step(RecordPlayer):
    """Appends a stage's forward and backward passes of one microbatch to `events`. Keys: a
    recorded allocation is (mb, layer index or "loss", id); a copy back ("back", mb, i, id)."""

    def __init__(self, layers, options, records, loss: AllocRecord | None, events: list[Event],
                 copy_ms_per_byte: float | None = None, keeps: Sequence[bool] | None = None,
                 sends_held: bool = False) -> None:
        self.layers, self.options, self.records, self.loss, self.events = layers, options, records, loss, events
        # whether each layer holds its input to its backward (None: _keeps_input of each)
        self.keeps = keeps if keeps is not None else [_keeps_input(*found) for found in zip(layers, options, records)]
        self.sent: list[tuple] | None = [] if sends_held else None  # input gradients sends hold (stage_events)
        self.offloaded: list[tuple] = []  # saved blocks waiting for their copy out, in issue order
        self.saved: dict[tuple, list[tuple]] = {}  # (mb, layer) -> its offloaded blocks' keys
        # the copies' clock (timed): the compute stream's time, each copy stream's, each copy out's end
        self.per_byte = copy_ms_per_byte
        self.now = self.out_clock = self.back_clock = 0.0
        self.done: dict[tuple, float] = {}

    def forward(self, mb: int) -> None:
        for i, (layer, record) in enumerate(zip(self.layers, self.records)):
            self._ready_by(self.now)
            self._play(record.forward, (mb, i), start=0)
            started, self.now = self.now, self.now + layer.fwd_ms
            if i > 0 and not self.keeps[i]:
                self._free_output(mb, i - 1)
            self._after_forward(mb, i, started)
        if self.loss is not None:
            self._play(self.loss.forward, (mb, "loss"), start=0)  # the loss value is kept to the end

    def _after_forward(self, mb: int, i: int, started: float) -> None:
        """Layer i's forward of microbatch `mb` is done (begun at `started`): an offloaded layer's saved storages
        leave on the copy stream (ckplan's per-layer option; reserve_window.py plays Transformer Engine's window)."""
        layer, record = self.layers[i], self.records[i]
        if self.options[i] != OPTION_OFFLOAD:
            return
        sizes, made = _sizes(record.forward), _made_at(record.forward)
        for ident in _alive(record.forward):
            if ident != record.output:
                self.events.append(Free((mb, i, ident), deferred=True))
                self.offloaded.append((mb, i, ident))
                self.saved.setdefault((mb, i), []).append((mb, i, ident))
                # copied out as it is saved (offloaded_activations.pack): when the op that made it ran
                issued = started + layer.fwd_ms * made[ident]
                self.out_clock = max(self.out_clock, issued) + sizes[ident] * (self.per_byte or 0.0)
                self.done[(mb, i, ident)] = self.out_clock

    def _reloads(self, mb: int, i: int) -> dict[tuple, tuple]:
        """Before layer i's backward: what comes back for it (each saved key -> its copy back's key)."""
        return self._copies_back(self.records[i], mb, i) if self.options[i] == OPTION_OFFLOAD else {}

    def backward(self, mb: int) -> None:
        last = len(self.layers) - 1
        grad = None  # the key of the gradient the next pass receives; None: a receive buffer
        if self.loss is not None:
            grad = self._loss_backward(mb)
        for i in range(last, -1, -1):
            layer, record = self.layers[i], self.records[i]
            self._ready_by(self.now)
            back = self._reloads(mb, i)
            self._play(record.backward, (mb, i), start=_count(record.forward), rename=back)
            self.now += layer.bwd_ms
            if grad is not None:
                self.events.append(Free(grad))
            self._free_left(record, (mb, i), keep=(record.output, record.input_grad), skip=set(back))
            self.events += [Free(key) for key in back.values()]  # copies back not freed yet (a no-op if freed)
            if i == last:
                self._free_output(mb, i)  # the stage's output leaves fwd_cache
            if i > 0 and self.keeps[i]:
                self._free_output(mb, i - 1)
            grad = (mb, i, record.input_grad) if record.input_grad else None
        if grad is not None:  # the stage's input gradient, sent (freed, or held by its send: stage_events)
            self.events.append(Free(grad)) if self.sent is None else self.sent.append(grad)

    def _copies_back(self, record: AllocRecord, mb: int, i: int) -> dict[tuple, tuple]:
        """The layer's saved blocks come back: the copies back are allocated (prefetch, on the
        compute stream), each starts once its copy out is done, and the compute waits for them;
        by then the copies out up to the layer's own are complete (one stream, in order), their
        blocks cached. Returns each saved key -> its copy back's."""
        mine = self.saved.pop((mb, i), [])
        if not mine:
            return {}
        sizes = _sizes(record.forward)
        back = {key: ("back", *key) for key in mine}
        self.events += [Alloc(copy, sizes[key[2]]) for key, copy in back.items()]
        for key in mine:
            start = max(self.back_clock, self.now, self.done[key])
            self.back_clock = start + sizes[key[2]] * (self.per_byte or 0.0)
        self.now = max(self.now, self.back_clock)
        waiting = [self.offloaded.index(key) for key in mine if key in self.offloaded]
        done = max(waiting) + 1 if waiting else 0
        self.events += [Ready(key) for key in self.offloaded[:done]]
        self.offloaded = self.offloaded[done:]
        return back

    def _ready_by(self, now: float) -> None:
        """Timed: the copies out complete by `now` have their blocks cached (process_events, at the
        next malloc). Untimed: none until its layer's backward (_copies_back)."""
        if self.per_byte is None:
            return
        done = 0
        while done < len(self.offloaded) and self.done[self.offloaded[done]] <= now:
            done += 1
        self.events += [Ready(key) for key in self.offloaded[:done]]
        self.offloaded = self.offloaded[done:]


def _keeps_input(layer: LayerProfile, option: str, record: AllocRecord) -> bool:
    """Whether the layer holds its input until its backward: the option's kept bytes (which
    count the input where it is saved, or checkpointed) exceed what its recorded forward leaves
    besides its output (which never counts the input: it was made before). Offload keeps what
    none saves of the input. A layer without the option's kept bytes: every option but none
    keeps it."""
    name = OPTION_NONE if option == OPTION_OFFLOAD else option
    kept = next((o.kept_bytes for o in layer.recompute_options if o.name == name), None)
    if kept is None:
        return name != OPTION_NONE or layer.input_in_act_bytes > 0
    sizes = _sizes(record.forward)
    left = sum(sizes[ident] for ident in _alive(record.forward) if ident != record.output)
    return kept > left


def _count(codes: Sequence[int]) -> int:
    return sum(1 for code in codes if code > 0)


def _alive(codes: Sequence[int]) -> list[int]:
    alive, count = {}, 0
    for code in codes:
        if code > 0:
            count += 1
            alive[count] = True
        else:
            alive.pop(-code, None)
    return list(alive)


def _sizes(codes: Sequence[int]) -> dict[int, int]:
    sizes, count = {}, 0
    for code in codes:
        if code > 0:
            count += 1
            sizes[count] = code
    return sizes


def host_copy_ms_per_byte(profile: Profile, setup: TrainSetup) -> float | None:
    """Offload's copies: --host-bandwidth, else the profile's GPU's host link (archs.GPU,
    PCIe per direction); None where neither is known (the untimed upper bound)."""
    gb_per_s = setup.data_parallel.host_gb_per_s
    if gb_per_s is None:
        try:
            gb_per_s = dataparallel.profile_gpu(profile).host_link_gb_per_s
        except UserError:
            return None
    return 1e3 / (gb_per_s * 1e9)


def _made_at(codes: Sequence[int]) -> dict[int, float]:
    """Each id's allocation as a fraction of the pass's events (the pass's time, evenly spread)."""
    made, count = {}, 0
    for position, code in enumerate(codes, start=1):
        if code > 0:
            count += 1
            made[count] = position / len(codes)
    return made
