"""FSDP2's step replayed on a rank of several chunks (torch's PipelineScheduleMulti: interleaved 1F1B),
each chunk its own FSDP2 root, in the order torch runs the rank's actions. Read at torch 2.6.0 (git
2236df17; torchtitan 9dec370 ran torch 1963fc8 of the same month) and torchtitan 9dec370:

- each chunk is its own model part, parallelized (fully_shard, the part its root) and stepped by its own
  AdamW in turn (9dec370 train.py 154-163; torchtitan/optimizer.py 22-52 OptimizersContainer: one
  optimizer a part, `step` and `zero_grad` part by part): each part's state made at the first step's
  optimizer step, its foreach scratch made and freed before the next part's step.
- each root makes its own FSDPCommContext at its lazy init (fsdp/_fully_shard/_fsdp_state.py 84, 190),
  and with it its own copy-in, all-gather and reduce-scatter streams (`_fsdp_param_group.py` 52-81,
  `torch.cuda.Stream(priority=-1)`: distinct streams, each a pool of its own in the caching allocator)
  and its own `reduce_scatter_state` (the last reduce-scatter input the chunk keeps, 407-412).
- PipelineScheduleMulti._step_microbatches (pipelining/schedules.py 1202-1355) runs the rank's
  `pipeline_order` action by action; a chunk's backward is its stage's `last_backward` at the chunk's
  M-th (backward_counter, 1237-1266), where the stage runs its FSDP2 groups' post-backward (the
  reduce-scatters, root first: stage.py 636-652), before the next action.
- every stage keeps each microbatch's output in `output_chunks` from its forward (stage.py 703) and each
  input's gradient on its receive buffer's `.grad` from its backward, both until the next step's
  `clear_runtime_states` (stage.py 507-520; schedules.py 1180-1181, after train.py's zero_grad); the last
  stage's step returns `merge_chunks(output_chunks)` (schedules.py 1195-1198), which train.py drops
  (9dec370 train.py 285-292).

Each chunk's layers, units and ends are the cost model's own (fsdp2_layers.chunk_layers, the stage's
sums); this module adds their order across chunks and each chunk's streams. Nothing here reads a file
or prints.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from planner.cost import allocator, dataparallel, gpipeheld, lossvalues, runtimes
from planner.cost.allocator import Alloc, Event, Free, Replayed
from planner.cost.fsdp2_events import DEFAULT, MAX_STEPS, STEPS, Fsdp2Stage, _PipelineStep
from planner.schema import Profile, StagePlan, TrainSetup

SCHEDULES = ("interleaved-1F1B",)  # several chunks a rank, every backward whole (B): the replay's schedules


@dataclass(frozen=True)
class Fsdp2Rank:
    """A rank of several chunks as the replay runs it: each chunk's stage (its `actions` unused), the
    rank's actions in torch's order, and what the schedule holds per microbatch beyond a chunk's layers."""

    chunks: tuple[Fsdp2Stage, ...]  # chunk 0 first; each chunk's buffer_bytes unused (the rank's below)
    actions: tuple[tuple[int, str, int], ...]  # (chunk, F|B, microbatch)
    num_microbatches: int  # a chunk reduces after its M-th backward
    buffer_bytes: int  # held all iteration besides the static state
    output_bytes: tuple[int, ...] = ()  # per chunk, a microbatch's output (output_chunks: forward to next step)
    input_grad_bytes: tuple[int, ...] = ()  # per chunk, a microbatch's input gradient (its backward to next step)
    merged_bytes: int = 0  # the last stage's merge of its outputs at the step's end, dropped at once
    # the stage output a 1F1B warm-up send keeps (warmupsend.py): a block of its own beside the buffers, as the
    # cost model holds it (all iteration), not merged into theirs (one_stage_rank)
    held_send_bytes: int = 0


def rank_events(rank: Fsdp2Rank, *, steps: int = STEPS) -> list[Event]:
    """The rank's static state (each chunk's shards, then the buffers), then `steps` steps."""
    events: list[Event] = []
    for c, chunk in enumerate(rank.chunks):
        events += [placed(Alloc(("shard", i, j), size, DEFAULT), c)
                   for i, layer in enumerate(chunk.layers) for j, size in enumerate(layer.shard)]
    events.append(Alloc(("buffers",), rank.buffer_bytes, DEFAULT))
    if rank.held_send_bytes:
        events.append(Alloc(("send",), rank.held_send_bytes, DEFAULT))
    for step in range(steps):
        _ChunkedStep(rank, events, makes_state=step == 0).run()
    return events


def replay(rank: Fsdp2Rank, *, expandable: bool = False, cap_bytes: int | None = None,
           perturb: allocator.Perturb | None = None) -> Replayed:
    """The rank's peaks, its steps played until one raises neither (allocator.settled_replay; `perturb` its)."""
    def step(index: int) -> list[Event]:
        events: list[Event] = []
        _ChunkedStep(rank, events, makes_state=index == 0).run()
        return events

    return allocator.settled_replay(rank_events(rank, steps=0), step, min_steps=STEPS, max_steps=MAX_STEPS,
                                    expandable=expandable, cap_bytes=cap_bytes, perturb=perturb)


def placed(event: Event, chunk: int) -> Event:
    """A chunk's event on the rank: its key the chunk's, its FSDP2 streams the chunk's root's own (chunk
    c's copy-in 1 + 2c, reduce-scatter 2 + 2c; the default stream shared)."""
    if isinstance(event, Alloc):
        stream = event.stream if event.stream == DEFAULT else event.stream + 2 * chunk
        return Alloc(("chunk", chunk, event.key), event.nbytes, stream)
    return Free(("chunk", chunk, event.key), event.deferred)


class _ChunkedStep:
    def __init__(self, rank: Fsdp2Rank, events: list[Event], *, makes_state: bool) -> None:
        self.rank, self.events = rank, events
        self.parts = [_PipelineStep(chunk, [], makes_state=makes_state) for chunk in rank.chunks]

    def play(self, chunk: int, pass_, *args) -> None:
        """One of a chunk's passes (its _PipelineStep's), its events placed on the rank."""
        part = self.parts[chunk]
        part.events = []
        pass_(*args)
        self.events += [placed(event, chunk) for event in part.events]

    def run(self) -> None:
        rank, add = self.rank, self.events.append
        for c, part in enumerate(self.parts):  # zero_grad, part by part
            self.play(c, part.begin)
        for c in range(len(self.parts)):  # clear_runtime_states: the last step's outputs and input gradients
            for mb in range(rank.num_microbatches):
                self.events += [Free(("output", c, mb)), Free(("input_grad", c, mb))]
        backwards: Counter[int] = Counter()
        for c, kind, mb in rank.actions:
            part = self.parts[c]
            if kind == "F":  # the last layer makes the output (kept in output_chunks) before the loss runs on it:
                # torch 2.6.0 stage.py 703 in forward_one_chunk, then schedules.py 712 / 753 / 1254 _maybe_compute_loss
                self.play(c, part.forward_layers, mb)
                if rank.output_bytes and rank.output_bytes[c]:
                    add(Alloc(("output", c, mb), rank.output_bytes[c], DEFAULT))
                self.play(c, part.forward_loss, mb)
                continue
            self.play(c, part.backward_mb, mb)
            if rank.input_grad_bytes and rank.input_grad_bytes[c]:
                add(Alloc(("input_grad", c, mb), rank.input_grad_bytes[c], DEFAULT))
            backwards[c] += 1
            if backwards[c] == rank.num_microbatches:  # the stage's last backward: its post-backwards
                self.play(c, part.reduce_all)
        if rank.merged_bytes:
            self.events += [Alloc(("merged",), rank.merged_bytes, DEFAULT), Free(("merged",))]
        for c, part in enumerate(self.parts):  # optimizers.step(): each part's AdamW in turn
            self.play(c, part.optimizer_step)


# ---------------------------------------------------------------- the rank from the cost model's terms


# Each microbatch's output is made at its forward and kept to the next step, between the activations the
# steady state frees, so the reserve grows with every microbatch replayed: the replay runs them all, up to this
# many (its cost is linear in them). Past it, a 1F1B rank runs its warm-up and two steady pairs
# (fsdp2_layers.replayed_microbatches) and an interleaved one two rounds of P (replayed_microbatches), the
# others' outputs among the buffers: an under-estimate, on a synthetic P = 2 (uniform_blocks(14)) by 10-21% on
# 1F1B's last stage at M = 4-16 (3 replayed) and by 17% on an interleaved rank at M = 16 (4 replayed).
REPLAYED_MAX = 64


def replayed_microbatches(pipeline, stage: int | None = None) -> int:
    """The microbatches the replay runs (`stage`: a rank of one stage's, else an interleaved rank's): all M up
    to REPLAYED_MAX; past it, interleaved 1F1B two of its rounds of P microbatches (torch 2.6.0 schedules.py
    1904-1915: max(1, M // P) rounds; its warm-up and cool-down alike for every M a multiple of P), each
    chunk still reduced after its last backward; 1F1B and GPipe as fsdp2_layers.replayed_microbatches."""
    from planner.cost import fsdp2_layers

    m, p = pipeline.microbatches, pipeline.stages
    if m <= REPLAYED_MAX:
        return m
    if stage is not None:
        return fsdp2_layers.replayed_microbatches(pipeline, stage)
    return 2 * p if m % p == 0 else m


def with_ends(stage: Fsdp2Stage, ends: float) -> Fsdp2Stage:
    """`stage` with its ends kept from a forward to its backward (`ends`: the stage's kept bytes less its
    layers' and less its output, made apart), less what its loss's forward program keeps itself (the
    log-softmax result, made in torch's place: fsdp2_layers.program_kept_bytes). Where they are negative, the
    stage input its first layer saves is its receive buffer's (rules.first_layer_kept_bytes: among the
    buffers already): taken off that layer's kept bytes, so no microbatch's input is held twice."""
    from planner.cost.fsdp2_layers import program_kept_bytes

    ends -= program_kept_bytes(stage.loss_forward)
    if ends >= 0:
        return replace(stage, loss_kept_bytes=int(ends))
    first = stage.layers[0]
    layers = (replace(first, kept_bytes=max(0, first.kept_bytes + int(ends))), *stage.layers[1:])
    return replace(stage, layers=layers, loss_kept_bytes=0)


def one_stage_rank(stage: Fsdp2Stage, last_layer, *, stage_index: int, setup: TrainSetup,
                   ends: float, first_layer=None) -> Fsdp2Rank:
    """A rank of one stage beside torch's 1F1B or GPipe as the same driver runs it (`stage` built with its
    actions, `last_layer` the stage's last layer's cost): its outputs kept in output_chunks from each
    forward to the next step (rules.outputs_held), not among the buffers (the cost model's
    held_outputs_bytes, M - k of them there) nor the stage's ends (`ends`: its kept bytes less its layers',
    with_ends); the last stage's merge of them at the step's end. Where each microbatch's input gradient
    stays on its receive buffer's `.grad` to the next step (the record's input_grads_held_to_step_end;
    `first_layer` the stage's first layer's cost), or GPipe's send holds it to the step's end (gpipeheld.sends_held:
    kept here to the next step's start, past the wait, an upper bound), each is made at its backward and kept, not among the
    buffers (rules.held_input_grads of them there); else the one being sent stays one block there. The output a
    1F1B warm-up send keeps (warmupsend.held_send_bytes, among the cost model's buffers) is a tensor of its own: its
    own block, not part of the buffers' (which would put it in the batch's segment)."""
    from planner.cost.rules import held_input_grads, held_outputs_bytes, outputs_held
    from planner.cost.warmupsend import held_send_bytes

    pipeline = setup.pipeline
    kept = outputs_held(stage_index, pipeline.stages, setup.training, ranks=pipeline.stages)
    output = last_layer.output_bytes if kept else 0
    grads_kept = first_layer is not None and stage_index > 0 and first_layer.input_grad and (
        runtimes.of(setup.training).input_grads_held_to_step_end or gpipeheld.sends_held(stage_index, setup))
    input_grad = first_layer.input_bytes if grads_kept else 0
    counted = held_input_grads(stage_index, setup) * input_grad  # what the buffers hold of them
    microbatches = max(mb for _, mb in stage.actions) + 1
    last = stage_index == pipeline.stages - 1
    send = held_send_bytes(last_layer, stage_index, setup)
    return Fsdp2Rank(
        chunks=(with_ends(replace(stage, actions=(), buffer_bytes=0), ends - output),),
        actions=tuple((0, kind, mb) for kind, mb in stage.actions), num_microbatches=microbatches,
        # the microbatches not replayed (replayed_microbatches) keep theirs among the buffers
        buffer_bytes=int(stage.buffer_bytes - held_outputs_bytes(last_layer, stage_index, setup) - counted - send
                         + (pipeline.microbatches - microbatches) * (output + input_grad)),
        output_bytes=(output,), input_grad_bytes=(input_grad,),
        merged_bytes=pipeline.microbatches * output if last else 0, held_send_bytes=send)


def rank_of(plan: StagePlan, cost, *, rank: int, profile: Profile, setup: TrainSetup) -> Fsdp2Rank:
    """Rank `rank`'s replay input (`plan` its StagePlan, chunks and all; `cost` its StageCost): each
    chunk's layers as fsdp2_layers.chunk_layers makes them, its ends from its stage's own sums, what
    the schedule holds per microbatch (chunked.sends_held_bytes), the rank's buffers less what the replay
    makes itself (each chunk's kept reduce-scatter input)."""
    from planner.cost.assembly import option_indices, stage_sums
    from planner.cost.chunked import schedule_of, sends_held_bytes, stages_view
    from planner.cost.fsdp2_layers import (
        chunk_layers,
        loss_forward_program,
        loss_program,
        loss_tensor_bytes,
    )
    from planner.cost.gathered import fsdp_unit_loss_bytes, kept_reduce_scatter_input_bytes
    from planner.cost.layers import layer_costs
    from planner.cost.rules import outputs_held
    from planner.cost.schedules import build_schedule
    from planner.cost.terms import Context, stage_value

    order = schedule_of(setup)
    view = stages_view(setup, order)
    record, pipeline = runtimes.of(setup.training), setup.pipeline
    by_name = {layer.name: layer for layer in layer_costs(profile)}
    costs = [[by_name[name] for name in names] for names in plan.chunks]
    scratch_per_param = cost.step_scratch_bytes / max(1, sum(c.param_count for chunk in costs for c in chunk))
    last_stage = order.num_stages - 1
    chunks, outputs, input_grads, static_sum, kept_inputs, merged = [], [], [], 0.0, 0.0, 0
    for layers, stage in zip(costs, order.stages_of(rank)):
        options = option_indices(plan, layers)
        made = chunk_layers(layers, options, profile=profile, setup=view, piped=True,
                            scratch_per_param=scratch_per_param)
        sums = stage_sums(layers, options, stage=stage, profile=profile, setup=view)
        output, input_grad = sends_held_bytes(layers[0], layers[-1], stage=stage, order=order, training=setup.training)
        # the replay allocates the held output as one tensor of its own size: the loss value that rides with it in
        # the cost model's counts (lossvalues.walked_value_bytes) is a 4 B tensor of the small pool, not part of it
        output -= lossvalues.walked_value_bytes(stage, order, setup.training)
        loss_extra = stage_value("extra", stage, Context(profile, view)) - fsdp_unit_loss_bytes(profile, stage, view) \
            if stage == last_stage else 0.0
        chunks.append(with_ends(Fsdp2Stage(
            layers=made.layers, kept_from_forward=frozenset(layer.unit for layer in made.layers),
            shard_group=dataparallel.shard_size(setup), reduce_ratio=made.reduce_ratio, buffer_bytes=0,
            loss_kept_bytes=0, loss_extra_bytes=int(max(0.0, loss_extra)), root_units=made.root_units,
            keeps_last_input=record.keeps_last_reduce_scatter_input, loss_tensor_bytes=loss_tensor_bytes(profile, view),
            loss_program=loss_program(profile, view, int(max(0.0, loss_extra))) if stage == last_stage else (),
            loss_forward=loss_forward_program(profile, view) if stage == last_stage else ()),
            # the stage's ends less its output, which output_chunks keeps past the backward (Fsdp2Rank)
            sums.kept_bytes - made.kept_bytes - output))
        outputs.append(output)
        input_grads.append(input_grad)
        static_sum += made.static_bytes
        kept_inputs += kept_reduce_scatter_input_bytes(profile, stage, view)
        if stage == last_stage and outputs_held(stage, order.num_stages, setup.training, ranks=order.num_ranks):
            merged = pipeline.microbatches * layers[-1].output_bytes
    microbatches = replayed_microbatches(pipeline)
    walked = build_schedule(pipeline.schedule, num_ranks=pipeline.stages, num_microbatches=microbatches,
                            num_chunks=pipeline.chunks)
    return Fsdp2Rank(
        chunks=tuple(chunks), actions=tuple((a.chunk, a.kind, a.microbatch) for a in walked.actions[rank]),
        num_microbatches=microbatches,
        # the microbatches not replayed (replayed_microbatches) keep their outputs and input gradients among them
        buffer_bytes=int(cost.buffer_bytes - kept_inputs + max(0.0, cost.static_bytes - static_sum)
                         + (pipeline.microbatches - microbatches) * (sum(outputs) + sum(input_grads))),
        output_bytes=tuple(outputs), input_grad_bytes=tuple(input_grads), merged_bytes=merged)
