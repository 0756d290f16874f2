"""What a zero-bubble schedule's split backward holds and peaks at, per layer and recompute option:
torch's stage_backward_input, then stage_backward_weight, under the memory tracker
(LayerProfile's split_held_bytes, split_input_peak_bytes, split_peak_bytes, and per parameter group
split_first_peak_bytes, split_carry_bytes, split_left_bytes: planner/cost/wgroups.py); and how long each
of the two passes takes (SplitTimeJob: input_grad_ms, weight_grad_ms)."""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from planner.profiler.storages import memory_tracker, storage_key, storage_nbytes
from planner.profiler.timing import Stopwatch
from planner.runtime.recompute import layer_runner
from planner.schema import runs_split_backward


def split_per_option(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None,
                     names: list[str], *, tracker=memory_tracker) -> dict[str, tuple[int, int, int, int, int, int]]:
    """split_backward_bytes of the layer under each option a split backward can run; none where
    torch's split backward refuses the layer (its `detach_` of an output that is a view, e.g. a
    Linear's on a 3-d input: a zero-bubble schedule cannot run it either). `tracker`: the measured
    profiler's memory_tracker, or a fake profile's StorageTracker on its fake tensors (fake.py)."""
    found = {}
    for name in names:
        if runs_split_backward(name):
            x.grad = None
            try:
                found[name] = split_backward_bytes(layer_runner(layer, name), layer, x, grad, tracker=tracker)
            except RuntimeError:
                break
    x.grad = None
    for param in layer.parameters():  # a failed input pass may have left gradients half made
        if param.grad is not None:
            param.grad.zero_()
    return found


def split_backward_bytes(run, layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, *,
                         tracker=memory_tracker) -> tuple[int, int, int, int, int, int]:
    """A zero-bubble schedule's split backward of x -> run(x), as the pipeline runs it (torch's
    stage_backward_input, then stage_backward_weight): (what the input pass leaves live for the
    weight pass beyond what the forward kept, the incoming gradient and the input gradient it
    made; the input pass's peak over what is live before it, its input gradient included; the
    weight pass's peak over what is live before it; its first parameter group's peak over the
    same; what its last group leaves alive for the next layer's first group: its torch.autograd.grad
    result, less the saved output gradients that group frees; of that carry, what outlives the next
    group's call to the end of the stage's weight pass: all but its last group's result, a checkpointed
    region's reruns its groups did not unpack, framework-facts §889-§890). The weight pass runs as in a step's
    later microbatches, each weight's .grad already there (torch adds into it; the layer's .grad
    put back after). Zeros where there is no input gradient to split off (a first layer) or no weight."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    if grad is None or not x.requires_grad or not x.is_floating_point() or not weights:
        return 0, 0, 0, 0, 0, 0
    kept_grads = [p.grad for p in weights]
    for p in weights:
        p.grad = torch.zeros_like(p) if p.grad is None else p.grad.clone()
    try:
        with tracker(x.device) as memory:
            output = run(x)
            if not output.requires_grad:
                return 0, 0, 0, 0, 0, 0
            before = memory.live_bytes
            memory.reset_peak()
            input_grads, groups = stage_backward_input([output], [grad], [x], iter(weights))
            input_peak = memory.peak_bytes - before
            live = memory.live_bytes
            held = live - before - sum(storage_nbytes(g) for g in input_grads if g is not None)
            memory.reset_peak()
            with _groups_watched(memory, grad) as (calls, between):
                stage_backward_weight(iter(weights), groups)
            peak = max([memory.peak_bytes, *between, *(top for top, _, _ in calls)]) - live
            first = calls[0][0] - live if calls else 0
            carry = calls[-1][1] - live if calls else 0
            left = calls[-1][1] - calls[-1][2] - live if calls else 0
            del output, input_grads, groups
    finally:
        for p, kept in zip(weights, kept_grads):
            p.grad = kept
    return max(0, held), max(0, input_peak), max(0, peak), max(0, first), max(0, carry), max(0, left)


@contextmanager
def _groups_watched(memory, incoming: torch.Tensor):
    """Each torch.autograd.grad of stage_backward_weight (one a parameter group, _backward.py
    322-328) as (the tracker's peak during it, what is live as the next group's would start: the
    group's result still bound, the group before's result and the group's saved output gradients
    freed, the incoming gradient, which no group owns, kept; the group's result's bytes); and the
    peaks between them (the gradients' accumulation into .grad)."""
    calls: list[tuple[int, int, int]] = []
    between: list[int] = []
    grad = torch.autograd.grad
    bound: dict[int, int] = {}  # the group before's result, bound to `dweights` until this one returns

    def watched(outputs, inputs, grad_outputs=None, **kwargs):
        nonlocal bound
        between.append(memory.peak_bytes)
        memory.reset_peak()
        result = grad(outputs, inputs, grad_outputs=grad_outputs, **kwargs)
        mine = _storages(result)
        freed = {**bound, **_storages(grad_outputs or ())}
        for key in (*mine, storage_key(incoming)):
            freed.pop(key, None)
        calls.append((memory.peak_bytes, memory.live_bytes - sum(freed.values()), sum(mine.values())))
        bound = mine
        return result

    torch.autograd.grad = watched
    try:
        yield calls, between
    finally:
        torch.autograd.grad = grad


def _storages(tensors) -> dict[int, int]:
    return {storage_key(t): storage_nbytes(t) for t in tensors if t is not None}


@dataclass
class SplitTimeJob:
    """The layer's split backward timed per option (those split_per_option found running): a
    forward, then torch's stage_backward_input and stage_backward_weight as a zero-bubble
    schedule's I and W run them, each pass on the device's own clock; and in the same turn a
    forward and a plain backward of the same option, the split's own yardstick (the layer's
    backward in the profile was timed in another job, at another moment of a shared machine's
    load). A job for timing.time_interleaved, so a spell of load lands on one repeat of many layers."""

    layer: nn.Module
    x: torch.Tensor
    grad: torch.Tensor
    names: list[str]
    input_ms: dict[str, list[float]] = field(default_factory=dict)
    weight_ms: dict[str, list[float]] = field(default_factory=dict)
    full_ms: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.runs = {name: layer_runner(self.layer, name) for name in self.names}
        self.weights = [p for p in self.layer.parameters() if p.requires_grad]
        self.input_ms = {name: [] for name in self.names}
        self.weight_ms = {name: [] for name in self.names}
        self.full_ms = {name: [] for name in self.names}

    def run_once(self, *, keep: bool) -> None:
        for name, run in self.runs.items():
            self.x.grad = None
            output = run(self.x)
            watch = Stopwatch(self.x.device)
            watch.mark()
            input_grads, groups = stage_backward_input([output], [self.grad], [self.x], iter(self.weights))
            watch.mark()
            stage_backward_weight(iter(self.weights), groups)
            watch.mark()
            del output, input_grads, groups
            self.x.grad = None
            output = run(self.x)
            watch.mark()
            output.backward(self.grad)
            watch.mark()
            del output
            if keep:
                i, w, _, full = watch.laps_ms()
                self.input_ms[name].append(i)
                self.weight_ms[name].append(w)
                self.full_ms[name].append(full)
        self.x.grad = None

    def medians(self) -> dict[str, tuple[float, float, float]]:
        """Per option, the (input pass, weight pass, plain backward) medians in ms."""
        return {name: (statistics.median(self.input_ms[name]), statistics.median(self.weight_ms[name]),
                       statistics.median(self.full_ms[name]))
                for name in self.names if self.input_ms[name]}


def recorded_split_ms(medians: tuple[float, float, float], backward_ms: float) -> tuple[float, float]:
    """An option's (input_grad_ms, weight_grad_ms) for the profile: its two passes' medians in
    the proportion to its plain backward that the same job measured, against `backward_ms`, the
    backward the profile charges the option (the layer's bwd_ms and what the option recomputes),
    so the pair and the backward it splits come from one moment of the machine's load. A plain
    backward timed at 0 (a clock's tick) records the medians as they are."""
    input_ms, weight_ms, plain_ms = medians
    scale = backward_ms / plain_ms if plain_ms > 0 else 1.0
    return input_ms * scale, weight_ms * scale


def split_time_job(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None,
                   split: dict[str, tuple[int, int, int, int, int, int]]) -> SplitTimeJob | None:
    """A SplitTimeJob for the options whose split ran (split_per_option) where there is a split to
    time: an input gradient and a weight (split_backward_bytes' zeros otherwise); None if none."""
    weights = [p for p in layer.parameters() if p.requires_grad]
    if grad is None or not x.requires_grad or not x.is_floating_point() or not weights or not split:
        return None
    return SplitTimeJob(layer, x, grad, list(split))
