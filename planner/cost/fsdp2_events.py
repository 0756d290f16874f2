"""The events of FSDP2's step as the caching allocator's replay runs them (reserve_fsdp2.py, whose
docstring holds each fact with its file and lines at torch 2.6.0): a stage's layers and units
(Fsdp2Layer, Fsdp2Stage), and its step as allocator events on FSDP2's streams, one stage and one
microbatch (_Step) or one stage beside torch's pipelining (_PipelineStep). Several stages a rank:
fsdp2_chunks.py. Nothing here reads a file or prints."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.allocator import Alloc, Event, Free

DEFAULT, COPY_IN, REDUCE_SCATTER = 0, 1, 2  # the streams: the compute stream, FSDP2's two that allocate
STEPS = 2  # the first step fills the caches; the second reuses what the first left
# The steps a replay plays at most: it stops at the first step past STEPS that raises neither peak
# (allocator.settled_replay). Two are not always enough: on uniform_blocks(4) under torchtitan b5bcd76c, ZeRO 3
# over 4 ranks, the default segments, one microbatch's replay reserves 1812, 1908, 2100, 2100 MiB after 2, 3, 4,
# 5 steps (tests/test_fsdp2_accum.py); torchtitan logs max_reserved over the run, so the settled figure.
MAX_STEPS = 8


@dataclass(frozen=True)
class Fsdp2Layer:
    """One layer of the stage as the replay runs it: its unit, its activations (kept: made in its
    forward, freed in its backward; extra: its backward's scratch and recompute, made and freed
    there), and per parameter tensor its gathered bytes (the weights' dtype, or float8), its fp32
    shard, its optimizer state and step scratch on this rank."""

    unit: int
    kept_bytes: int
    extra_bytes: int
    gathered: tuple[int, ...]
    grads: tuple[int, ...]  # the unsharded gradients autograd makes, the weights' dtype
    shard: tuple[int, ...]
    state: tuple[int, ...]
    scratch: tuple[int, ...]
    # the extra as the tensors the backward makes, in order (fsdp2_layers.backward_program: n > 0 allocates n
    # bytes, the next id from 1; -k frees id k; what is alive freed at the layer's end); (): one block
    extra_program: tuple[int, ...] = ()
    # the program's id of the gradient of the layer's input (0: none made), kept past the layer's end and taken
    # by the previous layer as its received gradient (its program's first tensor), freed at that layer's end
    hands: int = 0
    # where autograd makes each weight's gradient inside the program (fsdp2_layers.grads_order): (the program's
    # index of the code it is made before, the gradient's index in `grads`), in the order made; the gradients
    # not listed are made after the program, in the parameters' order
    grads_at: tuple[tuple[int, int], ...] = ()
    # the layer's forward's requests beyond its kept block, coded as extra_program, made after it and freed by the
    # forward's end (fsdp2_layers.forward_program: a record's own transients, or a checkpointed block's forward as
    # its rerun makes it); (): its kept block alone
    forward_program: tuple[int, ...] = ()
    # the kept block as the tensors torch makes in the layer's forward, coded as extra_program, with the forward's
    # transients between (eager_norm.kept_program: the head's under an eager final norm); what it leaves alive is
    # what the layer keeps (kept_bytes in all), freed at its backward's end; (): one block of kept_bytes
    kept_program: tuple[int, ...] = ()
    # where the backward releases kept_program's tensors: (the index of extra_program's code each is freed before,
    # its id in kept_program), as grads_at (eager_norm.kept_frees); those not listed freed at the layer's end
    kept_frees: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Fsdp2Stage:
    layers: tuple[Fsdp2Layer, ...]
    kept_from_forward: frozenset[int]  # units not resharded after forward (kept gathered to their backward)
    shard_group: int  # K
    reduce_ratio: float  # the reduce dtype's bytes over the weights' (fp32 over bf16: 2)
    buffer_bytes: int  # held all iteration besides the static state (the batch)
    loss_kept_bytes: int  # what the loss and the stage's ends keep from a forward to its backward, beyond what
    # the loss's forward program leaves alive (its log-softmax result, fsdp2_layers.program_kept_bytes)
    loss_extra_bytes: int  # the loss's scratch
    # beside a pipeline: the rank's actions in torch's order ((F|B, microbatch); empty: one stage, one
    # microbatch), the units the root holds (reduced first by the stage's manual post-backward), and
    # whether the last reduce-scatter input stays to the next step (RuntimeFacts.keeps_last_reduce_scatter_input)
    actions: tuple[tuple[str, int], ...] = ()
    root_units: frozenset[int] = frozenset()
    keeps_last_input: bool = False
    # the loss's largest tensor (its fp32 logits): the loss's scratch is made as tensors of at most this
    # size, not one block (0: one block)
    loss_tensor_bytes: int = 0
    # the loss's scratch as torch's cross-entropy requests it (fsdp2_layers.loss_program, coded as the layers'
    # extra programs; (): tensors of loss_tensor_bytes), and what its forward makes and frees at the last stage's
    # forward (fsdp2_layers.loss_forward_program, what it leaves alive kept to the loss's backward; (): nothing
    # played there)
    loss_program: tuple[int, ...] = ()
    loss_forward: tuple[int, ...] = ()


def step_events(stage: Fsdp2Stage, *, steps: int = STEPS) -> list[Event]:
    """The stage's static state, then `steps` steps (zero_grad, forward, loss, backward, optimizer
    step) as allocator events on their streams."""
    events: list[Event] = []
    for i, layer in enumerate(stage.layers):
        events += [Alloc(("shard", i, j), size, DEFAULT) for j, size in enumerate(layer.shard)]
    events.append(Alloc(("buffers",), stage.buffer_bytes, DEFAULT))
    for step in range(steps):
        events += one_step(stage, step)
    return events


def one_step(stage: Fsdp2Stage, index: int) -> list[Event]:
    """Step `index`'s events (the first makes the optimizer's state)."""
    events: list[Event] = []
    (_PipelineStep if stage.actions else _Step)(stage, events, makes_state=index == 0).run()
    return events


class _Step:
    def __init__(self, stage: Fsdp2Stage, events: list[Event], *, makes_state: bool = False) -> None:
        self.stage, self.events, self.makes_state = stage, events, makes_state
        units = [layer.unit for layer in stage.layers]
        self.first = {u: units.index(u) for u in units}
        self.last = {u: len(units) - 1 - units[::-1].index(u) for u in units}
        # post_forward_order: a unit's post-forward runs after its last layer's forward
        self.post_forward = sorted(self.last, key=self.last.get)
        self.members = {u: [i for i, v in enumerate(units) if v == u] for u in self.last}
        self.kept: dict[object, list[object]] = {}  # each layer's kept tensors' keys (by microbatch beside a pipeline)

    def run(self) -> None:
        add = self.events.append
        for unit in self.last:  # zero_grad(set_to_none): last step's sharded gradients
            add(Free(("sharded_grad", unit)))
        self.forward()
        result = self.loss_forward()
        add(Alloc(("loss_kept",), self.stage.loss_kept_bytes, DEFAULT))
        self.loss_scratch()
        add(Free(("loss_kept",)))
        self.events += [Free(key) for key in result]
        self.backward()
        self.optimizer_step()

    def optimizer_step(self) -> None:
        """The first step's AdamW makes its state (_init_group: exp_avg, then exp_avg_sq, per parameter,
        in the default stream), then every step's foreach scratch is made and freed."""
        if self.makes_state:
            for i, layer in enumerate(self.stage.layers):
                n = len(layer.state) // 2
                for j in range(n):
                    self.events += [Alloc(("state", i, j), layer.state[j], DEFAULT),
                                    Alloc(("state", i, n + j), layer.state[n + j], DEFAULT)]
        scratch = [(("scratch", i, j), size) for i, layer in enumerate(self.stage.layers)
                   for j, size in enumerate(layer.scratch)]
        self.events += [Alloc(key, size, DEFAULT) for key, size in scratch]
        self.events += [Free(key) for key, _ in scratch]

    def loss_scratch(self) -> None:
        """The loss's scratch, made and freed: tensors of the loss's largest size (every tensor of a
        cross-entropy over the logits is the logits' shape, bf16 or fp32), the rest one more."""
        if self.stage.loss_program:
            self.events += [Free(key) for key in self.play(self.stage.loss_program, "loss_extra")]
            return
        total, piece = self.stage.loss_extra_bytes, self.stage.loss_tensor_bytes or self.stage.loss_extra_bytes
        sizes = [piece] * (total // piece) + ([total % piece] if total % piece else []) if piece else []
        self.events += [Alloc(("loss_extra", n), size, DEFAULT) for n, size in enumerate(sizes)]
        self.events += [Free(("loss_extra", n)) for n in range(len(sizes))]

    def play(self, program: tuple[int, ...], tag: str | tuple) -> list[object]:
        """A coded program (n > 0 allocates n bytes, the next id from 1; -k frees id k) on the compute stream,
        keyed (tag, id) (a tuple tag: (*tag, id)); returns the keys still alive."""
        keys: dict[int, object] = {}
        made = 0
        for code in program:
            if code > 0:
                made += 1
                keys[made] = (tag, made) if isinstance(tag, str) else (*tag, made)
                self.events.append(Alloc(keys[made], code, DEFAULT))
            else:
                self.events.append(Free(keys.pop(-code)))
        return list(keys.values())

    def make_kept(self, layer: Fsdp2Layer, tag: tuple) -> list[object]:
        """The layer's kept tensors made in its forward: its kept_program's (their keys (*tag, id)), else one block
        keyed `tag`; returns the keys its backward frees."""
        if layer.kept_program:
            return self.play(layer.kept_program, tag)
        self.events.append(Alloc(tag, layer.kept_bytes, DEFAULT))
        return [tag]

    def forward_scratch(self, layer: Fsdp2Layer, tag: tuple) -> None:
        """The layer's forward's requests beyond its kept block (its forward_program), made after the block on the
        compute stream; what the program leaves alive freed at the layer's forward end (nothing of it outlives the
        forward: the kept block holds what the layer keeps)."""
        if layer.forward_program:
            self.events += [Free(key) for key in self.play(layer.forward_program, tag)]

    def loss_forward(self, mb: int | None = None) -> list[object]:
        """The loss's forward's requests in torch's order (keyed by `mb` beside a pipeline); returns the keys of
        what it keeps to its backward (its log-softmax result, made while the copy and the shifted logits are
        alive), which the caller frees once the loss's backward scratch is done (autograd releases the saved
        `result` after its node runs)."""
        return self.play(self.stage.loss_forward, "loss_forward" if mb is None else ("loss_forward", mb))

    def extra(self, i: int, layer: Fsdp2Layer, handed: tuple[object, int] | None = None,
              held: dict[int, object] | None = None) -> list[object]:
        """Layer `i`'s backward extra made, as its program's tensors (one block without one), on the
        compute stream, with the weights' gradients the layer's `grads_at` places inside it (each made before
        the program's code at its index; those at its end after it); returns the keys still alive (freed at the
        layer's end). `handed`: the gradient the layer after it handed on (its key and bytes): the program's
        first tensor, the received gradient, is it where the sizes agree (autograd makes it once), not made
        again; else it is freed here and one made. `held`: the layer's kept tensors by their kept_program id, those
        its kept_frees place freed there (taken out of it)."""
        program = layer.extra_program or ((layer.extra_bytes,) if layer.extra_bytes else ())
        keys: dict[int, object] = {}
        if handed is not None and (not layer.extra_program or program[0] != handed[1]):
            self.events.append(Free(handed[0]))  # not this layer's received gradient: as before, made anew
            handed = None
        grads_at = layer.grads_at if layer.extra_program else ()
        made = 0
        frees = layer.kept_frees if layer.extra_program and held is not None else ()
        for at, code in enumerate(program):
            self.make_grads(i, layer, [j for p, j in grads_at if p == at])
            self.events += [Free(held.pop(n)) for p, n in frees if p == at]
            if code > 0:
                made += 1
                if made == 1 and handed is not None:
                    keys[made] = handed[0]
                    continue
                keys[made] = ("extra", i, made)
                self.events.append(Alloc(keys[made], code, DEFAULT))
            else:
                self.events.append(Free(keys.pop(-code)))
        self.make_grads(i, layer, [j for p, j in grads_at if p >= len(program)])
        return list(keys.values())

    def make_grads(self, i: int, layer: Fsdp2Layer, which: list[int]) -> None:
        """Layer `i`'s weights' gradients `which` (indices into its grads), in that order, on the compute stream."""
        self.events += [Alloc(("grad", i, j), layer.grads[j], DEFAULT) for j in which]

    def backward_layer(self, i: int, layer: Fsdp2Layer, handed: tuple[object, int] | None,
                       kept: list[object]) -> tuple[object, int] | None:
        """Layer `i`'s backward: its extra (with the weights' gradients it places), its other weights' gradients,
        the extra freed but the gradient it hands on, its kept tensors freed; returns what it hands on (key,
        bytes), or None."""
        held = {key[-1]: key for key in kept} if layer.kept_frees else None
        alive = self.extra(i, layer, handed, held)
        placed = {j for _, j in layer.grads_at} if layer.extra_program else set()
        self.make_grads(i, layer, [j for j in range(len(layer.grads)) if j not in placed])
        hands = ("extra", i, layer.hands) if layer.hands and ("extra", i, layer.hands) in alive else None
        self.events += [Free(key) for key in alive if key != hands]
        self.events += [Free(key) for key in kept if held is None or key in held.values()]
        return None if hands is None else (hands, _made_bytes(layer.extra_program, layer.hands))

    # ---------------------------------------------------------------- FSDP2's collectives

    def all_gather(self, unit: int) -> None:
        """foreach_all_gather on the copy-in stream: the staging buffer, the flat output."""
        gathered = self.unit_gathered(unit)
        k = self.stage.shard_group
        self.events += [Alloc(("staging", unit), -(-gathered // k), COPY_IN), Alloc(("ag_out", unit), gathered, COPY_IN),
                        Free(("staging", unit))]

    def copy_out(self, unit: int) -> None:
        """The unit's parameters' unsharded storages, on the default stream."""
        self.events += [Alloc(("unsharded", i, j), size, DEFAULT) for i in self.members[unit]
                        for j, size in enumerate(self.stage.layers[i].gathered)]

    def reshard(self, unit: int) -> None:
        self.events += [Free(("unsharded", i, j)) for i in self.members[unit]
                        for j in range(len(self.stage.layers[i].gathered))]

    def unit_gathered(self, unit: int) -> int:
        return sum(sum(self.stage.layers[i].gathered) for i in self.members[unit])

    # ---------------------------------------------------------------- the passes

    def forward(self) -> None:
        add, held_result = self.events.append, None
        for i, layer in enumerate(self.stage.layers):
            unit = layer.unit
            if i == self.first[unit]:  # pre_forward: unshard, then wait_for_unshard
                self.all_gather(unit)
                if held_result is not None:  # the previous unit's all-gather result, kept until now
                    add(Free(held_result))
                self.copy_out(unit)
                held_result = ("ag_out", unit)
            self.kept[i] = self.make_kept(layer, ("kept", i))
            self.forward_scratch(layer, ("forward", i))
            if i == self.last[unit] and unit not in self.stage.kept_from_forward:
                self.reshard(unit)  # post_forward
        if held_result is not None:  # the root's post-forward flushes the last result
            add(Free(held_result))

    def backward(self) -> None:
        add = self.events.append
        prefetched: set[int] = set()
        gathered = set(self.stage.kept_from_forward)
        reducing, handed = None, None
        for i in range(len(self.stage.layers) - 1, -1, -1):
            layer, unit = self.stage.layers[i], self.stage.layers[i].unit
            if i == self.last[unit]:  # pre_backward: unshard (no-op if gathered), copy out, prefetch
                if unit not in gathered:
                    if unit not in prefetched:
                        self.all_gather(unit)
                    self.copy_out(unit)
                    add(Free(("ag_out", unit)))
                    gathered.add(unit)
                at = self.post_forward.index(unit)
                target = self.post_forward[at - 1] if at > 0 else None
                if target is not None and target not in gathered and target not in prefetched:
                    self.all_gather(target)
                    prefetched.add(target)
            handed = self.backward_layer(i, layer, handed, self.kept.pop(i))
            if i == self.first[unit]:  # post_backward: reshard, drop the previous input, reduce
                self.reshard(unit)
                gathered.discard(unit)
                if reducing is not None:
                    add(Free(("rs_in", reducing)))
                reduced = int(sum(sum(self.stage.layers[m].grads) for m in self.members[unit]) * self.stage.reduce_ratio)
                add(Alloc(("rs_in", unit), reduced, DEFAULT))
                self.events += [Free(("grad", m, j)) for m in self.members[unit]
                                for j in range(len(self.stage.layers[m].grads))]
                # the reduce-scatter output, every parameter's sharded gradient a view of it
                add(Alloc(("sharded_grad", unit), -(-reduced // self.stage.shard_group), REDUCE_SCATTER))
                reducing = unit
        if handed is not None:  # the stage's input gradient (an embedding's, none: token ids)
            add(Free(handed[0]))
        if reducing is not None:  # the root's final callback drops the last input
            add(Free(("rs_in", reducing)))



def _made_bytes(program: tuple[int, ...], ident: int) -> int:
    """The bytes of the program's tensor `ident` (its ident-th allocation)."""
    return [code for code in program if code > 0][ident - 1]


class _PipelineStep(_Step):
    """A rank's step beside torch's pipelining (one stage a rank): FSDP2 gathers each unit at its
    first forward and keeps it (reshard_after_forward False under PP: torchtitan 9dec370
    parallelize_llama.py 324-339); every backward runs with gradient sync off, so each unit's
    post-backward upcasts its gradients to the reduce dtype at the first backward (alloc fp32, free
    the bf16: _fsdp_param.py 629-640) and adds into them after (642-648); after the stage's last
    backward, the stage calls every unit's post-backward in all_states order (the root's named_modules(): the
    root's own unit first where it holds parameters, Fsdp2Stage.root_units, then the others in module order), which
    reshards and reduce-scatters (pipelining/stage.py 636-652, torch 2.6.0; §660-§662)."""

    def run(self) -> None:
        self.begin()
        for kind, mb in self.stage.actions:
            self.forward_mb(mb) if kind == "F" else self.backward_mb(mb)
        self.reduce_all()
        self.optimizer_step()

    def begin(self) -> None:
        """zero_grad (set_to_none): the last step's sharded gradients; nothing gathered or upcast yet."""
        self.events += [Free(("sharded_grad", unit)) for unit in self.last]
        self.gathered: set[int] = set()
        self.upcast: set[int] = set()
        self.loss_kept: dict[int, list[object]] = {}  # each microbatch's loss result, its forward to its backward

    def forward_mb(self, mb: int) -> None:
        self.forward_layers(mb)
        self.forward_loss(mb)

    def forward_layers(self, mb: int) -> None:
        """The stage's layers' forward: FSDP2's gathers at each unit's first, every layer's kept bytes."""
        add, held_result = self.events.append, None
        for i, layer in enumerate(self.stage.layers):
            unit = layer.unit
            if i == self.first[unit] and unit not in self.gathered:
                self.all_gather(unit)
                if held_result is not None:
                    add(Free(held_result))
                self.copy_out(unit)
                held_result = ("ag_out", unit)
                self.gathered.add(unit)
            self.kept[mb, i] = self.make_kept(layer, ("kept", mb, i))
            self.forward_scratch(layer, ("forward", mb, i))
        if held_result is not None:
            add(Free(held_result))

    def forward_loss(self, mb: int) -> None:
        """What follows the layers on the stage's forward: the last stage's loss (torch's pipelining computes it
        once forward_one_chunk has returned the output: schedules.py _maybe_compute_loss), its result kept to the
        microbatch's backward, then what the stage's ends keep beyond it."""
        self.loss_kept[mb] = self.loss_forward(mb)
        self.events.append(Alloc(("rest", mb), self.stage.loss_kept_bytes, DEFAULT))

    def backward_mb(self, mb: int) -> None:
        add = self.events.append
        self.loss_scratch()
        add(Free(("rest", mb)))
        self.events += [Free(key) for key in self.loss_kept.pop(mb, ())]
        handed = None
        for i in range(len(self.stage.layers) - 1, -1, -1):
            layer = self.stage.layers[i]
            handed = self.backward_layer(i, layer, handed, self.kept.pop((mb, i)))
            if i == self.first[layer.unit]:  # the hook's post-backward, gradient sync off
                self.accumulate(layer.unit)
        if handed is not None:  # the stage's input gradient, sent to the stage before (freed here, as before)
            add(Free(handed[0]))

    def accumulate(self, unit: int) -> None:
        first = unit not in self.upcast
        for m in self.members[unit]:
            for j, size in enumerate(self.stage.layers[m].grads):
                if first:  # to_accumulated_grad_if_needed: the reduce-dtype copy, then the gradient freed
                    self.events.append(Alloc(("acc", m, j), int(size * self.stage.reduce_ratio), DEFAULT))
                self.events.append(Free(("grad", m, j)))
        self.upcast.add(unit)

    def reduce_all(self) -> None:
        add = self.events.append
        order = sorted(self.last, key=lambda u: (u not in self.stage.root_units, self.first[u]))
        for unit in order:
            self.reshard(unit)
            add(Free(("rs_in", "last")))  # the previous one (the last step's where the context kept it)
            reduced = int(sum(sum(self.stage.layers[m].grads) for m in self.members[unit]) * self.stage.reduce_ratio)
            add(Alloc(("rs_in", "last"), reduced, DEFAULT))
            self.events += [Free(("acc", m, j)) for m in self.members[unit]
                            for j in range(len(self.stage.layers[m].grads))]
            add(Alloc(("sharded_grad", unit), -(-reduced // self.stage.shard_group), REDUCE_SCATTER))
        if not self.stage.keeps_last_input:
            add(Free(("rs_in", "last")))
