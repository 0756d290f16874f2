"""A rank's reserved peak under DeepSpeed's ZeRO 3 (one pipeline stage, every block at one recompute option) from
the caching allocator's replay (allocator.settled_replay) of its allocations in the order DeepSpeed v0.6.2's code
makes them (the Azure runs' version, 32d97976; S = deepspeed/runtime/zero/stage3.py, P = partition_parameters.py,
C = partitioned_param_coordinator.py; docs/framework-facts.md §140, §103, §105, §124, §133):

- init (DeepSpeedZeroOptimizer_Stage3.__init__): the parameters' partitions are moved to the host one by one, the
  cache emptied, and brought back as one flat fp16 buffer (S 553-590 `defragment`, 776-793); then, where the
  optimizer is on the GPU, each sub-group's fp32 partition (`sub_group_size` elements, 1e9 by default: S 893-960),
  initialize_optimizer_states' fp32 gradient buffer of the largest sub-group, Adam's two moments made by a first
  optimizer step per sub-group, the buffer dropped (S 1279-1347); then the contiguous gradients' bucket of
  `reduce_bucket_size` elements (S 524-529) and the flat fp16 gradient partitions (S 532-545; on the host under
  the optimizer's offload). What the cost model's static bytes hold beyond these (persistent parameters, the rest)
  and its batch come first, one block;
- the step's gathers (C 204-300, 331-356; P 814-890): a submodule's pre-forward fetch gathers its parameters not
  yet available, then prefetches the trace's next ones, each call on the all-gather stream (its own pool): one
  parameter into its own buffer of ceil(n / K) x K elements; two or more into one flat buffer whose handle's wait
  copies each out (torch.cat) and drops it. Which run gathers and releases what is deepspeed_zero3.calls (the
  coordinator's walk at the setup's stage3 knobs). A released parameter's buffer is freed with record_stream on
  the compute stream (P 253-262): the replay caches it again once the compute has run the next submodule (the
  host one submodule ahead of the device);
- the layers' own allocations: each layer's AllocRecord for its option, as reserve.py plays it (the input freed
  after the forward unless the layer keeps it, else after its backward), a block's forward and backward records cut
  evenly into its submodules' runs (forward; recompute and backward), the gathers and releases between them;
- the gradients (S 1465-1545, 1640-1710): autograd makes each parameter's whole .grad in the weights' dtype as its
  submodule's backward ends; its hook reduces the bucket first if the gradient would pass `reduce_bucket_size`,
  copies a gradient that fits into the contiguous bucket (its .grad freed, record_stream on the reduce stream) and
  leaves a larger one in its own .grad; the bucket's reduce-scatter (on the reduce stream, in place for one
  gradient) then frees each .grad with record_stream: the replay caches them once the next bucket is reduced (a
  reduce-scatter of a bucket is done before the next bucket fills; the code waits only past two outstanding).
  Under the optimizer's offload each partition is copied to a device tensor of its size on the reduce stream
  before it goes to the host. The backward's epilogue reduces the last bucket and synchronizes (S 1390-1395);
- the optimizer step on the GPU (S 2094-2112, 2275-2320): per sub-group its gradients flattened (fp16) and cast to
  an fp32 gradient, the flat copy dropped, the fp32 one after the sub-group's step; under offload on the host.

The embedding and the head are gathered whole at their passes and released after (the coordinator's walk runs over
the blocks, as the cost model's terms). Not replayed: the persistent parameters' release and gather at the step's
end (a few MB), the norms' double scratch, the isinf / isnan masks, the loss scaler's checks. Nothing here reads a
file or prints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.cost import allocator, dataparallel, deepspeed_terms, deepspeed_zero3
from planner.cost.allocator import Alloc, Event, Free, Ready, Replayed, Sync
from planner.cost.reserve import RecordPlayer, _count, _keeps_input, plan_records
from planner.cost.reserve_fsdp2 import expandable_segments
from planner.cost.reserve_megatron import (
    MAX_STEPS,
    STEPS,
    _output_bytes,
    _workspaces,
    last_stage_loss,
)
from planner.cost.rules import batch_bytes
from planner.schema import (
    OPTION_FULL,
    OPTION_OFFLOAD,
    AllocRecord,
    LayerProfile,
    Profile,
    StagePlan,
    TrainSetup,
)

COMPUTE, GATHER, REDUCE = 0, 1, 2  # the streams: default, the all-gather stream, the reduce-and-partition stream
SUB_GROUP_DEFAULT = 1_000_000_000  # deepspeed/runtime/zero/constants.py 95 (v0.6.2): sub_group_size
FP32 = 4


@dataclass(frozen=True)
class DsStatic:
    """The rank's buffers from init, in bytes, and what the step reads of the setup."""

    rest: int  # the cost model's static and buffers beyond ZeRO's, and the batch
    partitions: int  # the flat fp16 parameter partitions
    sub_groups: tuple[int, ...]  # elements of each optimizer sub-group
    on_device: bool  # the optimizer (fp32 partitions, moments, gradient partitions) on the GPU
    bucket_numel: int  # reduce_bucket_size: the contiguous bucket's elements
    grad_partitions: int  # the flat fp16 gradient partitions (0 under offload)
    shards: int  # K, the ranks a parameter is partitioned over
    weight_bytes: float
    grad_bytes: float
    master_bytes: float  # fp32 a parameter
    moment_bytes: float  # one Adam moment a parameter
    checkpoint_in_cpu: bool = False  # DeepSpeed's cpu_checkpointing (planner/cost/deepspeed_ckpt.py)
    workspaces: tuple[int, ...] = ()


def replays(setup: TrainSetup) -> bool:
    """Whether this replay orders the setup's step: DeepSpeed's ZeRO 3 coordinator (deepspeed_terms.runs_zero3) on
    one pipeline stage of one chunk."""
    return deepspeed_terms.runs_zero3(setup) and setup.pipeline.stages == 1 and setup.pipeline.chunks == 1


def unique_params(layers: Sequence[LayerProfile], profile: Profile) -> int:
    """The stage's parameters, a tied one once."""
    names = {layer.name for layer in layers}
    copies = sum((len([n for n in item.layers if n in names]) - 1) * item.param_count for item in profile.tied
                 if any(n in names for n in item.layers))
    return sum(layer.param_count for layer in layers) - max(0, copies)


def static_of(layers: Sequence[LayerProfile], cost, *, profile: Profile, setup: TrainSetup) -> DsStatic:
    """The buffers at init (the module docstring) and the rest of the cost model's static and buffers."""
    k = dataparallel.shard_size(setup)
    held = dataparallel.param_bytes(setup)
    part = -(-unique_params(layers, profile) // k)
    master = FP32
    moment = (held.optim - master) / 2
    on_device = not setup.data_parallel.offload
    whole, tail = divmod(part, SUB_GROUP_DEFAULT)
    groups = (SUB_GROUP_DEFAULT,) * whole + ((tail,) if tail else ())
    bucket = int(deepspeed_terms.gradient_bucket_bytes(setup))
    partitions, grad_partitions = int(part * held.weights), int(part * held.grads) if on_device else 0
    ours = partitions + grad_partitions + (int(part * (master + 2 * moment)) if on_device else 0)
    rest = max(0, cost.static_bytes - ours) + max(0, cost.buffer_bytes - bucket) + batch_bytes(profile, 0, setup)
    return DsStatic(rest=int(rest), partitions=partitions, sub_groups=groups, on_device=on_device,
                    bucket_numel=int(bucket / held.weights) if bucket else 0, grad_partitions=grad_partitions,
                    shards=k, weight_bytes=held.weights, grad_bytes=held.grads, master_bytes=master,
                    moment_bytes=moment, checkpoint_in_cpu=bool(setup.data_parallel.checkpoint_in_cpu),
                    workspaces=_workspaces(setup.training, profile))


def static_events(static: DsStatic) -> list[Event]:
    """Init's allocations in the code's order (the module docstring)."""
    events: list[Event] = [Alloc(("rest",), static.rest), Alloc(("partitions",), static.partitions)]
    if static.on_device:
        events += [Alloc(("master", g), int(n * static.master_bytes)) for g, n in enumerate(static.sub_groups)]
        events.append(Alloc(("init_grad",), int(max(static.sub_groups, default=0) * FP32)))
        events += [Alloc(("moment", g, m), int(n * static.moment_bytes)) for g, n in enumerate(static.sub_groups)
                   for m in (0, 1)]
        events.append(Free(("init_grad",)))
    if static.bucket_numel:
        events.append(Alloc(("bucket",), int(static.bucket_numel * static.weight_bytes)))
    if static.grad_partitions:
        events.append(Alloc(("grad_partitions",), static.grad_partitions))
    return events


class Coordinator:
    """The blocks' runs and each run's gathers and releases (deepspeed_zero3.calls), by (block, pass)."""

    def __init__(self, block: Sequence[deepspeed_zero3.Submodule], *, options: Sequence[str],
                 setup: TrainSetup) -> None:
        reuse, bucket, live = deepspeed_terms.knobs(setup)
        runs, made = deepspeed_zero3.calls(block, layers=len(options), checkpointed=False, max_reuse_numel=reuse,
                                           prefetch_bucket=bucket, max_live=live,
                                           per_layer=[deepspeed_zero3.rerun_ranges(block, o) for o in options])
        self.block, self.runs, self.calls = block, runs, made
        self.by_pass: dict[tuple[int, bool], list[int]] = {}
        for step, (layer, phase, _) in enumerate(runs):
            self.by_pass.setdefault((layer, phase != "forward"), []).append(step)

    def numel(self, param: tuple[int, int, int]) -> int:
        return self.block[param[1]].param_numels[param[2]]


class _StepPlayer(RecordPlayer):
    """One step's passes on the rank, appended to `events`."""

    def __init__(self, layers, options, records, static: DsStatic, coordinator: Coordinator, *,
                 loss: AllocRecord, keeps_logits: bool, events: list[Event], step: int) -> None:
        self.layers, self.records, self.static, self.co = layers, records, static, coordinator
        self.loss, self.keeps_logits, self.events, self.step = loss, keeps_logits, events, step
        self.keeps = [_keeps_input(layer, option, record) for layer, option, record in zip(layers, options, records)]
        # cpu_checkpointing: the checkpoint (the layer's input) copied to the host in the forward, the GPU's freed
        # with the previous layer's output; brought back (a new tensor) before the rerun, freed with the backward
        self.in_cpu = {i: _kept(layer, option) for i, (layer, option) in enumerate(zip(layers, options))
                       if static.checkpoint_in_cpu and option == OPTION_FULL and layer.kind != "embedding"
                       and _kept(layer, option)}
        self.keeps = [keeps and i not in self.in_cpu for i, keeps in enumerate(self.keeps)]
        self.block_of = {}  # layer index -> its block's index in the coordinator's trace
        for i, layer in enumerate(layers):
            if layer.kind == "decoder_block":
                self.block_of[i] = len(self.block_of)
        self.gathered: dict[tuple, tuple] = {}  # a parameter -> its gathered buffer's key
        self.released: list[tuple] = []  # buffers freed on the compute stream, cached after the next run
        self.bucket: list[tuple] = []  # the gradients in the bucket waiting for its reduce
        self.bucket_numel = 0
        self.reducing: list[tuple] = []  # the last reduce's gradients: cached at the next reduce
        self.count = 0  # calls made, for their keys

    def run(self, microbatches: int) -> None:
        if self.step == 0:
            self.events += [Alloc(("workspace", n), size) for n, size in enumerate(self.static.workspaces)]
        for mb in range(microbatches):
            key = (self.step, mb)
            self.forward(key)
            self.backward(key)
        self.events += [Free(buffer, deferred=True) for buffer in self.gathered.values()]  # _partition_all_parameters
        self.gathered = {}
        self.events.append(Sync())
        if self.static.on_device:  # _prepare_fp32_grad_for_sub_group, the step, _release_sub_group
            for g, n in enumerate(self.static.sub_groups):
                flat, fp32 = ("flat_grad", self.step, g), ("fp32_grad", self.step, g)
                self.events += [Alloc(flat, int(n * self.static.grad_bytes)), Alloc(fp32, n * FP32), Free(flat),
                                Free(fp32)]

    # ------------------------------------------------------------ the passes

    def forward(self, key: tuple) -> None:
        for i, record in enumerate(self.records):
            if i in self.block_of:
                self._runs(record.forward, (key, i), self.co.by_pass[(self.block_of[i], False)], start=0)
            else:
                self._edge(i, record.forward, (key, i), start=0, backward=False)
            if i > 0 and not self.keeps[i]:
                self._free_output(key, i - 1)
        self._play(self.loss.forward, (key, "loss"), start=0)
        last = len(self.records) - 1
        if self.records[last].output and not self.keeps_logits:
            self._free_output(key, last)

    def backward(self, key: tuple) -> None:
        grad = self._loss_backward(key)
        last = len(self.records) - 1
        for i in range(last, -1, -1):
            record, start = self.records[i], _count(self.records[i].forward)
            if i in self.in_cpu:  # move_to_device(saved, cuda) before the rerun
                self.events.append(Alloc(("ckpt", key, i), self.in_cpu[i]))
            if i in self.block_of:
                self._runs(record.backward, (key, i), self.co.by_pass[(self.block_of[i], True)], start=start)
            else:
                self._edge(i, record.backward, (key, i), start=start, backward=True)
            if grad is not None:
                self.events.append(Free(grad))
            self._free_left(record, (key, i), keep=(record.output, record.input_grad))
            if i in self.in_cpu:
                self.events.append(Free(("ckpt", key, i)))
            if i == last:
                self._free_output(key, i)
            if i > 0 and self.keeps[i]:
                self._free_output(key, i - 1)
            grad = (key, i, record.input_grad) if record.input_grad else None
        if grad is not None:
            self.events.append(Free(grad))
        self._reduce()  # independent_gradient_partition_epilogue: the last bucket, then the stream synchronized
        self.events += [Ready(k) for k in self.reducing]
        self.reducing = []

    def _runs(self, codes: Sequence[int], scope: tuple, steps: Sequence[int], *, start: int) -> None:
        """A block's pass: its record cut evenly into the runs `steps`, each run's gathers before its piece, its
        gradients (a backward run) after, then its releases."""
        count, n = start, len(codes)
        for r, step in enumerate(steps):
            call = self.co.calls[step]
            self._fetch(call.fetched)
            self._fetch(call.prefetched)
            cached, self.released = self.released, []
            count = self._play(codes[r * n // len(steps):(r + 1) * n // len(steps)], scope, start=count)
            self.events += [Ready(k) for k in cached]
            layer, phase, j = self.co.runs[step]
            if phase == "backward":
                for t, numel in enumerate(self.co.block[j].param_numels):
                    self._grad(("grad", scope, j, t), numel)
            for param in call.released:
                self._release(param)

    def _edge(self, i: int, codes: Sequence[int], scope: tuple, *, start: int, backward: bool) -> None:
        """The embedding or the head: its parameters gathered whole, its record, its gradient, released."""
        numel = self.layers[i].param_count
        param = ("edge", i)
        self._fetch((param,), numel=numel)
        cached, self.released = self.released, []
        self._play(codes, scope, start=start)
        self.events += [Ready(k) for k in cached]
        if backward and numel:
            self._grad(("grad", scope), numel)
        self._release(param)

    # ------------------------------------------------------------ gathers and gradients

    def _fetch(self, params: Sequence[tuple], *, numel: int | None = None) -> None:
        """One all_gather_coalesced call (P 814-890) on the all-gather stream."""
        params = [p for p in params if p not in self.gathered]
        if not params:
            return
        k, size = self.static.shards, self.static.weight_bytes
        sizes = [numel if numel is not None else self.co.numel(p) for p in params]
        self.count += 1
        if len(params) == 1:
            self.gathered[params[0]] = buffer = ("gathered", self.step, self.count)
            self.events.append(Alloc(buffer, int(-(-sizes[0] // k) * k * size), GATHER))
            return
        flat = ("flat", self.step, self.count)
        self.events.append(Alloc(flat, int(sum(-(-n // k) for n in sizes) * k * size), GATHER))
        for p, n in zip(params, sizes):
            self.gathered[p] = buffer = ("gathered", self.step, self.count, p)
            self.events.append(Alloc(buffer, int(n * size), GATHER))
        self.events.append(Free(flat))

    def _release(self, param: tuple) -> None:
        buffer = self.gathered.pop(param, None)
        if buffer is not None:
            self.events.append(Free(buffer, deferred=True))
            self.released.append(buffer)

    def _grad(self, key: tuple, numel: int) -> None:
        """The parameter's .grad made, then its hook (S 1465-1510)."""
        self.events.append(Alloc(key, int(numel * self.static.grad_bytes)))
        if self.bucket_numel > 0 and self.bucket_numel + numel > self.static.bucket_numel:
            self._reduce()
        if self.bucket_numel + numel < self.static.bucket_numel:  # copied into the contiguous bucket
            self.events.append(Free(key, deferred=True))
        self.bucket.append((key, numel))
        self.bucket_numel += numel

    def _reduce(self) -> None:
        """__reduce_and_partition_ipg_grads: the bucket reduce-scattered, each gradient's partition moved, each
        .grad freed (record_stream on the reduce stream); the last reduce's cached."""
        if not self.bucket:
            return
        self.events += [Ready(k) for k in self.reducing]
        self.reducing = []
        for key, numel in self.bucket:
            if not self.static.on_device:  # grad_buffer.to(cuda) before the copy to the host (S 1641-1650)
                part = ("partition", key)
                self.events += [Alloc(part, int(-(-numel // self.static.shards) * self.static.grad_bytes), REDUCE),
                                Free(part)]
            self.events.append(Free(key, deferred=True))  # a no-op where the bucket's copy freed it
            self.reducing.append(key)
        self.bucket, self.bucket_numel = [], 0

    # ------------------------------------------------------------ reserve.py's pass helpers


def _kept(layer: LayerProfile, option: str) -> int:
    """The option's kept bytes (a whole-layer checkpoint's: its input)."""
    return next((o.kept_bytes for o in layer.recompute_options if o.name == option), 0)


def step_player(layers: Sequence[LayerProfile], options: Sequence[str], records: Sequence[AllocRecord], *,
                static: DsStatic, coordinator: Coordinator, num_microbatches: int, loss: AllocRecord,
                keeps_logits: bool) -> tuple[list[Event], Callable[[int], list[Event]]]:
    """The rank's init allocations, and the function making step `index`'s events (two microbatches at most: each
    makes the same requests)."""
    microbatches = min(num_microbatches, 2)

    def one_step(index: int) -> list[Event]:
        events: list[Event] = []
        _StepPlayer(layers, options, records, static, coordinator, loss=loss, keeps_logits=keeps_logits,
                    events=events, step=index).run(microbatches)
        return events

    return static_events(static), one_step


def replay_stage(plan: StagePlan, cost, *, profile: Profile, setup: TrainSetup,
                 cap_bytes: int | None = None) -> Replayed | None:
    """The rank's replay (`cost`: its StageCost, for the static total); None where a layer has no record for its
    option, a layer offloads (ckplan's own offload, not DeepSpeed's), the blocks are not all one whose submodules
    ckplan knows, or the logits are not known."""
    layers, options, records = plan_records(plan, profile)
    if records is None or OPTION_OFFLOAD in options:
        return None
    blocks = [(layer, option) for layer, option in zip(layers, options) if layer.kind == "decoder_block"]
    if not blocks:
        return None
    submodules = {deepspeed_terms.profile_block(profile, layer) for layer, _ in blocks}
    if None in submodules or len(submodules) != 1:
        return None
    logits = _output_bytes(records[-1])
    if not logits:
        return None
    loss, keeps_logits = last_stage_loss(profile, setup, logits)
    coordinator = Coordinator(submodules.pop(), options=[option for _, option in blocks], setup=setup)
    static = static_of(layers, cost, profile=profile, setup=setup)
    events, one_step = step_player(layers, options, records, static=static, coordinator=coordinator,
                                   num_microbatches=setup.pipeline.microbatches, loss=loss, keeps_logits=keeps_logits)
    return allocator.settled_replay(events, one_step, min_steps=STEPS, max_steps=MAX_STEPS,
                                    expandable=expandable_segments(profile, setup), cap_bytes=cap_bytes)
