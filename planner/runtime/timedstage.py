"""The pipeline stage the worker runs: torch's PipelineStage, timing each microbatch's forward and
backward, checking every output and loss for NaN or infinity where it first appears, and sending
contiguous tensors (gloo's requirement)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining._backward import stage_backward

from planner.errors import UserError
from planner.runtime.heartbeat import NO_HEARTBEAT, Heartbeat


class NonFinite(UserError):
    """A NaN or infinity, where it first appeared: the run stops there, not steps later."""


def _finite(value) -> bool:
    """Every floating tensor in `value` (a tensor, or a tuple or list of them) is finite: its least and greatest
    element are (`aminmax` propagates a NaN to both; an infinity is one of them). Two scalars of the tensor's own dtype,
    no copy of it: `isfinite(value).all()` made |value| and three boolean masks beside the stage's output (3,584 B on a
    2,048 B fp32 output), and `value.sum(dtype=float64)` a float64 copy of it first (4,096 B on that output, 4x a bf16
    one's bytes) inside the reduction, where torch's dispatch (and so MemTracker) does not see it
    (docs/framework-facts.md §655)."""
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() == 0:  # aminmax refuses an empty tensor
            return True
        if value.element_size() == 1:  # float8: no aminmax kernel; bf16 holds its range, NaN and infinity
            value = value.to(torch.bfloat16)
        low, high = torch.aminmax(value)
        return bool(torch.isfinite(low) & torch.isfinite(high))
    if isinstance(value, tuple | list):
        return all(_finite(item) for item in value)
    return True


class TimedStage(PipelineStage):
    """A PipelineStage that times each microbatch's forward and backward while `recording`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recording = False
        self.before_forward: Callable[[], None] | None = None
        self.fwd_ms: list[float] = []
        self.bwd_ms: list[float] = []
        self.weight_grad_ms: list[float] = []  # zero-bubble schedules: the weight-gradient half of a backward
        self.optimizer_ms: list[float] = []
        self.loss_ms: list[float] = []
        self.seed = 0  # with step_index and the microbatch, seeds each layer's random numbers
        self.step_index = 0
        self.current_microbatch = 0  # the microbatch of the last forward (the loss follows it on the last stage)
        self.loss_follows = False  # the next loss is of that forward's output
        self.stage_module = self.submod  # the StageModule (submod may be its data-parallel wrapper)
        self.microbatch_offset = 0  # this replica's first microbatch in the global batch (dp_index x M)
        self.heartbeat: Heartbeat = NO_HEARTBEAT  # tells the launcher what this rank works on
        self.after_chunk: Callable[[], None] | None = None  # called after every microbatch's forward and backward
        self.reduce_every_microbatch = False  # FSDP2: reduce-scatter and reshard after each backward (ZeRO's own way)

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        self.stage_module.rng_key = (self.seed, self.step_index, self.microbatch_offset + fwd_chunk_id)
        if self.before_forward is not None:
            self.before_forward()
        with self.heartbeat.phase("a forward", working=True), self.timed(self.fwd_ms):
            output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        self.current_microbatch, self.loss_follows = fwd_chunk_id, self.is_last
        if not _finite(output):  # checked outside the timing: a NaN anywhere later starts here
            raise NonFinite(self._where("its forward output"))
        if self.after_chunk is not None:
            self.after_chunk()
        return output

    def _where(self, what: str) -> str:
        return (f"a NaN or infinity first appeared in {what} at step {self.step_index}, microbatch "
                f"{self.microbatch_offset + self.current_microbatch} (both counted from 0, warm-up steps "
                "included); check the model's inputs and the learning rate")

    def backward_one_chunk(self, *args, **kwargs):
        with self.heartbeat.phase("a backward", working=True), self.timed(self.bwd_ms):
            output = super().backward_one_chunk(*args, **kwargs)
        if self.after_chunk is not None:
            self.after_chunk()
        return output

    def backward_weight_one_chunk(self, *args, **kwargs):
        with self.heartbeat.phase("a weight-gradient backward", working=True), self.timed(self.weight_grad_ms):
            output = super().backward_weight_one_chunk(*args, **kwargs)
        if self.after_chunk is not None:
            self.after_chunk()
        return output

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        """torch's pipeline keeps FSDP2's gradients whole and its weights gathered from a stage's
        first backward to its last (reduced once, by perform_reduce_grad). With
        reduce_every_microbatch (ZeRO 2/3's own way) every backward runs with FSDP2's hooks on:
        each layer's gradient is reduce-scattered into its shard (accumulating over the
        microbatches) and its weights resharded as that layer's backward ends, so one layer's
        unsharded gradient and gathered weights are live at a time, not the stage's."""
        if not (self.reduce_every_microbatch and isinstance(self.submod, FSDPModule) and backward_type == "full"):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        self.submod.set_is_last_backward(True)  # wait for (and free) every reduce-scatter before the next forward
        self.submod.set_reshard_after_backward(True)
        self.submod.set_requires_gradient_sync(True)
        return stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"], bwd_kwargs["input_values"]), None

    # The first step infers shapes by running the stage once (torch's metadata inference),
    # outside forward_one_chunk and backward_one_chunk: that is this rank's own work too.
    def _compute_outputs(self, *args, **kwargs):
        with self.heartbeat.phase("a forward (shape inference)", working=True):
            return super()._compute_outputs(*args, **kwargs)

    def _compute_input_grads(self, *args, **kwargs):
        with self.heartbeat.phase("a backward (shape inference)", working=True):
            return super()._compute_input_grads(*args, **kwargs)

    def timed_loss(self, loss_fn: Callable) -> Callable:
        def loss(output, target):
            with self.heartbeat.phase("loss_fn", working=True), self.timed(self.loss_ms):
                value = loss_fn(output, target)
            # after a forward the stage checked (not the shape inference's placeholder data): the
            # output was finite, so the loss itself made it
            if self.loss_follows and not _finite(value):
                raise NonFinite(self._where("the loss"))
            self.loss_follows = False
            return value

        return loss

    @contextmanager
    def timed(self, into: list[float]) -> Iterator[None]:
        if not self.recording:
            yield
            return
        _sync(self.device)
        start = time.perf_counter()
        yield
        _sync(self.device)
        into.append((time.perf_counter() - start) * 1000)

    def _get_recv_ops(self, recv_infos):
        """Receive into contiguous buffers: the stage makes them in the layout of the
        sender's output (or input) it inferred, which may be a view's strides."""
        for info in recv_infos:  # torch 2.11 lists the first stage's model inputs here too (no buffer)
            if getattr(info, "buffer", None) is not None and not info.buffer.is_contiguous():
                info.buffer = torch.empty_like(info.buffer, memory_format=torch.contiguous_format).requires_grad_(
                    info.buffer.requires_grad)
        return super()._get_recv_ops(recv_infos)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return _contiguous(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return _contiguous(super().get_bwd_send_ops(bwd_chunk_id))

    def recv_buffers(self) -> list[torch.Tensor]:
        """The receive buffers the stage allocated for every microbatch at its first step."""
        infos = [*self.args_recv_info.values(), *self.grad_recv_info.values()]
        return [info.buffer for recv in infos for info in recv if getattr(info, "buffer", None) is not None]


def _contiguous(ops: list[dist.P2POp]) -> list[dist.P2POp]:
    """gloo sends only contiguous tensors; a layer may return a view (a ViT's
    flatten(2).transpose(1, 2)) and a layer's input gradient may be one (a transpose)."""
    for op in ops:
        if not op.tensor.is_contiguous():
            op.tensor = op.tensor.contiguous()
    return ops


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
