"""`ckplan validate`: one stage alone in this process, its schedule replayed, its peak
memory measured against its cap — no process group, no other stage needed.

The replay holds what the real runtime holds: the stage's weights, gradients and
optimizer state; a receive buffer for every microbatch's input (stage > 0) and for
every microbatch's output gradient (stage < last), as PipelineStage allocates them at
its first step; each in-flight microbatch's input and output (its fwd_cache) and
saved activations; the batch (first stage) and targets (last stage). Microbatches
run in the order the schedule runs them on this stage:

    1F1B   k = min(P - s, M) forwards, then one backward + one forward until all M
           are forwarded, then the remaining backwards
    GPipe  all M forwards, then all M backwards

The same tracker as `ckplan launch` (planner.memtrack.PeakMemory) measures one
replay, after an optimizer step on zero gradients has created the optimizer state
(as the launch's warm-up step does).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from planner.errors import UserError
from planner.memtrack import PeakMemory
from planner.modelfile import pipeline_layers
from planner.runtime.checks import Prepared, prepare
from planner.runtime.stagemodule import (
    StageModule,
    allocate_grads,
    make_optimizer,
    to_device,
    torch_dtype,
)
from planner.runtime.worker import forget_module_stats
from planner.schema import Plan


@dataclass
class StageCheck:
    index: int
    peak_bytes: int
    cap_bytes: int
    in_flight: int  # most microbatches whose activations the stage holds at once
    predicted_peak_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.cap_bytes


def replay_order(schedule: str, *, num_stages: int, num_microbatches: int, stage_index: int) -> list[tuple[str, int]]:
    """("F", mb) and ("B", mb) in the order the schedule runs them on this stage."""
    if schedule == "GPipe":
        return [("F", mb) for mb in range(num_microbatches)] + [("B", mb) for mb in range(num_microbatches)]
    warmup = min(num_stages - stage_index, num_microbatches)
    order = [("F", mb) for mb in range(warmup)]
    next_forward = warmup
    for mb in range(num_microbatches):
        order.append(("B", mb))
        if next_forward < num_microbatches:
            order.append(("F", next_forward))
            next_forward += 1
    return order


def validate_plan(plan: Plan, *, plan_file: str | Path | None, stage: int | None = None, device: str = "cpu",
                  seed: int = 0, force: bool = False) -> list[StageCheck]:
    """Replay one stage (or every stage, one after another) and measure its peak."""
    if stage is not None and not 0 <= stage < plan.setup.stages:
        raise UserError(f"--stage {stage} is out of range: the plan has stages 0..{plan.setup.stages - 1}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but this torch sees no CUDA device; use --device cpu")
    prepared = prepare(plan, plan_file=plan_file, force=force)
    indices = [stage] if stage is not None else range(plan.setup.stages)
    return [replay_stage(plan, prepared, index, device=torch.device(device), seed=seed) for index in indices]


def replay_stage(plan: Plan, prepared: Prepared, index: int, *, device: torch.device, seed: int) -> StageCheck:
    setup = plan.setup
    num_mb = setup.microbatches
    stage_plan = prepared.strategy.stages[index]
    first, last = index == 0, index == setup.stages - 1
    dtype = torch_dtype(plan.dtype)
    model_file = prepared.model_file

    torch.manual_seed(seed)
    layers = pipeline_layers(model_file.build_model(), model_file.path)
    inputs, targets = model_file.example_batch(setup.micro_batch_size * num_mb)
    boundary = _stage_input(layers, stage_plan.layers[0], inputs.tensor_split(num_mb)[0], dtype)
    by_name = dict(layers)
    module = StageModule([(fqn, by_name[fqn]) for fqn in stage_plan.layers], stage_plan.checkpointed)
    del layers, by_name  # the rest of the model is freed, as on a real rank
    module.to(device=device, dtype=dtype)
    allocate_grads(module)
    optimizer = make_optimizer(setup.optimizer, module.parameters())
    boundary = boundary.to(device)
    with torch.no_grad():
        output_template = module(boundary)

    batch = to_device(inputs, device, dtype) if first else None
    target = to_device(targets, device, dtype) if last else None
    recv = [] if first else [boundary.clone() for _ in range(num_mb)]
    grad_recv = [] if last else [torch.randn_like(output_template) * 1e-3 for _ in range(num_mb)]
    del output_template, boundary
    order = replay_order(setup.schedule, num_stages=setup.stages, num_microbatches=num_mb, stage_index=index)

    def step(before_forward=None) -> None:
        optimizer.zero_grad(set_to_none=False)
        in_flight: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        losses = []
        sends = _Sends(setup.schedule, warmup=min(setup.stages - index, num_mb), num_microbatches=num_mb)
        for op, mb in order:
            if op == "F":
                if before_forward is not None:
                    before_forward()
                x = batch.tensor_split(num_mb)[mb] if first else recv[mb].requires_grad_(recv[mb].is_floating_point())
                out = module(x)
                loss = model_file.loss_fn(out, target.tensor_split(num_mb)[mb]) if last else None
                losses.append(loss)  # the schedule keeps every microbatch's loss until the step ends
                in_flight[mb] = (out, x, loss)
                if not last:
                    sends.output(mb, out)
            else:
                out, x, loss = in_flight.pop(mb)
                torch.autograd.backward(loss if last else out, None if last else grad_recv[mb])
                if not first:
                    sends.grad(x.grad)
                    x.grad = None
                sends.backward_done(mb)
                del out, x, loss
        del sends
        for param in module.parameters():
            param.grad.div_(num_mb)  # the schedule averages over microbatches
        optimizer.step()

    optimizer.step()  # zero gradients: creates the optimizer state a launch's warm-up creates, moves nothing
    external = [module, optimizer, batch, target, *recv, *grad_recv]
    with PeakMemory(device, external=external) as mem:
        step(partial(forget_module_stats, mem))
    predicted = stage_plan.predicted.peak_bytes if stage_plan.predicted else None
    in_flight_max = num_mb if setup.schedule == "GPipe" else min(setup.stages - index, num_mb)
    return StageCheck(index, mem.peak_bytes, setup.mem_caps_bytes[index], in_flight_max, predicted)


class _Sends:
    """What torch's schedules keep alive through their send handles (a send holds its
    tensor until the handle is dropped), so the replay holds it as long:

    GPipe  every output and input gradient sent, until the step ends;
    1F1B   the output of the last warm-up forward it fires early (microbatch k-2) until
           the cool-down starts; the latest input gradient until the next backward is done.
    """

    def __init__(self, schedule: str, *, warmup: int, num_microbatches: int):
        self.schedule, self.warmup, self.num_microbatches = schedule, warmup, num_microbatches
        self.outputs: list[torch.Tensor] = []
        self.grads: list[torch.Tensor | None] = []

    def output(self, mb: int, out: torch.Tensor) -> None:
        if self.schedule == "GPipe" or mb == self.warmup - 2:
            self.outputs.append(out)

    def grad(self, grad: torch.Tensor | None) -> None:
        self.grads = [*self.grads, grad] if self.schedule == "GPipe" else [grad]

    def backward_done(self, mb: int) -> None:
        if self.schedule != "GPipe" and mb == self.num_microbatches - self.warmup:
            self.outputs.clear()


def _stage_input(layers, first_layer: str, microbatch: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The stage's input for one microbatch: the model's input through the layers before it."""
    x = microbatch.to(dtype) if microbatch.is_floating_point() else microbatch
    with torch.no_grad():
        for fqn, layer in layers:
            if fqn == first_layer:
                break
            x = layer.to(dtype)(x)
    return x.detach()
