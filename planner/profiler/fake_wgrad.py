"""What a layer's fake transient owes to the weight gradients autograd makes fresh.

The fake profile runs a layer's backward into a `.grad` made before it (fake.py), so torch's AccumulateGrad
adds each new gradient into it in place (`variable_grad += new_grad`: torch/csrc/autograd/functions/
accumulate_grad.h at 2.13, docs/framework-facts.md §690): the new gradient is a tensor of its own, alive from
the kernel that makes it to that add. In a MoE block it is the routed experts' stacked gradient, one
`_grouped_mm` output as large as the experts (transformers 5.24's grouped_mm_experts_forward, §691): at
Qwen2-57B-A14B's block the backward's peak. A runtime that accumulates the weight gradient inside its GEMM
(Megatron-core's gradient_accumulation_fusion, TE's fuse_wgrad_accumulation into main_grad: §692) never makes
it; the analytic profile's transient is that one ("weight gradients accumulated in place").

transient_in_place replays one forward and backward's storages in order and takes the backward's peak again
with the fresh weight gradients left out, so the profile can say both: its transient as the model's code runs
it, and of that, what the fresh gradients add (LayerProfile.weight_grad_transient_bytes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from planner.profiler.storages import StorageTracker, storage_key, storage_nbytes


class _Logged(StorageTracker):
    """StorageTracker that also keeps, in order, each storage's creation (+bytes) and free (-bytes), each named by
    the index of its creation event (a freed storage's key can come back for another)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[int, int]] = []  # (its creation's index, bytes made or -bytes freed)
        self.born: dict[int, int] = {}  # a live storage's key: its creation's index

    def _track(self, storage, device, arg_keys) -> None:
        key, before = storage._cdata, self.live_bytes
        super()._track(storage, device, arg_keys)
        if self.live_bytes != before:
            self.born[key] = len(self.events)
            self.events.append((len(self.events), self.live_bytes - before))

    def _freed(self, key: int, nbytes: int, _ref) -> None:
        if key in self._alive:
            self.events.append((self.born.pop(key), -nbytes))
        super()._freed(key, nbytes, _ref)


def transient_in_place(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None) -> tuple[int, int]:
    """(the layer's transient as measure._transient_bytes counts it, the same with every weight gradient autograd
    hands a parameter's AccumulateGrad left out: as if accumulated in place). Each parameter needs its `.grad`
    made before, as fake.py makes it."""
    transient, in_place, _incoming, _forward = transient_parts(layer, x, grad)
    return transient, in_place


def transient_parts(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None) -> tuple[int, int, int, int]:
    """transient_in_place's two figures and, from the same run, how much of the transient is the incoming
    gradient (transients._transient_parts' second figure: LayerProfile.incoming_grad_bytes), and the forward's
    own extra (LayerProfile.forward_transient_bytes)."""
    run = logged_run(layer, x, grad, _Logged())
    live, peak = run.kept, run.kept
    for born, change in run.events[run.start:]:
        if born not in run.fresh:
            live += change
            peak = max(peak, live)
    in_place = peak - run.kept + run.incoming
    fwd_extra, bwd_extra = run.fwd_extra, run.bwd_extra
    transient = max(0, fwd_extra, bwd_extra)
    return (transient, max(0, fwd_extra, in_place), transient - max(0, fwd_extra, bwd_extra - run.incoming),
            max(0, fwd_extra))


@dataclass
class LoggedRun:
    """One forward and backward of a layer as a _Logged tracker saw it: what the forward left alive (`kept`), the
    index of the backward's first event (`start`), the gradient received, the creation indices of the gradients
    autograd handed an AccumulateGrad (`fresh`), the events in order and each pass's peak beyond `kept`."""

    kept: int
    start: int
    incoming: int
    fresh: set[int]
    events: list[tuple[int, int]]
    fwd_extra: int
    bwd_extra: int


def logged_run(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor | None, memory: _Logged,
               on_backward=lambda memory: None) -> LoggedRun:
    """Run `layer` forward and backward under `memory` (a _Logged, or one that names its events:
    scripts/fake_transient_trace.py), noting which storages autograd hands a parameter's AccumulateGrad;
    `on_backward(memory)` is called as the backward begins."""
    fresh: set[int] = set()

    def handed(gradient: torch.Tensor) -> None:
        born = memory.born.get(storage_key(gradient))
        if born is not None:
            fresh.add(born)

    hooks = [param.register_hook(handed) for param in layer.parameters() if param.requires_grad]
    try:
        with memory:
            output = layer(x)
            kept = memory.live_bytes
            fwd_extra = memory.peak_bytes - kept
            start = len(memory.events)
            memory.reset_peak()
            on_backward(memory)
            ran = grad is not None and output.requires_grad
            if ran:
                torch.autograd.backward(output, grad)
            incoming = storage_nbytes(grad) if ran else 0
            bwd_extra = memory.peak_bytes - kept + incoming
            del output
            events = list(memory.events)
    finally:
        for hook in hooks:
            hook.remove()
    return LoggedRun(kept, start, incoming, fresh, events, fwd_extra, bwd_extra)
