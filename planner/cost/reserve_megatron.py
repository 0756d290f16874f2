"""A rank's reserved peak under Megatron-LM (one pipeline stage a rank: forward_backward_no_pipelining, or
forward_backward_pipelining_without_interleaving; DDP with or without the distributed optimizer), from the
caching allocator's replay (allocator.replay) of its allocations in the order Megatron-LM makes them. Read at
Megatron-LM d98e8a64 (2026-08-22) and the TransformerEngine its pyproject.toml pins (4329ff84); file and line
for each in docs/framework-facts.md §43:

- the model is built on the GPU, each parameter its own tensor in the weights' dtype (training.py get_model
  2458-2465: model_module.cuda unless FSDP2 or the meta device);
- DDP (param_and_grad_buffer.py _ParamAndGradBuffer.__init__) allocates the buffer's bf16 param_data (1181-1188,
  only under the distributed optimizer) and then its fp32 grad_data (1190-1194), each whole, then points each
  parameter into param_data and drops its own tensor (1304-1310: `param.data = new_param_data; ...; del
  old_param_data`): the model's tensors are freed into the cache, where the optimizer and the activations
  reuse them. main_grad is a view of grad_data (1365-1367); the bucketed reduce-scatter and all-gather run in
  place on views of the two buffers (710-723, 508-523): no allocation;
- the optimizer: under the distributed optimizer each parameter's fp32 main shard is
  `shard_model_param.clone().float()` (distrib_optimizer.py 445: a bf16 clone, its fp32 copy, the clone
  freed); without it `param.detach().clone().float()` whole (optimizer.py 1012). The shard's gradient is
  main_grad's view (`.float()` of fp32, distrib_optimizer.py 2792: no copy). Adam is TransformerEngine's
  FusedAdam (optimizer/__init__.py 14), which makes each parameter's exp_avg then exp_avg_sq at its first
  step() (TE fused_adam.py 452-460, 616: `if len(state) == 0: self.initialize_state`), into what the first
  step's activations left cached; its multi-tensor kernel updates in place: no step scratch;
- the schedule (schedules.py): 1F1B's warm-up min(P - s - 1, M) forwards, then forward-backward pairs, then
  the cool-down backwards (2277-2475); with one stage, each microbatch's forward then backward (814-860). A
  received input or output gradient is a new torch.empty (p2p_communication.py 335-349). A stage's output is
  freed once sent (deallocate_output_tensor 171-201: `.data` set to a 1-element tensor; on by
  deallocate_pipeline_outputs, training/argument_utils.py 305); in the steady state the output gradient is
  received before that (send_forward_recv_backward, 2416-2423) and the next input after the backward
  (send_backward_recv_forward, 2446). The schedule's variables keep the last output gradient until the next
  one is received, the last input gradient until the next backward returns (backward_step 539-599 returns
  x.grad, retained on the input: 561), and the model keeps the last forward's input (set_input_tensor, 506)
  past the step, to the next step's first forward (RuntimeFacts.keeps_last_input_and_grad);
- the last stage's loss: vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py 25, 62, 77, 181) makes the
  fp32 copy of the bf16 logits and works in place on it, saving it (the runtime's loss region, kept_x the
  logits' bytes, here 2); the logits are dropped once the loss is made; its backward hands the fp32 gradient
  (the same storage) to `.float()`'s backward, which makes the bf16 logits' gradient and drops the fp32 one;
- the cuBLAS workspaces (torch's, Transformer Engine's: afterstep.workspace_bytes) and Megatron-core's global
  buffer (afterstep.global_buffer_bytes: the local spec's, the last stage's output layer's) are made at the
  first forward and kept.

The layers' own allocations are each layer's AllocRecord for its recompute option (as reserve.py plays
them, planner/cost/reserve.py _Step), holding what Transformer Engine's layers save where the cost model charges
it (planner/cost/te_kept.py te_record: the fused SwiGLU's input, TE's FP8 saved inputs), not TE's kernels' own
sequence; Float8 primary weights are held at their bytes, or TE's cached FP8 weight copies made at the first
forward (bridgeterms.fp8_param_saving_bytes, as static charges them); TE's fused cross-entropy keeps the logits
and makes no fp32 copy (te_loss_record); what the cost model's
allocated peak holds beyond the replay's is added in 2 MiB segments (reserve.reserved_bytes). Not replayed:
the distributed optimizer's per-rank ranges (each parameter's main shard is taken as 1/K of it; the rank's
range cuts through parameters, so a rank holds some whole, some in part, some not at all), gradient
clipping's and the NaN check's small norms, and NCCL's buffers (outside the allocator, workspace_bytes). The
interleaved schedule (several chunks a rank) is reserve_megatron_chunks.py's, from this module's pieces; Megatron-FSDP's
(ZeRO 3 under its double buffer, one stage) reserve_megatron_fsdp.py's. The allocator runs expandable segments where the
job states them (--expandable-segments; Megatron-LM's launch scripts were not read: the default segments).

Nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.cost import (
    afterstep,
    allocator,
    bridgeterms,
    dataparallel,
    megatron_fsdp,
    runtime_fp16,
    runtimes,
    te_offload,
)
from planner.cost.allocator import Alloc, Event, Free, Replayed
from planner.cost.fsdp2_layers import parameter_parts, tensor_split
from planner.cost.reserve import plan_records
from planner.cost.reserve_fsdp2 import expandable_segments
from planner.cost.reserve_window import layer_passes
from planner.cost.rules import batch_bytes, profile_tp
from planner.schema import AllocRecord, LayerProfile, Profile, StagePlan, TrainSetup

INTERLEAVED = "interleaved-1F1B"  # Megatron-LM's virtual pipeline stages (reserve_megatron_chunks.py)
STEPS = 2  # the first step makes Adam's state after its activations; the second runs as every later one
# The steps a replay plays at most: as FSDP2's (fsdp2_events.MAX_STEPS), it stops at the first step past STEPS that
# raises neither peak (allocator.settled_replay). Megatron-LM logs the peaks over the run, never reset (d98e8a64
# training.py 3445 allocated_bytes.all.peak; training/utils/common_utils.py 323-325 max_memory_allocated /
# max_memory_reserved; no reset_peak_memory_stats in megatron/training), so the settled figure is what a later step logs
MAX_STEPS = 8


@dataclass(frozen=True)
class MegatronStatic:
    """What the rank allocates before and beside its step, per parameter tensor in the weights' dtype
    (`tensors`: each layer's), and the ratios Megatron-LM's buffers and optimizer hold them at."""

    tensors: tuple[tuple[int, ...], ...]
    distributed: bool  # the distributed optimizer (ZeRO 1): param_data, main params per shard
    grad_ratio: float  # main_grad's bytes over the weights' (fp32 over bf16: 2)
    main_ratio: float  # the fp32 main shard's bytes over the weights' (4 / 2 / K; without sharding 4 / 2)
    moment_ratio: float  # one Adam moment's bytes over the weights' (4 / 2 / K)
    clone_ratio: float  # the bf16 clone the main shard is made from (1 / K)
    rest_bytes: int  # static beyond these, and the batch the schedule holds: one block after the optimizer
    workspaces: tuple[int, ...] = ()  # the cuBLAS workspaces made at the first forward
    # per layer, the weights' bytes the model holds over `tensors`' (Float8 primary weights at 1 B: under 1)
    weight_scale: tuple[float, ...] = ()
    te_weight_copies: tuple[int, ...] = ()  # per layer, TE's cached FP8 weight copy, made at the first forward
    chunk_layers: tuple[int, ...] = ()  # layers a model chunk, chunk 0 first (each its own DDP); (): one chunk
    global_buffer: int = 0  # Megatron-core's global buffer (afterstep.global_buffer_bytes), made at the first forward


def replays(setup: TrainSetup) -> bool:
    """Whether this replay orders the setup's step: a runtime whose record says Megatron-LM's step
    (megatron_step_replayed), one stage a rank or Megatron-LM's interleaved schedule (several chunks a rank:
    reserve_megatron_chunks.py), DDP or the distributed optimizer (ZeRO 0 or 1; ZeRO 3 under Megatron-FSDP's
    double buffer is reserve_megatron_fsdp.py's, ZeRO 2 not read)."""
    record, pipeline = runtimes.of(setup.training), setup.pipeline
    schedule = pipeline.chunks == 1 or pipeline.schedule == INTERLEAVED
    return record.megatron_step_replayed and schedule and setup.data_parallel.zero <= 1


def schedule_order(stages: int, stage: int, num_microbatches: int) -> list[tuple[str, int]]:
    """Megatron-LM's 1F1B order for rank `stage` (schedules.py 2277-2475): min(P - s - 1, M) warm-up
    forwards, forward-backward pairs, the cool-down backwards; one stage: forward, backward per microbatch."""
    warmup = min(stages - stage - 1, num_microbatches)
    order = [("F", mb) for mb in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]


def replayed_microbatches(stages: int, stage: int, num_microbatches: int) -> int:
    """The warm-up and three steady pairs: each pair frees what the pair before made, so the cache is
    where the rest of the step keeps it; the replay's cost is bounded by the stages, not M."""
    return min(num_microbatches, min(stages - stage - 1, num_microbatches) + 3)


def loss_record(logits_bytes: int, kept_x: float) -> AllocRecord:
    """The vocab-parallel cross-entropy on `logits_bytes` of bf16 logits: forward, the fp32 copy it keeps
    (kept_x the logits' bytes); backward, the bf16 logits' gradient made (handed back), the fp32 one freed."""
    return AllocRecord(forward=[int(logits_bytes * kept_x)], backward=[logits_bytes, -1], output=0, input_grad=2)


def te_loss_record(tokens: int) -> AllocRecord:
    """Transformer Engine's fused cross-entropy (docs/framework-facts.md §46: TE v2.9 cross_entropy.py 50-59, 76;
    triton/cross_entropy.py 266-372): its forward makes the fp32 loss and three fp32 statistics a token, writes
    the gradient into the logits' own storage and keeps them (the logits, not this record's); its backward scales
    them in place and hands them back: nothing made, the loss freed. The statistics are its kernel's, freed once
    the loss is made."""
    per_token = 4 * tokens
    return AllocRecord(forward=[per_token, per_token, per_token, per_token, -2, -3, -4], backward=[-1], output=0,
                       input_grad=0)


def last_stage_loss(profile: Profile, setup: TrainSetup, logits_bytes: int) -> tuple[AllocRecord, bool]:
    """The last stage's loss record, and whether it keeps the logits to its backward (TE's fused cross-entropy,
    where the setup runs it and the record reads it: rules.runtime_loss's region); else megatron-core's
    vocab-parallel one on the logits' fp32 copy (loss_record)."""
    record = runtimes.of(setup.training)
    te_fused = getattr(setup.training, "te_cross_entropy", False) and record.te_cross_entropy is not None
    shape = profile.assumptions
    if te_fused and {"seq_len", "micro_batch_size"} <= set(shape):
        return te_loss_record(shape["seq_len"] // shape.get("cp", 1) * shape["micro_batch_size"]), True
    region = runtimes.loss_region(record, tp=profile_tp(profile), compiled=False,
                                  native_fused=getattr(setup.training, "fused_cross_entropy", False))
    return loss_record(logits_bytes, region.kept_x), False


def static_events(static: MegatronStatic) -> list[Event]:
    """The model's tensors, DDP's buffers (the tensors freed into them), chunk by chunk (each model chunk its own
    DDP, wrapped in turn), the optimizer's main params."""
    tensors = [(("param", i, j), size) for i, layer in enumerate(static.tensors) for j, size in enumerate(layer)]
    scale = static.weight_scale or (1.0,) * len(static.tensors)
    events: list[Event] = [Alloc(key, int(size * scale[key[1]])) for key, size in tensors]
    start = 0
    for c, count in enumerate(static.chunk_layers or (len(static.tensors),)):
        mine = [(key, size) for key, size in tensors if start <= key[1] < start + count]
        start += count
        total = sum(size for _, size in mine)
        held = sum(int(size * scale[key[1]]) for key, size in mine)
        if static.distributed:  # param_data, then grad_data; the model's own tensors freed into param_data
            events += [Alloc(("param_data", c), held), Alloc(("grad_data", c), int(total * static.grad_ratio))]
            events += [Free(key) for key, _ in mine]
        else:  # plain DDP: the tensors stay, grad_data beside them
            events.append(Alloc(("grad_data", c), int(total * static.grad_ratio)))
    for key, size in tensors:  # clone().float(): the clone, the main shard, the clone freed
        events += [Alloc(("clone", *key[1:]), int(size * static.clone_ratio)),
                   Alloc(("main", *key[1:]), int(size * static.main_ratio)), Free(("clone", *key[1:]))]
    events.append(Alloc(("rest",), static.rest_bytes))
    return events


def first_forward_events(static: MegatronStatic) -> list[Event]:
    """What the first forward makes and keeps: the cuBLAS workspaces, the local spec's global buffer, TE's cached
    FP8 weight copies."""
    return [*(Alloc(("workspace", n), size) for n, size in enumerate(static.workspaces)),
            *([Alloc(("global_buffer",), static.global_buffer)] if static.global_buffer else []),
            *(Alloc(("te_weight_copy", i), size) for i, size in enumerate(static.te_weight_copies) if size)]


def adam_state_events(static: MegatronStatic) -> list[Event]:
    """FusedAdam's first step: exp_avg then exp_avg_sq, per parameter."""
    return [Alloc(("moment", i, j, k), int(size * static.moment_ratio))
            for i, layer in enumerate(static.tensors) for j, size in enumerate(layer) for k in (0, 1)]


class _Holders:
    """Which of the schedule's references keep a tensor: a key is freed, into `events` (the step being made), when
    its last holder lets go."""

    def __init__(self, events: list[Event]) -> None:
        self.events, self.held = events, {}

    def hold(self, key, holder) -> None:
        self.held.setdefault(key, set()).add(holder)

    def drop(self, key, holder) -> None:
        holders = self.held.get(key)
        if holders is None:
            return
        holders.discard(holder)
        if not holders:
            del self.held[key]
            self.events.append(Free(key))
            for other in [k for k, hs in self.held.items() if ("on", key) in hs]:  # what it kept (x.grad)
                self.drop(other, ("on", key))


class _Step:
    """One model chunk's passes on a rank under Megatron-LM's schedule, appended to `events`: the layers' passes as
    reserve.py plays them, the receive buffers, the sent outputs and the schedule's references as Megatron-LM
    keeps them. `run` orders one chunk a rank (1F1B, or no pipeline); reserve_megatron_chunks.py orders several
    from the same pieces (receive_input, run_forward, drop_output, receive_output_grad, run_backward)."""

    def __init__(self, layers, options, records, *, loss: AllocRecord | None, first: bool, input_bytes: int,
                 events: list[Event], holders: _Holders, step: int, chunk: int = 0, keeps_logits: bool = False,
                 window: tuple[list[int], int] | None = None, handler: str = "v2.9") -> None:
        self.records, self.loss, self.first, self.input_bytes = records, loss, first, input_bytes
        self.keeps_logits = keeps_logits  # the loss keeps the logits to the backward (freed after the last layer's)
        self.events, self.holders, self.step, self.chunk = events, holders, step, chunk
        self.passes = layer_passes(layers, options, records, loss, self.events, window=window,  # TE's window or not
                                   handler=handler)
        self.last = len(records) - 1

    def key(self, mb: int) -> tuple[int, int, int]:
        return self.step, self.chunk, mb  # the passes' keys: a microbatch of this step and chunk

    def run(self, order: Sequence[tuple[str, int]]) -> None:
        for at, (kind, mb) in enumerate(order):
            if kind == "F":
                steady = at + 1 < len(order) and order[at + 1][0] == "B"
                self.forward(mb, receive_grad_for=order[at + 1][1] if steady else None)
            else:
                cooldown = at == 0 or order[at - 1][0] == "B"
                self.backward(mb, receive_grad=cooldown)
        self.release_variables()

    def release_variables(self) -> None:
        """The schedule function returns: its variables let go."""
        for holder in ("input_var", "grad_var", "ograd_var"):
            for key in [k for k, hs in self.holders.held.items() if holder in hs]:
                self.holders.drop(key, holder)

    def forward(self, mb: int, *, receive_grad_for: int | None) -> None:
        """1F1B's forward: recv_forward, the forward, send_forward_recv_backward in the steady state."""
        if not self.first:
            self.receive_input(mb, var=True)
        self.run_forward(mb)
        if receive_grad_for is not None and self.loss is None:  # send_forward_recv_backward
            self.receive_output_grad(receive_grad_for)
        self.drop_output(mb)

    def backward(self, mb: int, *, receive_grad: bool) -> None:
        """1F1B's backward: the input popped into the schedule's variable, recv_backward in the cool-down."""
        self.pop_input(mb, var=True)
        if receive_grad and self.loss is None:  # recv_backward (the cool-down)
            self.receive_output_grad(mb)
        self.run_backward(mb)

    def receive_input(self, mb: int, *, var: bool) -> None:
        """A received input (a new torch.empty), kept in the chunk's input list; `var`: the schedule's input
        variable moves to it (the previous one let go)."""
        key = ("in", self.key(mb))
        self.events.append(Alloc(key, self.input_bytes))
        if var:
            self._drop_all("input_var")
            self.holders.hold(key, "input_var")
        self.holders.hold(key, "list")

    def run_forward(self, mb: int) -> None:
        """set_input_tensor (the chunk's model keeps its last input), then the layers' forwards."""
        if not self.first:
            key = ("in", self.key(mb))
            self.holders.hold(key, ("model", self.chunk))
            for old in [k for k, hs in self.holders.held.items() if ("model", self.chunk) in hs and k != key]:
                self.holders.drop(old, ("model", self.chunk))  # the model's reference moves on
        self.passes.forward(self.key(mb))

    def drop_output(self, mb: int) -> None:
        """The logits once the loss is made; else the output once sent (deallocate_output_tensor's 1-element
        tensor in its place)."""
        if self.records[self.last].output and not (self.loss is not None and self.keeps_logits):
            self.events.append(Free((self.key(mb), self.last, self.records[self.last].output)))
        if self.loss is None:
            self.events.append(Alloc(("stub", self.key(mb)), 1))

    def receive_output_grad(self, mb: int, *, var: bool = True) -> None:
        """A received output gradient; `var`: held by the schedule's variable until the next one is received,
        else only by the chunk's list (freed after its backward: free_output_grad)."""
        key = ("ograd", self.key(mb))
        self.events.append(Alloc(key, _output_bytes(self.records[self.last])))
        if var:
            self._drop_all("ograd_var")
            self.holders.hold(key, "ograd_var")
        else:
            self.holders.hold(key, "list")

    def free_output_grad(self, mb: int) -> None:
        self.holders.drop(("ograd", self.key(mb)), "list")

    def pop_input(self, mb: int, *, var: bool) -> None:
        """input_tensor = input_tensors.pop(0): out of the chunk's list; `var`: into the schedule's input variable
        (1F1B's), the previous one let go."""
        if self.first:
            return
        key = ("in", self.key(mb))
        if var:
            for old in [k for k, hs in self.holders.held.items() if "input_var" in hs and k != key]:
                self.holders.drop(old, "input_var")
            self.holders.hold(key, "input_var")
        self.holders.drop(key, "list")

    def run_backward(self, mb: int) -> None:
        """The layers' backwards, the input's gradient kept by the schedule's variable and the input's .grad,
        the 1-element output freed."""
        sent = len(self.events)
        self.passes.backward(self.key(mb))
        grad = (self.key(mb), 0, self.records[0].input_grad)
        at = next((n for n in range(len(self.events) - 1, sent - 1, -1) if self.events[n] == Free(grad)), None)
        if self.records[0].input_grad and at is not None:
            del self.events[at]  # sent, and kept by the schedule's variable and the input's .grad
            self._drop_all("grad_var")
            self.holders.hold(grad, "grad_var")
            self.holders.hold(grad, ("on", ("in", self.key(mb))))
        if self.loss is None:
            self.events.append(Free(("stub", self.key(mb))))

    def _drop_all(self, holder) -> None:
        for old in [k for k, hs in self.holders.held.items() if holder in hs]:
            self.holders.drop(old, holder)


def step_player(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord], *,
                static: MegatronStatic, stage: int, stages: int, num_microbatches: int, loss: AllocRecord | None,
                input_bytes: int, keeps_logits: bool = False, window: tuple[list[int], int] | None = None,
                handler: str = "v2.9") -> tuple[list[Event], Callable[[int], list[Event]]]:
    """The rank's static allocations, and the function making step `index`'s events (step 0 makes the cuBLAS
    workspaces at its first forward and Adam's state after its backwards); the steps share the schedule's
    references (the model's last input is let go at the next step's first forward). `loss`: the last stage's
    (last_stage_loss), else None; `keeps_logits`: it keeps the logits to its backward; `window`: the layers
    Transformer Engine's offload window runs (te_offload.plan_window), else None, `handler` the TE handler that
    runs it (the record's te_window_handler)."""
    holders = _Holders([])
    order = schedule_order(stages, stage, replayed_microbatches(stages, stage, num_microbatches))

    def one_step(index: int) -> list[Event]:
        events = holders.events = first_forward_events(static) if index == 0 else []
        _Step(layers, options, records, loss=loss, first=stage == 0, input_bytes=input_bytes, events=events,
              holders=holders, step=index, keeps_logits=keeps_logits, window=window, handler=handler).run(order)
        if index == 0:
            events += adam_state_events(static)
        return events

    return static_events(static), one_step


def step_events(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord], *,
                static: MegatronStatic, stage: int, stages: int, num_microbatches: int,
                loss: AllocRecord | None, input_bytes: int, steps: int = STEPS,
                keeps_logits: bool = False) -> list[Event]:
    """The rank's static allocations, then `steps` steps (step_player's), as allocator events."""
    events, one_step = step_player(layers, options, records, static=static, stage=stage, stages=stages,
                                   num_microbatches=num_microbatches, loss=loss, input_bytes=input_bytes,
                                   keeps_logits=keeps_logits)
    for index in range(steps):
        events += one_step(index)
    return events


# ---------------------------------------------------------------- the stage from the cost model's terms


def replay_stage(plan: StagePlan, cost, *, stage: int, profile: Profile, setup: TrainSetup,
                 cap_bytes: int | None = None) -> Replayed | None:
    """Rank `stage`'s replay (`cost`: its StageCost, for the static total and buffers); None where a layer
    has no record for its option, or the last stage's logits are not known."""
    layers, options, records = plan_records(plan, profile)
    if records is None:
        return None
    pipeline = setup.pipeline
    last = stage == pipeline.stages - 1
    loss, keeps_logits = None, False
    if last:
        logits = _output_bytes(records[-1])
        if not logits:
            return None
        loss, keeps_logits = last_stage_loss(profile, setup, logits)
    static = static_of(layers, cost, stage=stage, profile=profile, setup=setup)
    events, one_step = step_player(layers, options, records, static=static, stage=stage, stages=pipeline.stages,
                                   num_microbatches=pipeline.microbatches, loss=loss,
                                   input_bytes=layers[0].input_bytes if stage > 0 else 0, keeps_logits=keeps_logits,
                                   window=te_offload.plan_window([layer.kind for layer in layers], options, setup),
                                   handler=te_offload.handler_of(setup))
    return allocator.settled_replay(events, one_step, min_steps=STEPS, max_steps=MAX_STEPS,
                                    expandable=expandable_segments(profile, setup), cap_bytes=cap_bytes)


def allocator_setting_refused(profile: Profile, setup: TrainSetup) -> str | None:
    """The sentence refusing a stated --expandable-segments / --no-expandable-segments under Megatron-LM where
    its replay does not run (reserve_fsdp2.allocator_setting_refused says it for a cpu profile or a stated
    --fragmentation); None where the replay reads it, or nothing is stated."""
    stated = getattr(setup.training, "expandable_segments", None)
    record = runtimes.of(setup.training)
    if stated is None or not record.megatron_step_replayed or replays(setup) or megatron_fsdp.step_replayed(setup):
        return None
    flag = "--expandable-segments" if stated else "--no-expandable-segments"
    return (f"{flag} changes the caching allocator's replay, and the replay of Megatron-LM's step runs one stage a "
            "rank or its interleaved schedule, under ZeRO 0 or 1, or Megatron-FSDP's double buffer on one stage; "
            "this setup's reserve is the fragmentation margin's: drop it")


def static_of(layers: Sequence[LayerProfile], cost, *, stage: int, profile: Profile, setup: TrainSetup,
              chunk_layers: tuple[int, ...] = ()) -> MegatronStatic:
    """The rank's tensors (each layer's parameters on this rank, its experts over EP, in the weights' dtype,
    split as the layer's tensors: fsdp2_layers.parameter_parts) and the ratios of dataparallel.param_bytes;
    what the cost model's static holds beyond them and the batch the schedule holds (rules.batch_bytes), one
    block. The receive buffers of the cost model's buffer bytes the replay makes itself."""
    held, record = dataparallel.param_bytes(setup), runtimes.of(setup.training)
    k = dataparallel.shard_size(setup)
    ep = setup.data_parallel.ep
    tensors = tuple(tensor_split((layer.param_count - layer.expert_param_count + layer.expert_param_count // ep)
                                 * held.shard_weights, parameter_parts(layer, profile.assumptions)) for layer in layers)
    master = record.master_bytes if runtime_fp16.mixed(setup.training.precision) else 0
    moment = (held.optim - master) / 2
    weights = sum(map(sum, tensors))
    # Transformer Engine's Float8 weights (bridgeterms.fp8_param_saving_bytes, as static charges them): FP8
    # primary weights held at fewer bytes (a saving), else TE's cached FP8 copy beside each (a cost)
    saving = [bridgeterms.fp8_param_saving_bytes(layer.float8.param_count if layer.float8 is not None else 0,
                                                 setup, profile) for layer in layers]
    scale = tuple(1 - max(0.0, cut) / sum(sizes) if sum(sizes) else 1.0 for cut, sizes in zip(saving, tensors))
    copies = tuple(int(max(0.0, -cut)) for cut in saving)
    made = weights * (1 + held.grads / held.shard_weights + (master + 2 * moment) / held.shard_weights / k) \
        - sum(max(0.0, cut) for cut in saving) + sum(copies)
    return MegatronStatic(
        tensors=tensors, distributed=setup.data_parallel.zero == 1, grad_ratio=held.grads / held.shard_weights,
        main_ratio=master / held.shard_weights / k, moment_ratio=moment / held.shard_weights / k,
        clone_ratio=1 / k if master else 0.0,
        rest_bytes=int(max(0.0, cost.static_bytes - made) + batch_bytes(profile, stage, setup)),
        workspaces=_workspaces(setup.training, profile, setup.comm), weight_scale=scale, te_weight_copies=copies,
        chunk_layers=chunk_layers, global_buffer=afterstep.global_buffer_bytes(
            setup.training, profile, holds_output=afterstep.holds_last_stage(stage, setup.pipeline)))


def _workspaces(training, profile: Profile, comm=None) -> tuple[int, ...]:
    record = runtimes.of(training)
    if profile.device.type != "cuda":
        return ()
    # the forward's thread's and autograd's, then Transformer Engine's (its userbuffers' too with `comm`), each its
    # own allocation
    return (*afterstep.torch_workspaces(record), *afterstep.te_workspaces(record, profile.device, training, comm))


def _output_bytes(record: AllocRecord) -> int:
    if not record.output:
        return 0
    sizes = [code for code in record.forward if code > 0]
    return sizes[record.output - 1] if record.output <= len(sizes) else 0

