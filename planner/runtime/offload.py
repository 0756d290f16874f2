"""Optimizer offload: the optimizer's state and step on the host, the copies overlapped.

What torch has does not give the overlap: FSDP2's CPUOffloadPolicy offloads the parameters
and gradients too (weights copied to the device for every all-gather) and steps after all
gradients have arrived; torchao's CPUOffloadOptimizer is CUDA-only. So this module does the
one missing piece, the overlapped copy-step-copy, over the rank's local tensors (FSDP2's
shards included) in chunks of about OFFLOAD_CHUNK_PARAMS parameters:

    for every chunk, on a copy stream:   device grads -> host (pinned)        (D2H)
    for every chunk, on the host:        wait for its D2H, optimizer step      (step)
    then, on a second copy stream:       host weights -> device                (H2D)

so chunk i's step runs while chunk i+1's gradients come down and chunk i-1's weights go up
(with `overlap=False`, one after another: the serial copy-step-copy). The host keeps an
fp32 master of every parameter, its gradient and the optimizer state. On the CPU the host
is the device: the copies are plain copies and the step is the same optimizer on the same
values, so training equals the non-offloaded optimizer exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from planner.cost.dataparallel import OFFLOAD_CHUNK_PARAMS
from planner.cost.optimizers import make_optimizer


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own part of a (possibly FSDP2-sharded) tensor, sharing its storage."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


@dataclass
class _Chunk:
    params: list[torch.Tensor]  # the device parameters
    masters: list[torch.Tensor]  # their fp32 host copies; .grad is the host gradient
    optimizer: torch.optim.Optimizer  # over the masters
    copied: torch.cuda.Event | None = None  # its gradients are on the host (CUDA only)


class OffloadOptimizer(torch.optim.Optimizer):
    """`optimizer` (a name make_optimizer knows) stepping fp32 host copies of `params`.
    Accepts param groups as torch optimizers do, so ZeroRedundancyOptimizer can wrap it."""

    def __init__(self, params, *, optimizer: str, chunk_params: int = OFFLOAD_CHUNK_PARAMS, overlap: bool = True):
        super().__init__(params, {"optimizer": optimizer})
        device_params = [p for group in self.param_groups for p in group["params"]]
        self.cuda = any(local(p).is_cuda for p in device_params)
        self.overlap = overlap
        self._chunks = [self._chunk(group, optimizer) for group in _split(device_params, chunk_params)]
        self._d2h = torch.cuda.Stream() if self.cuda else None
        self._h2d = torch.cuda.Stream() if self.cuda else None

    def _chunk(self, params: list[torch.Tensor], optimizer: str) -> _Chunk:
        masters = []
        for param in params:
            master = torch.empty(local(param).shape, dtype=torch.float32, pin_memory=self.cuda)
            master.copy_(local(param).detach())
            master.grad = torch.zeros_like(master)
            masters.append(master)
        return _Chunk(params, masters, make_optimizer(optimizer, masters))

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()
        if self.cuda and self.overlap:
            self._step_overlapped()
            return
        for chunk in self._chunks:
            _grads_to_host(chunk)
            chunk.optimizer.step()
            _weights_to_device(chunk, non_blocking=False)

    def _step_overlapped(self) -> None:  # CUDA only; not run on CPU
        current = torch.cuda.current_stream()
        self._d2h.wait_stream(current)  # the gradients are complete
        with torch.cuda.stream(self._d2h):
            for chunk in self._chunks:
                _grads_to_host(chunk, non_blocking=True)
                chunk.copied = torch.cuda.Event()
                chunk.copied.record()
        for chunk in self._chunks:
            chunk.copied.synchronize()  # this chunk's gradients are on the host; later ones still coming
            chunk.optimizer.step()
            with torch.cuda.stream(self._h2d):
                _weights_to_device(chunk, non_blocking=True)
        current.wait_stream(self._h2d)

    def host_bytes(self) -> int:
        """Host memory held: fp32 masters, their gradients and the optimizer state."""
        total = 0
        for chunk in self._chunks:
            tensors = [*chunk.masters, *(m.grad for m in chunk.masters if m.grad is not None)]
            tensors += [v for state in chunk.optimizer.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor)]
            total += sum(t.numel() * t.element_size() for t in tensors)
        return total


def _split(params: list[torch.Tensor], chunk_params: int) -> list[list[torch.Tensor]]:
    """Whole tensors in order, a new chunk once the current one holds chunk_params."""
    chunks: list[list[torch.Tensor]] = [[]]
    count = 0
    for param in params:
        if count >= chunk_params:
            chunks.append([])
            count = 0
        chunks[-1].append(param)
        count += local(param).numel()
    return [chunk for chunk in chunks if chunk]


def _grads_to_host(chunk: _Chunk, *, non_blocking: bool = False) -> None:
    for param, master in zip(chunk.params, chunk.masters, strict=True):
        if param.grad is None:  # the optimizer skips it, as it would on the device
            master.grad = None
            continue
        if master.grad is None:
            master.grad = torch.empty_like(master, pin_memory=master.is_pinned())
        master.grad.copy_(local(param.grad), non_blocking=non_blocking)


def _weights_to_device(chunk: _Chunk, *, non_blocking: bool) -> None:
    for param, master in zip(chunk.params, chunk.masters, strict=True):
        local(param).copy_(master, non_blocking=non_blocking)
