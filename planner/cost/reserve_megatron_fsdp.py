"""A rank's reserved peak under Megatron-FSDP (--use-megatron-fsdp, optim_grads_params, --fsdp-double-buffer; one
pipeline stage) with Transformer Engine's layer-window activation offload where the job runs it, from the caching
allocator's replay (allocator.settled_replay) of its allocations in the order the code makes them. Read at
megatron-core 92c8482e (F = megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py, B = its
param_and_grad_buffer.py), Megatron-Bridge 00b7660b and TransformerEngine v2.9 (cpu_offload.py); facts in
docs/framework-facts.md §114, §125, §107, §112 and §129:

- static: Bridge's Megatron-FSDP override builds the model on the meta device (scripts/performance/utils/
  overrides.py `_set_megatron_fsdp_overrides`: `init_model_with_meta_device = True`), so no parameter is ever its
  own GPU tensor: each parameter group's sharded buffers are made at wrap time (B 1253-1487, 1841-1903), the
  rank's 1/K of the model weights (uint8 for Float8 weights, bf16 else), the fp32 main weights and the gradients
  in the reduce dtype (bf16 under --grad-reduce-in-bf16); the optimizer's main params are the main-weight
  buffer's (no clone). A unit (every TransformerLayer) is a group per weight dtype; the edge modules (embedding,
  final norm + output layer) each theirs. Adam (TE's FusedAdam) makes exp_avg then exp_avg_sq per parameter at its
  first step;
- the step's requests: the edge modules' weights gathered whole at their first forward of the iteration from the
  backup TemporaryBucketAllocator (a plain torch.empty) and freed at the all-gather pipeline's reset() in
  finish_grad_sync, after the last microbatch's backward (F 597-625, 1044-1064; B 3127-3153); a unit's weights
  gathered into the double buffer's two weight slots and its gradient bucket into two gradient slots, named
  GlobalMemoryBuffer tensors made at first use and never freed (B 639-790, 1791-1800; megatron/core/utils.py
  598-616): the first unit's pre-forward gathers it and prefetches the next, so both weight slots are made there;
  the first two units' post-backwards make the gradient slots; under --no-gradient-accumulation-fusion autograd
  makes each weight's bf16 .grad in the module's backward and the post-backward copies it into the bucket and
  drops it (F 526-532); an edge module's gradient bucket is a TemporaryBucketAllocator tensor made in its
  post-backward, counted by `_enforce_double_buffer_limit` as a unit: when a third bucket is requested the oldest
  queued one's reduce is waited for and, an edge bucket, freed (B 2850-2870; F 520-532); then `reduce_gradients`
  waits for and frees the oldest queued buckets while their elements pass suggested_RS_queue_capacity (the
  --suggested-communication-unit-size: B 2771-2838, F 382, 589-592; at B3 800M elements, below the output
  layer's 1.05G, so the output layer's bucket goes at the last unit's post-backward); what is still queued at the
  microbatch's backward end is freed there (reset); the reduce-scatter writes into the bucket's own shard under
  the double buffer (B 2935-2975: no request);
- the optimizer step: `update_main_grads` hands the optimizer each shard's gradient `.to(fp32)` (a copy where the
  buffer is bf16: B 2445-2506), dropped after the step;
- TE's window offload (planner/cost/te_offload.py window_map, on the map of the handler the runtime's record names,
  `te_window_handler`: v2.9's, or v2.10's window[i] = L - N - 1 + i): an offloaded layer's saved tensors, its input
  among them, freed when layer window[i]'s forward ends (the compute stream waited for the copy, then the tensors
  dropped: one pool, plain frees), made again by torch.empty_like on the compute stream, tensor by tensor, before
  layer window[i]'s backward, and freed with that layer's backward (v2.9); v2.10 holds them past it, to the next
  block layer's bwd_step (before its reloads) or the backward's end (docs/framework-facts.md §428, as
  reserve_window.WindowPasses plays it for Megatron-LM's distributed optimizer).

The layers' own allocations are each layer's AllocRecord for its option (the offloaded layers' none record, as
reserve.records_for gives it), played as reserve.py's passes play them (a layer's input freed after its forward
unless it keeps it, else after its backward; the last stage's loss and its logits as reserve_megatron's). A
decoder block whose record is Transformer Engine's FP8 dense block plays its backward node by node
(te_block_backward.program: each saved tensor freed when the node that saved it returns or TE clears it, each
bf16 weight gradient made in its node, Megatron-core's six parameter tensors); another layer's bf16 weight
gradients are made at the point its recorded backward makes its last tensor (the record orders a layer's
allocations then its frees): an upper bound on that moment. Not replayed: the non-double-buffer path
(buckets made and freed per unit, the reduce-scatter's own stream: the divisor stays), several pipeline stages,
Hopper's FP8 transposes of the computing unit (megatron_fsdp.transpose_bytes: none on Blackwell; where the cost
model's allocated peak holds them beyond the replay's, reserve.reserved_bytes adds them), the buckets' padding, the
quantize scratch of copy_main_weights_to_model_weights, torch's out-of-memory retry (no cap: as every replay here),
NCCL's buffers (outside the allocator). Nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.cost import (
    afterstep,
    allocator,
    dataparallel,
    megatron_fsdp,
    runtimes,
    te_block_backward,
    te_offload,
)
from planner.cost.allocator import Alloc, Event, Free, Replayed
from planner.cost.fsdp2_layers import parameter_parts, tensor_split
from planner.cost.reserve import RecordPlayer, _alive, _count, _keeps_input, _sizes, plan_records
from planner.cost.reserve_fsdp2 import expandable_segments
from planner.cost.reserve_megatron import (
    MAX_STEPS,
    STEPS,
    _output_bytes,
    _workspaces,
    last_stage_loss,
    replayed_microbatches,
)
from planner.cost.rules import batch_bytes
from planner.cost.te_kept import te_saved_inputs
from planner.schema import OPTION_OFFLOAD, AllocRecord, LayerProfile, Profile, StagePlan, TrainSetup

QUEUED_BUCKETS = 2  # _enforce_double_buffer_limit: two buckets queued under the double buffer (B 2850-2870)


@dataclass(frozen=True)
class FsdpLayer:
    """One layer's Megatron-FSDP bytes on the rank: its sharded buffers, whether it is a unit, what it gathers (per
    weight dtype: the uint8 Float8 part, the rest), its gradient bucket and its unfused bf16 gradients (per tensor)."""

    shards: tuple[int, ...]  # model weights, main weights, gradients: made at wrap time
    moment: int  # one Adam moment of its shard
    step_grad: int  # the shard's fp32 gradient copy the optimizer step is handed
    unit: bool
    gathered: tuple[int, ...]  # per weight dtype
    bucket: int  # its gradient bucket, whole
    unfused: tuple[int, ...] = ()  # its weights' bf16 .grad under --no-gradient-accumulation-fusion
    elements: int = 0  # its gradient bucket's elements (the reduce queue's capacity counts them)


@dataclass(frozen=True)
class FsdpStatic:
    layers: tuple[FsdpLayer, ...]
    rest_bytes: int  # the cost model's static beyond the buffers, and the batch: one block
    workspaces: tuple[int, ...] = ()  # the cuBLAS workspaces, made at the first forward
    global_buffer: int = 0
    queue_capacity: int | None = None  # suggested_RS_queue_capacity, elements (None: not applied)


def replays(setup: TrainSetup) -> bool:
    """Whether this replay orders the setup's step (megatron_fsdp.step_replayed)."""
    return megatron_fsdp.step_replayed(setup)


def fsdp_layers(layers: Sequence[LayerProfile], profile: Profile, setup: TrainSetup) -> tuple[FsdpLayer, ...]:
    """Each layer's buffers (megatron_fsdp.held's parameters and Float8 weights, the unit kinds)."""
    k = dataparallel.shard_size(setup)
    params, record = dataparallel.param_bytes(setup), runtimes.of(setup.training)
    master = record.master_bytes if setup.training.precision == "bf16-mixed" else 0
    moment = (params.optim - master) / 2
    by_name = {layer.name: row for layer, row in zip(profile.layers, megatron_fsdp.held(profile, setup))}
    unfused = setup.training.unfused_grad_accumulation
    out = []
    for layer in layers:
        count, fp8, unit = by_name[layer.name]
        whole = dataparallel.gathered_bytes(count, setup, fp8_count=fp8)
        fp8_part = whole - dataparallel.gathered_bytes(count - fp8, setup) if fp8 else 0
        gathered = tuple(int(part) for part in (fp8_part, whole - fp8_part) if part)
        out.append(FsdpLayer(
            shards=(int(whole / k), int(count * master / k), int(count * params.grads / k)),
            moment=int(count * moment / k), step_grad=int(count * 4 / k) if params.grads < 4 else 0, unit=unit,
            gathered=gathered, bucket=int(count * params.grads), elements=int(count),
            unfused=tensor_split(count * params.weights, te_block_backward.megatron_parts(
                parameter_parts(layer, profile.assumptions))) if unfused else ()))
    return tuple(out)


def static_of(layers: Sequence[LayerProfile], cost, *, profile: Profile, setup: TrainSetup) -> FsdpStatic:
    """The buffers, and what the cost model's static holds beyond them with the batch (rules.batch_bytes)."""
    made = fsdp_layers(layers, profile, setup)
    held = sum(sum(layer.shards) + 2 * layer.moment for layer in made)
    units = [layer.elements for layer in made if layer.unit]
    return FsdpStatic(layers=made, rest_bytes=int(max(0, cost.static_bytes - held) + batch_bytes(profile, 0, setup)),
                      workspaces=_workspaces(setup.training, profile, setup.comm),
                      global_buffer=afterstep.global_buffer_bytes(setup.training, profile, holds_output=True),
                      queue_capacity=megatron_fsdp.comm_unit_elements(units, setup) if units else None)


def static_events(static: FsdpStatic) -> list[Event]:
    """Each group's shards at wrap time, in the model's order; the rest."""
    events: list[Event] = [Alloc(("shard", i, n), size) for i, layer in enumerate(static.layers)
                           for n, size in enumerate(layer.shards) if size]
    return [*events, Alloc(("rest",), static.rest_bytes)]


class _Window:
    """Transformer Engine's window over the stage's block: the block's layer indices and, per group, the block
    position after whose forward it is dropped and before whose backward it is reloaded."""

    def __init__(self, layers: Sequence[LayerProfile], options: Sequence[str], handler: str = "v2.9") -> None:
        self.groups: dict[int, int] = {}  # layer index -> the block position of its window
        self.holds = handler == te_offload.V210  # v2.10: a reloaded layer's tensors held past its backward
        found = te_offload.window_layers([layer.kind for layer in layers], [o == OPTION_OFFLOAD for o in options])
        if found is None:
            self.block: list[int] = []
            return
        self.block, count = found
        window = te_offload.window_map(len(self.block), count, handler=handler)
        self.groups = {self.block[j]: self.block[window[j]] for j in range(count)}

    def dropped_after(self, i: int) -> list[int]:
        return [j for j, at in self.groups.items() if at == i]


class _StepPlayer(RecordPlayer):
    """One step's passes on the rank, appended to `events`."""

    def __init__(self, layers, options, records, static: FsdpStatic, *, loss: AllocRecord, keeps_logits: bool,
                 events: list[Event], step: int, programs: Sequence | None = None, handler: str = "v2.9") -> None:
        self.layers, self.options, self.records, self.static = layers, options, records, static
        self.programs = list(programs) if programs is not None else [None] * len(records)
        self.loss, self.keeps_logits, self.events, self.step = loss, keeps_logits, events, step
        self.window = _Window(layers, options, handler)
        self.held: list[tuple] = []  # v2.10: the reloaded blocks bwd_gpu_tensor_group holds (§428)
        self.keeps = [_keeps_input(layer, option, record) for layer, option, record in zip(layers, options, records)]
        self.units = [i for i, layer in enumerate(static.layers) if layer.unit]
        self.groups: dict[tuple, dict[tuple, int]] = {}  # (mb, layer) -> its offloaded tensors' keys and sizes
        self.queue: list[tuple] = []  # the gradient buckets queued for their reduce

    def run(self, microbatches: int) -> None:
        first_step = self.step == 0
        if first_step:
            self.events += [*(Alloc(("workspace", n), size) for n, size in enumerate(self.static.workspaces)),
                            *([Alloc(("global_buffer",), self.static.global_buffer)] if self.static.global_buffer
                              else [])]
        for mb in range(microbatches):
            self.forward((self.step, mb), gather=mb == 0)
            self.backward((self.step, mb))
        # finish_grad_sync: the all-gather pipeline's reset() frees the edge modules' gathered weights
        self.events += [Free(("edge", self.step, i)) for i, layer in enumerate(self.static.layers) if not layer.unit]
        copies = [Alloc(("step_grad", self.step, i), layer.step_grad) for i, layer in enumerate(self.static.layers)
                  if layer.step_grad]
        self.events += copies
        if first_step:  # FusedAdam's state at its first step, per parameter group
            self.events += [Alloc(("moment", i, m), layer.moment) for i, layer in enumerate(self.static.layers)
                            for m in (0, 1) if layer.moment]
        self.events += [Free(event.key) for event in copies]

    # ------------------------------------------------------------ forward

    def forward(self, key: tuple, *, gather: bool) -> None:
        for i, record in enumerate(self.records):
            fsdp = self.static.layers[i]
            if not fsdp.unit and gather:  # the edge module's pre-forward gather, held to reset()
                self.events.append(Alloc(("edge", self.step, i), sum(fsdp.gathered)))
            if self.step == 0 and gather and fsdp.unit and i == self.units[0]:  # the unit and its prefetch
                for slot in range(min(2, len(self.units))):
                    self.events += [Alloc(("wslot", slot, n), size) for n, size in enumerate(fsdp.gathered)]
            self._play(record.forward, (key, i), start=0)
            if i > 0 and not self.keeps[i]:
                self._free_output(key, i - 1)
            for j in self.window.dropped_after(i):
                self._drop_group(key, j)
        self._play(self.loss.forward, (key, "loss"), start=0)
        last = len(self.records) - 1
        if self.records[last].output and not self.keeps_logits:
            self._free_output(key, last)

    def _drop_group(self, key: tuple, j: int) -> None:
        """Group j's device tensors dropped: its input where it keeps it (the previous layer's output) and its saved
        tensors (what its forward left but its output), in the order reserve_window reloads them (push order: the
        input first, docs/framework-facts.md §378)."""
        record, group = self.records[j], {}
        if j > 0 and self.keeps[j] and self.records[j - 1].output:
            before = self.records[j - 1]
            group[(key, j - 1, before.output)] = _sizes(before.forward)[before.output]
        sizes = _sizes(record.forward)
        group.update({(key, j, ident): sizes[ident] for ident in _alive(record.forward) if ident != record.output})
        self.groups[(key, j)] = group
        self.events += [Free(k) for k in group]

    # ------------------------------------------------------------ backward

    def backward(self, key: tuple) -> None:
        grad = self._loss_backward(key)
        last = len(self.records) - 1
        for i in range(last, -1, -1):
            record, fsdp = self.records[i], self.static.layers[i]
            if self.window.holds and i in self.window.block:  # v2.10's bwd_step: the previous layer's state released
                self._release()
            for j in self.window.dropped_after(i):  # reloaded into fresh empty_like buffers before this backward
                self.events += [Alloc(("back", *k), size) for k, size in self.groups[(key, j)].items()]
            reloaded = {k: ("back", *k) for k in self.groups.pop((key, i), {})}
            if self.window.holds and reloaded:  # autograd's frees of them do nothing: the synchronizer holds them
                self.held += list(reloaded.values())
                reloaded = {k: ("held", *copy) for k, copy in reloaded.items()}
            if self.programs[i] is not None:  # node by node (te_block_backward.program)
                self._play_program(self.programs[i], key, i, start=_count(record.forward), rename=reloaded)
            else:
                codes = record.backward
                cut = max((n + 1 for n, code in enumerate(codes) if code > 0), default=0)
                self._play(codes[:cut], (key, i), start=_count(record.forward), rename=reloaded)
                self.events += [Alloc(("wgrad", key, i, n), size) for n, size in enumerate(fsdp.unfused)]
                self._play(codes[cut:], (key, i), start=_count(record.forward) + _count(codes[:cut]), rename=reloaded)
            if grad is not None:
                self.events.append(Free(grad))
            self._free_left(record, (key, i), keep=(record.output, record.input_grad), skip=set(reloaded))
            self.events += [Free(k) for k in reloaded.values()]
            if i == last:
                self._free_output(key, i)
            if i > 0 and self.keeps[i] and not reloaded:
                self._free_output(key, i - 1)
            self._post_backward(key, i)
            grad = (key, i, record.input_grad) if record.input_grad else None
        if grad is not None:
            self.events.append(Free(grad))
        self._release()  # v2.10's finish_part_of_bwd, the backward's end (nothing held under v2.9)
        self.events += [Free(bucket) for bucket, _ in self.queue if bucket[0] == "gbucket"]  # reset at the end
        self.queue = []

    def _post_backward(self, key: tuple, i: int) -> None:
        """`_grad_acc`: the gradient bucket requested (the oldest queued one waited for and, an edge module's,
        freed, past two: `_enforce_double_buffer_limit`), the bf16 gradients copied into it and dropped; then
        `reduce_gradients`: while the queued buckets' elements pass the queue's capacity the oldest is waited for
        and, an edge module's, freed (`wait_for_previous_grad_reduce`, B 2815-2838), and the bucket is queued."""
        fsdp = self.static.layers[i]
        if len(self.queue) >= QUEUED_BUCKETS:
            self._dequeue()
        if fsdp.unit:
            bucket = ("gslot", self.units[::-1].index(i) % 2)
            if self.step == 0 and key[1] == 0 and self.units[::-1].index(i) < 2:
                self.events.append(Alloc(bucket, fsdp.bucket))
        else:
            bucket = ("gbucket", key, i)
            self.events.append(Alloc(bucket, fsdp.bucket))
        self.events += [Free(("wgrad", key, i, n)) for n in range(len(fsdp.unfused))]
        capacity = self.static.queue_capacity
        while capacity is not None and self.queue and sum(elements for _, elements in self.queue) > capacity:
            self._dequeue()
        self.queue.append((bucket, fsdp.elements))

    def _release(self) -> None:
        self.events += [Free(copy) for copy in self.held]
        self.held = []

    def _dequeue(self) -> None:
        oldest, _ = self.queue.pop(0)
        if oldest[0] == "gbucket":
            self.events.append(Free(oldest))

    def _play_program(self, program: Sequence, key: tuple, i: int, *, start: int, rename: dict) -> None:
        """te_block_backward.program's codes, its ("wgrad", n) the layer's n-th unfused bf16 gradient."""
        unfused = self.static.layers[i].unfused
        for item in program:
            if isinstance(item, tuple):
                if item[1] < len(unfused):
                    self.events.append(Alloc(("wgrad", key, i, item[1]), unfused[item[1]]))
            else:
                self._play([item], (key, i), start=start, rename=rename)
                start += 1 if item > 0 else 0

    # ------------------------------------------------------------ reserve.py's pass helpers


def step_player(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord], *,
                static: FsdpStatic, num_microbatches: int, loss: AllocRecord, keeps_logits: bool,
                programs: Sequence | None = None, handler: str = "v2.9") -> tuple[list[Event], Callable[[int], list[Event]]]:
    """The rank's static allocations, and the function making step `index`'s events (`programs`: each layer's
    backward node by node, backward_programs; None: every record's own order; `handler`: the TE offload handler
    running the window, the record's te_window_handler)."""
    microbatches = replayed_microbatches(1, 0, num_microbatches)

    def one_step(index: int) -> list[Event]:
        events: list[Event] = []
        _StepPlayer(layers, options, records, static, loss=loss, keeps_logits=keeps_logits, events=events,
                    step=index, programs=programs, handler=handler).run(microbatches)
        return events

    return static_events(static), one_step


def backward_programs(layers: Sequence[LayerProfile], records: Sequence[AllocRecord], profile: Profile) -> list:
    """Each decoder block's backward as Transformer Engine's nodes free what they saved (te_block_backward.program,
    where its record is the FP8 dense block te_kept writes); None for the other layers."""
    saved = te_saved_inputs(profile)
    return [te_block_backward.program(record, saved) if layer.kind == "decoder_block" else None
            for layer, record in zip(layers, records)]


def replay_stage(plan: StagePlan, cost, *, profile: Profile, setup: TrainSetup,
                 cap_bytes: int | None = None) -> Replayed | None:
    """The rank's replay (`cost`: its StageCost, for the static total); None where a layer has no record for its
    option, the logits are not known, or offloaded layers are not the block's first N (TE's window)."""
    layers, options, records = plan_records(plan, profile)
    if records is None:
        return None
    if OPTION_OFFLOAD in options and (not runtimes.of(setup.training).te_window_offload
                                      or not _Window(layers, options).groups):
        return None
    logits = _output_bytes(records[-1])
    if not logits:
        return None
    loss, keeps_logits = last_stage_loss(profile, setup, logits)
    static = static_of(layers, cost, profile=profile, setup=setup)
    events, one_step = step_player(layers, options, records, static=static, num_microbatches=setup.pipeline.microbatches,
                                   loss=loss, keeps_logits=keeps_logits,
                                   programs=backward_programs(layers, records, profile),
                                   handler=te_offload.handler_of(setup))
    return allocator.settled_replay(events, one_step, min_steps=STEPS, max_steps=MAX_STEPS,
                                    expandable=expandable_segments(profile, setup), cap_bytes=cap_bytes)
