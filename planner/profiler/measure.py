"""Measure every pipeline layer of a model, per microbatch: time, memory, parameters.

Three separate passes, so that tracking memory never slows what is timed:

1. saved activations: one grad-enabled forward of the whole chain (saved.py);
2. per layer, transient memory: one forward + backward under a memory tracker;
3. per layer, time: `warmup` + `repeats` forward + backward steps, each followed by
   the same step under torch.utils.checkpoint (the extra time is the recompute,
   which stops early once the last saved tensor is back, so it costs less than a
   whole forward); then as many optimizer steps per optimizer a plan can name,
   over a copy of the layer's parameters.

Each layer's selective recompute options (planner/runtime/recompute.py) go through the same three
passes (profiler/options.py): their kept bytes in pass 1, their transients in pass 2, and
their times in a job of their own, with half the repeats (options.option_repeats).

Each layer runs on its own input from the chain, detached, so its backward stops at
its input as it does at a pipeline cut. The input requires grad (when it is floating
point) for every layer but the first: a pipeline computes the gradient of every
stage's input except the batch's. Parameter grads are allocated before a layer is
measured, as they are in steady-state training with gradient accumulation, so the
backward's temporary weight grads are counted but the grads themselves (static
memory in the cost model) are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.cost.optimizers import OPTIMIZERS, make_optimizer
from planner.cost.tied import check_tieable, tied_params
from planner.errors import UserError
from planner.profiler import allocseq, options, sanity
from planner.profiler.kinds import buffer_bytes, input_grads, layer_kinds, lookup_param_count
from planner.profiler.saved import Layers, LossFn, saved_bytes
from planner.profiler.splitbackward import SplitTimeJob, split_per_option, split_time_job
from planner.profiler.storages import counted_bytes, memory_tracker, storage_nbytes
from planner.profiler.threads import at_fewer_threads
from planner.profiler.timing import FwdBwdJob, time_call, time_fwd_bwd, time_interleaved
from planner.profiler.transients import (  # noqa: F401  (the fake profiler reads them from here)
    _backward,
    _loss_transient_bytes,
    _transient_bytes,
    _transient_passes,
    forward_only_bytes,
)
from planner.profiler.userfault import blame
from planner.runtime.routing import Routing, find_experts, layer_routing
from planner.schema import (
    OPTION_FULL,
    OPTION_NONE,
    AllocRecord,
    LayerProfile,
    TiedSet,
)

TIED_SAMPLE_NUMEL = 1 << 24  # elements of a tied gradient timed when summed (64 MiB in fp32)
REMEASURE_ROUNDS = 2  # suspect layers are timed again this many times at most, then judged


@dataclass
class Measurement:
    layers: list[LayerProfile]
    batch_input_bytes: int
    loss_bytes: int
    loss_ms: float
    loss_transient_bytes: int
    batch_target_bytes: int
    warnings: list[str] = field(default_factory=list)  # what the measurement could not settle
    tied: list[TiedSet] = field(default_factory=list)  # parameters shared between layers
    loss_alloc: AllocRecord | None = None  # the loss's allocations and frees (fake profiles: allocseq)


def measure_model(
    layers: Layers,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    *,
    layer_outputs: list[torch.Tensor],
    warmup: int,
    repeats: int,
    on_layer: Callable[[str], None] = lambda name: None,
    on_progress: Callable[[int, int, str], None] = lambda done, total, what: None,
) -> Measurement:
    """`layer_outputs`: each layer's output on `inputs` (modelfile.check_chain returns
    them), i.e. the next layer's input. `on_layer(name)` is called as each layer is done;
    `on_progress(done, total, what)` after every piece of work (a layer set up, a round of
    timing every layer, a layer's optimizer steps), so a long first layer is not silence."""
    check_tieable(layers)  # sharing that a pipeline cannot keep tied is refused at the first command
    layer_inputs = [inputs, *layer_outputs[:-1]]
    needs_grad = input_grads(layers, layer_inputs)
    kinds = layer_kinds(layers, needs_grad)
    work = _Work(on_progress, total=2 * len(layers) + 1 + warmup + repeats)
    with blame("the MoE layers' routing"):
        routing = [layer_routing(layer, x) for (_, layer), x in zip(layers, layer_inputs, strict=True)]
    timed, warnings = [], []
    for index, (name, layer) in enumerate(layers):
        # Cut the graph at the layer's input, requiring a gradient as the model's forward makes it (input_grads)
        x = layer_inputs[index].detach().requires_grad_(needs_grad[index] and layer_inputs[index].is_floating_point())
        with blame(f"layer {name!r}"):
            timed.append(_TimedLayer.prepare(name, layer, x, layer_outputs[index]))
        warnings += timed[-1].failed_options(kinds[index])
        work.done(f"memory of layer {name}")
    chosen = options.common_per_kind(kinds, [list(t.option_transients) for t in timed])
    saved = saved_bytes(layers, inputs, targets, loss_fn, options=chosen)
    work.done("activations kept by every layer")
    chosen = options.saving_per_kind(kinds, chosen, saved.act_bytes, saved.option_bytes)
    for t, names in zip(timed, chosen, strict=True):
        t.time_options(names)
    time_interleaved([t.job for t in timed], warmup=warmup, repeats=repeats,
                     on_round=lambda step, steps: work.done(f"timing every layer, round {step}/{steps}"))
    option_jobs = [t.option_job for t in timed if t.option_job is not None]
    if option_jobs:
        rounds = min(warmup, 1) + options.option_repeats(repeats)
        work.grow(rounds)
        time_interleaved(option_jobs, warmup=min(warmup, 1), repeats=options.option_repeats(repeats),
                         on_round=lambda step, steps: work.done(f"timing the recompute options, round {step}/{steps}"))
    split_jobs = [t.split_job for t in timed if t.split_job is not None]
    if split_jobs:  # a zero-bubble schedule's two backward passes, as often as an option's time; no
        # warm-up round: the same layers and options just ran theirs (a full option's W reruns its
        # forward once per parameter group: this job can take as long as all the others)
        work.grow(options.option_repeats(repeats))
        time_interleaved(split_jobs, warmup=0, repeats=options.option_repeats(repeats),
                         on_round=lambda step, steps: work.done(f"timing the split backward, round {step}/{steps}"))
    for t in timed:
        t.measure_step(warmup=warmup, repeats=repeats)
        on_layer(t.name)
        work.done(f"optimizer steps of layer {t.name}")

    def layer_profiles() -> list[LayerProfile]:
        return [t.profile(kind=kinds[i], act_bytes=saved.act_bytes[i], input_in_act_bytes=saved.input_in_act_bytes[i],
                          input_shared_bytes=saved.input_shared_bytes[i], option_bytes=saved.option_bytes[i], routing=routing[i],
                          input_requires_grad=needs_grad[i])
                for i, t in enumerate(timed)]

    warnings = list(dict.fromkeys(warnings))  # an option a kind's layers cannot run, said once
    profiles = _remeasure_suspects(timed, layer_profiles, warmup=warmup, repeats=repeats, warnings=warnings)
    with blame("the layers' allocations"):
        profiles = allocseq.with_records(profiles, layers, layer_inputs, layer_outputs)
    with blame("loss_fn(output, target)"):
        loss_ms = _loss_ms(loss_fn, layer_outputs[-1], targets, warmup=warmup, repeats=repeats)
        loss_transient = _loss_transient_bytes(loss_fn, layer_outputs[-1], targets)
        loss_alloc = allocseq.record_loss(loss_fn, layer_outputs[-1], targets)
        with torch.no_grad():  # the loss value itself is kept too, until backward and beyond
            value = loss_fn(layer_outputs[-1], targets)
            loss_value_bytes = counted_bytes(value.numel() * value.element_size(), value.device)
    return Measurement(profiles, storage_nbytes(inputs), saved.loss_bytes + loss_value_bytes, loss_ms,
                       loss_transient, storage_nbytes(targets), warnings,
                       tied_sets(layers, device=inputs.device, warmup=warmup, repeats=repeats), loss_alloc)


def tied_sets(layers: Layers, *, device: torch.device, warmup: int, repeats: int) -> list[TiedSet]:
    """Parameters several layers share, with the time to add two of their gradients as
    autograd's InputBuffer does where one stage holds both uses (read both, write the sum:
    planner/cost/tiedadd.py); the all-reduce between two stages' ranks is not measured here."""
    sets = []
    for item in tied_params(layers):
        param = dict(layers)[item.layers[0]].get_parameter(item.names[0][1])
        numel = min(param.numel(), TIED_SAMPLE_NUMEL)  # the time scales with the bytes; a slice tells it
        mine = torch.zeros(numel, dtype=param.dtype, device=param.device)
        theirs = torch.ones_like(mine)
        stats = time_call(partial(_sum_copies, mine, theirs), device=device, warmup=warmup, repeats=repeats)
        sets.append(TiedSet(layers=item.layers, param_count=item.param_count, param_bytes=item.param_bytes,
                            sum_ms=stats.median_ms * param.numel() / max(numel, 1)))
    return sets


def _remeasure_suspects(timed: list[_TimedLayer], layer_profiles: Callable[[], list[LayerProfile]], *,
                        warmup: int, repeats: int, warnings: list[str]) -> list[LayerProfile]:
    """Time the layers whose numbers look wrong (sanity.suspects) again, adding samples to
    their medians, up to REMEASURE_ROUNDS times. What stays nonsense is replaced by an
    honest figure — a whole forward for a recompute, the kind's median for a step — and
    said in `warnings`, so no profile carries it."""
    profiles = layer_profiles()
    for _ in range(REMEASURE_ROUNDS):
        again = [timed[i] for i in sorted(sanity.suspects(profiles))]
        if not again:
            break
        time_interleaved([t.job for t in again], warmup=1, repeats=repeats)
        for t in again:
            t.measure_step(warmup=warmup, repeats=repeats)
        profiles = layer_profiles()
    for t in timed:
        t.release()
    for index in sanity.zero_recompute(profiles):
        # still no difference between the layer run plainly and checkpointed: the machine's
        # noise is larger than the recompute; a whole forward is the honest upper bound
        timed[index].recompute_measured = False
        warnings.append(f"layer {timed[index].name}'s recompute was lost in the machine's noise; "
                        "it is charged a whole forward (profile on a quieter machine to measure it)")
    for index, (optimizer, typical_ms) in sanity.step_outliers(profiles, sanity.STEP_SUSPECT):
        # the same step on structurally identical layers is the same work: several times the
        # kind's median is a stall of the machine, and the median is the robust figure
        measured_ms = timed[index].step_ms[optimizer]
        timed[index].step_ms = {**timed[index].step_ms, optimizer: typical_ms}
        warnings.append(f"layer {timed[index].name}'s {optimizer} step measured {measured_ms:.3g} ms, "
                        f"{measured_ms / typical_ms:.0f}x its kind's median, even when measured again; it is charged "
                        f"that median, {typical_ms:.3g} ms (profile on a quieter machine to measure it)")
    profiles = layer_profiles()
    for index, fixed in sanity.robust_figures(profiles).items():
        # identical layers still far apart after re-measuring: the machine's load, not the
        # layers; each takes its kind's median (the same work), said aloud
        layer = timed[index]
        layer.fixed = {**layer.fixed, **fixed.values}
        warnings.append(f"layer {layer.name}'s {fixed.what}, even when measured again; it is charged its kind's "
                        f"median, {fixed.typical} (profile on a quieter machine to measure it)")
    profiles = layer_profiles()
    assert not sanity.nonsense(profiles), sanity.nonsense(profiles)
    return profiles


class _Work:
    """Pieces of work done of a total that may grow, told to on_progress(done, total, what)."""

    def __init__(self, on_progress: Callable[[int, int, str], None], *, total: int) -> None:
        self.on_progress, self.total, self.count = on_progress, total, 0

    def grow(self, more: int) -> None:
        self.total += more

    def done(self, what: str) -> None:
        self.count += 1
        self.total = max(self.total, self.count)
        self.on_progress(self.count, self.total, what)


@dataclass
class _TimedLayer:
    """One layer set up for timing: its input, a fixed output gradient, its parameter
    grads allocated, and a job that runs it plainly and under checkpointing in turn."""

    name: str
    layer: nn.Module
    x: torch.Tensor
    output: torch.Tensor
    transient_bytes: int
    job: FwdBwdJob
    has_backward: bool
    step_ms: dict[str, float] = field(default_factory=dict)
    step_thread_ms: dict[int, dict[str, float]] = field(default_factory=dict)  # cpu: at fewer threads (threads.py)
    recompute_measured: bool = True  # False: lost in noise, a whole forward is charged
    option_transients: dict[str, int] = field(default_factory=dict)  # the selective options that run
    option_failures: dict[str, str] = field(default_factory=dict)  # those that raised, and why
    option_names: list[str] = field(default_factory=list)  # those the profile lists (time_options)
    option_job: FwdBwdJob | None = None
    expert_transient_bytes: int = 0  # of transient_bytes, the routed experts' weight gradients' share
    split: dict[str, tuple[int, int, int, int, int, int]] = field(default_factory=dict)  # option: splitbackward.split_backward_bytes
    split_job: SplitTimeJob | None = None  # the listed options' split backward, timed (time_options)
    grad: torch.Tensor | None = None  # the fixed gradient of the output every backward runs from
    # figures measured wrong (a busy machine) replaced by the kind's median: fwd_ms, bwd_ms, recompute_ms
    fixed: dict[str, float] = field(default_factory=dict)
    incoming_grad_bytes: int = 0  # of transient_bytes, the incoming gradient (_transient_parts)
    forward_transient_bytes: int | None = None  # the forward's alone (_transient_passes)

    @classmethod
    def prepare(cls, name: str, layer: nn.Module, x: torch.Tensor, output: torch.Tensor) -> _TimedLayer:
        grad = _fixed_grad(output)
        for param in layer.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)

        def reset_input_grad() -> None:
            x.grad = None

        reset_input_grad()
        transient, incoming, forward = _transient_passes(layer, x, grad)
        if not (x.requires_grad or any(param.requires_grad for param in layer.parameters())):
            transient = forward = forward_only_bytes(layer, x)  # it runs no backward and keeps nothing (§730)
        expert_transient = _expert_transient_bytes(layer, x, grad, transient)
        reset_input_grad()
        has_backward = grad is not None and (x.requires_grad or any(p.requires_grad for p in layer.parameters()))
        forwards = [lambda: layer(x)]
        if has_backward:
            forwards.append(lambda: checkpoint(layer, x, use_reentrant=False))
        job = FwdBwdJob(forwards, lambda out: _backward(out, grad), device=x.device, before_step=reset_input_grad,
                        around=lambda: blame(f"layer {name!r}"))
        found, failed = {}, {}
        if has_backward:  # nothing to recompute for where nothing runs backward
            found, failed = options.option_transients(layer, options.runnable_options(layer, x.device.type), partial(_recomputed_transient, x, grad))
            reset_input_grad()
        return cls(name, layer, x, output, transient, job, has_backward, option_transients=found,
                   option_failures=failed, expert_transient_bytes=expert_transient, grad=grad,
                   split=split_per_option(layer, x, grad, [OPTION_NONE, OPTION_FULL, *found]),
                   incoming_grad_bytes=incoming, forward_transient_bytes=forward)

    def failed_options(self, kind: str) -> list[str]:
        return [f"recompute option {name!r} fails on the {kind} layers ({self.name}: {why}); the profile leaves it out"
                for name, why in self.option_failures.items()]

    def time_options(self, names: list[str]) -> None:
        """Set up the timing of the options the profile will list."""
        self.option_names = list(names)
        self.option_job = options.option_job(self.layer, self.x, names, plain=self.job) if names else None
        listed = [OPTION_NONE, OPTION_FULL, *names]
        self.split_job = split_time_job(self.layer, self.x, self.grad,
                                        {name: found for name, found in self.split.items() if name in listed})

    def recompute_ms(self) -> float | None:
        """What checkpointing adds to the step (medians of forward + backward, at least
        0); None where the layer has no backward to recompute for."""
        if not self.has_backward or not self.recompute_measured:
            return None
        if "recompute_ms" in self.fixed:
            return self.fixed["recompute_ms"]
        (fwd, bwd), (ckpt_fwd, ckpt_bwd) = self.job.stats()
        return max(ckpt_fwd.median_ms + ckpt_bwd.median_ms - fwd.median_ms - bwd.median_ms, 0.0)

    def measure_step(self, *, warmup: int, repeats: int) -> None:
        with blame(f"layer {self.name!r}"):
            self.step_ms = _step_ms(self.layer, warmup=warmup, repeats=repeats)
            if self.x.device.type == "cpu":
                self.step_thread_ms = at_fewer_threads(partial(_step_ms, self.layer, warmup=warmup, repeats=repeats))

    def release(self) -> None:
        self.layer.zero_grad(set_to_none=True)
        self.x.grad = None

    def profile(self, *, kind: str, act_bytes: int, input_in_act_bytes: int, input_shared_bytes: int,
                option_bytes: dict[str, int], routing: Routing | None = None,
                input_requires_grad: bool | None = None) -> LayerProfile:
        fwd, bwd = self.job.stats()[0]
        params = list(self.layer.parameters())
        recompute_ms = self.recompute_ms()
        fwd_ms, bwd_ms = self.fixed.get("fwd_ms", fwd.median_ms), self.fixed.get("bwd_ms", bwd.median_ms)
        return LayerProfile(
            name=self.name,
            kind=kind,
            fwd_ms=fwd_ms,
            bwd_ms=bwd_ms,
            fwd_ms_min=fwd.min_ms,
            fwd_ms_max=fwd.max_ms,
            bwd_ms_min=bwd.min_ms,
            bwd_ms_max=bwd.max_ms,
            recompute_ms=recompute_ms,
            act_bytes=act_bytes,
            input_bytes=storage_nbytes(self.x),
            output_bytes=storage_nbytes(self.output),
            input_in_act_bytes=input_in_act_bytes,
            input_shared_bytes=input_shared_bytes,
            param_count=sum(p.numel() for p in params),
            param_bytes=sum(p.numel() * p.element_size() for p in params),
            largest_param_count=max((p.numel() for p in params), default=0),
            last_trained_param_count=next((p.numel() for p in reversed(params) if p.requires_grad), 0),
            param_tensors=sum(p.requires_grad for p in params),
            trained_param_numels=[p.numel() for p in params if p.requires_grad],
            trained_param_count=sum(p.numel() for p in params if p.requires_grad),
            input_requires_grad=input_requires_grad,
            lookup_param_count=lookup_param_count(self.layer),
            buffer_bytes=buffer_bytes(self.layer),
            expert_param_count=routing.expert_param_count if routing else 0,
            a2a_bytes=routing.a2a_bytes if routing else 0,
            routed_tokens=routing.routed_tokens if routing else [],
            expert_transient_bytes=self.expert_transient_bytes,
            expert_act_bytes=routing.expert_act_bytes if routing else 0,
            transient_bytes=self.transient_bytes,
            incoming_grad_bytes=self.incoming_grad_bytes,
            forward_transient_bytes=self.forward_transient_bytes,
            step_ms=self.step_ms,
            step_thread_ms=self.step_thread_ms,
            recompute_options=options.recompute_options(
                act_bytes=act_bytes, input_bytes=storage_nbytes(self.x),
                full_ms=fwd_ms if recompute_ms is None else recompute_ms, transient_bytes=self.transient_bytes,
                names=self.option_names, kept=option_bytes, transients=self.option_transients, job=self.option_job,
                split=self.split, split_ms=self.split_job.medians() if self.split_job else {}, bwd_ms=bwd_ms),
        )


def _expert_transient_bytes(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, transient: int, *,
                            tracker=memory_tracker) -> int:
    """How much of a MoE layer's transient its routed experts' weight gradients make: the
    transient again with the experts' weights frozen, and the difference. Their temporaries
    are as large as the experts held, so expert parallelism over E ranks holds 1/E of it.
    `tracker(device)`: how memory is followed (_transient_bytes)."""
    params = [param for _, experts in find_experts(layer) for param in experts.parameters() if param.requires_grad]
    if not params:
        return 0
    for param in params:
        param.requires_grad_(False)
    try:
        x.grad = None
        frozen = _transient_bytes(layer, x, grad, tracker=tracker)
    finally:
        for param in params:
            param.requires_grad_(True)
    return max(0, transient - frozen)


def _recomputed_transient(x: torch.Tensor, grad: torch.Tensor | None, run) -> int:
    """The transient bytes of x -> run(x) (a layer under a recompute option)."""
    x.grad = None
    return _transient_bytes(run, x, grad)


def _sum_copies(mine: torch.Tensor, theirs: torch.Tensor) -> None:
    mine.add_(theirs)


def _step_ms(layer: nn.Module, *, warmup: int, repeats: int) -> dict[str, float]:
    """The time of one optimizer step over the layer's trainable parameters, per optimizer: each one's
    fastest round, the optimizers taking turns (fastest_turns_ms). It steps copies (with a constant gradient),
    so the model stays as it was; at least one untimed step first, since Adam allocates its state in its first."""
    params = [p for p in layer.parameters() if p.requires_grad]
    if not params:
        return dict.fromkeys(OPTIMIZERS, 0.0)
    copies = []
    for param in params:
        copy = param.detach().clone().requires_grad_(True)
        copy.grad = torch.full_like(copy, 1e-3)
        copies.append(copy)
    optimizers = {name: make_optimizer(name, copies) for name in OPTIMIZERS}
    return fastest_turns_ms(optimizers, device=copies[0].device, warmup=warmup, repeats=repeats)


def fastest_turns_ms(optimizers: dict, *, device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    """Each optimizer's step, in ms: the optimizers take turns, round by round (at least one untimed step each
    first), and each keeps its fastest round. A busy machine slows a round, never speeds one, and taking turns
    keeps a burst of load from landing on all of one optimizer's rounds (a median of consecutive steps put a
    4K-parameter Adam step at 14 ms, and SGD's host step above Adam's, under the suite's load)."""
    best = dict.fromkeys(optimizers, float("inf"))
    for round_ in range(repeats):
        for name, optimizer in optimizers.items():
            stats = time_call(optimizer.step, device=device, warmup=max(warmup, 1) if round_ == 0 else 0, repeats=1)
            best[name] = min(best[name], stats.median_ms)
    return best


def _fixed_grad(output: torch.Tensor) -> torch.Tensor | None:
    """A gradient for the layer's output, the same on every run; None if it cannot have one."""
    if not output.is_floating_point():
        return None
    generator = torch.Generator(device=output.device).manual_seed(0)
    return torch.randn(output.shape, generator=generator, device=output.device, dtype=output.dtype)


def _loss_ms(loss_fn: LossFn, output: torch.Tensor, targets: torch.Tensor, *, warmup: int, repeats: int) -> float:
    """Loss forward + backward (sum of the medians) on the final output."""
    leaf = output.detach().requires_grad_(output.is_floating_point())

    def loss() -> torch.Tensor:
        value = loss_fn(leaf, targets)
        if not (isinstance(value, torch.Tensor) and value.numel() == 1):
            raise UserError(
                f"loss_fn(output, target) returned {type(value).__name__} "
                f"{tuple(getattr(value, 'shape', ()))}, expected a scalar tensor"
            )
        return value

    def backward(value: torch.Tensor) -> None:
        if value.requires_grad:
            value.backward()

    fwd, bwd = time_fwd_bwd(loss, backward, device=output.device, warmup=warmup, repeats=repeats)
    return fwd.median_ms + bwd.median_ms


HOST_STEP_PARAMS = 2**20  # 4 MiB of fp32: past the CPU caches, as an offloaded step's tensors are


def host_step_ns_per_param(*, warmup: int = 1, repeats: int = 3,
                           num_params: int = HOST_STEP_PARAMS) -> dict[str, float]:
    """Each optimizer stepping fp32 tensors on this machine's CPU, ns per parameter: what an offloaded
    optimizer's host step costs (the cost model's offload term). Each one's fastest round, the optimizers taking
    turns (fastest_turns_ms), which keeps their ratio (which analytic profiles use) from a burst of load."""
    param = torch.zeros(num_params, requires_grad=True)
    param.grad = torch.full_like(param, 1e-3)
    optimizers = {name: make_optimizer(name, [param]) for name in OPTIMIZERS}
    best = fastest_turns_ms(optimizers, device=torch.device("cpu"), warmup=warmup, repeats=repeats)
    return {name: ms * 1e6 / num_params for name, ms in best.items()}
