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

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from planner.errors import UserError
from planner.models.modelfile import _user_traceback
from planner.runtime.checks import Prepared, prepare
from planner.runtime.memtrack import PeakMemory
from planner.runtime.stagemodule import (
    StageModule,
    allocate_grads,
    build_layers,
    optimizer_for,
    stage_module,
    stage_options,
    to_device,
    torch_dtype,
    training_batch,
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
    reserved_bytes: int | None = None  # cuda: the caching allocator's reserved peak of the replay
    predicted_reserved_bytes: int | None = None

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
                  seed: int = 0, force: bool = False,
                  on_stages: Callable[[int, int], None] = lambda done, total: None) -> list[StageCheck]:
    """Replay one stage (or every stage, one after another) and measure its peak;
    on_stages(done, total) is told as each stage is done."""
    if stage is not None and not 0 <= stage < plan.setup.pipeline.stages:
        raise UserError(f"--stage {stage} is out of range: the plan has stages 0..{plan.setup.pipeline.stages - 1}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but this torch sees no CUDA device; use --device cpu")
    pipeline = plan.setup.pipeline
    if pipeline.schedule not in ("1F1B", "GPipe"):
        raise UserError(f"validate replays one stage a rank under 1F1B or GPipe, and this plan runs {pipeline.schedule} "
                        f"({pipeline.chunks} stage{'s' if pipeline.chunks > 1 else ''} a rank): `ckplan launch` runs it "
                        "and measures every rank's peak")
    prepared = prepare(plan, plan_file=plan_file, force=force)
    indices = [stage] if stage is not None else range(plan.setup.pipeline.stages)
    checks = []
    for index in indices:
        try:
            checks.append(replay_stage(plan, prepared, index, device=torch.device(device), seed=seed))
        except (MemoryError, torch.OutOfMemoryError) as exc:
            raise UserError(f"replaying stage {index} ran out of this machine's memory: it holds what the stage's rank "
                            f"would, {plan.setup.pipeline.microbatches:,} microbatches of "
                            f"{plan.setup.pipeline.micro_batch_size} samples in its buffers; validate it where the "
                            "stage's memory is, or check the plan's microbatches") from exc
        on_stages(len(checks), len(indices))
    return checks


def replay_stage(plan: Plan, prepared: Prepared, index: int, *, device: torch.device, seed: int) -> StageCheck:
    with _user_code(index, prepared.model_path, "build_model()"):
        replay = _build_replay(plan, prepared, index, device=device, seed=seed)
    if replay.optimizer is not None:  # zero gradients: creates the optimizer state a launch's warm-up creates
        replay.optimizer.step()
    if device.type == "cuda":  # what building the whole model left cached is no part of the stage's step
        torch.cuda.empty_cache()
    with PeakMemory(device, external=replay.held_before_step()) as mem:
        replay.step(partial(forget_module_stats, mem), blame=partial(_user_code, index, prepared.model_path))
    stage_plan = prepared.strategy.stages[index]
    predicted = stage_plan.predicted
    return StageCheck(index, mem.peak_bytes, plan.setup.pipeline.mem_caps_bytes[index], replay.in_flight,
                      predicted.peak_bytes if predicted else None, mem.reserved_bytes,
                      predicted.reserved_bytes if predicted else None)


@dataclass
class _Replay:
    """One stage and the tensors its pipeline rank would hold, ready to replay a step."""

    module: StageModule
    optimizer: torch.optim.Optimizer | None  # None: the stage has no parameters
    loss_fn: Callable
    order: list[tuple[str, int]]
    sends: Callable[[], _Sends]
    batch: torch.Tensor | None  # first stage: the whole batch
    target: torch.Tensor | None  # last stage: all targets
    recv: list[torch.Tensor]  # stage > 0: one input buffer per microbatch
    grad_recv: list[torch.Tensor]  # stage < last: one output-gradient buffer per microbatch
    in_flight: int  # most microbatches whose activations the stage holds at once
    num_microbatches: int

    def held_before_step(self) -> list:
        return [self.module, self.optimizer, self.batch, self.target, *self.recv, *self.grad_recv]

    def step(self, before_forward: Callable[[], None], blame: Callable = lambda what: nullcontext()) -> None:
        """blame(what): a context naming the user's code that runs inside it."""
        first, last, num_mb = self.batch is not None, self.target is not None, self.num_microbatches
        self.module.zero_grad(set_to_none=False)
        cache: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}
        losses = []  # the schedule keeps every microbatch's loss until the step ends
        sends = self.sends()
        for op, mb in self.order:
            if op == "F":
                before_forward()
                x = self.batch.tensor_split(num_mb)[mb] if first else self.recv[mb].requires_grad_(
                    self.recv[mb].is_floating_point())
                with blame(lambda: f"layer {self.module.running!r}"):
                    out = self.module(x)
                with blame("loss_fn(output, target)"):
                    loss = self.loss_fn(out, self.target.tensor_split(num_mb)[mb]) if last else None
                losses.append(loss)
                cache[mb] = (out, x, loss)
                if not last:
                    sends.output(mb, out)
            else:
                out, x, loss = cache.pop(mb)
                with blame(lambda: f"the backward of layer {self.module.running!r}"):
                    torch.autograd.backward(loss if last else out, None if last else self.grad_recv[mb])
                if not first:
                    sends.grad(x.grad)
                    x.grad = None
                sends.backward_done(mb)
                del out, x, loss
        del sends
        for param in self.module.parameters():
            param.grad.div_(num_mb)  # the schedule averages over microbatches
        if self.optimizer is not None:
            self.optimizer.step()


def _build_replay(plan: Plan, prepared: Prepared, index: int, *, device: torch.device, seed: int) -> _Replay:
    setup = plan.setup
    num_mb = setup.pipeline.microbatches
    stage_plan = prepared.strategy.stages[index]
    first, last = index == 0, index == setup.pipeline.stages - 1
    dtype = torch_dtype(plan.dtype)
    model_file = prepared.model_file
    layers = build_layers(model_file, seed=seed)
    inputs, targets = training_batch(model_file, setup.pipeline.micro_batch_size * num_mb, seed=seed)
    boundary = _stage_input(layers, stage_plan.layers[0], inputs.tensor_split(num_mb)[0], dtype,
                            stage=index, path=model_file.path).to(device)
    by_name = dict(layers)
    module = stage_module([(fqn, by_name[fqn]) for fqn in stage_plan.layers], options=stage_options(stage_plan))
    del layers, by_name  # the rest of the model is freed, as on a real rank
    module.to(device=device, dtype=dtype)
    allocate_grads(module)
    with torch.no_grad(), _user_code(index, model_file.path, lambda: f"layer {module.running!r}"):
        output = module(boundary)
    warmup = num_mb if setup.pipeline.schedule == "GPipe" else min(setup.pipeline.stages - index, num_mb)
    return _Replay(
        module=module,
        optimizer=optimizer_for(setup.training.optimizer, module),
        loss_fn=model_file.loss_fn,
        order=replay_order(setup.pipeline.schedule, num_stages=setup.pipeline.stages, num_microbatches=num_mb, stage_index=index),
        sends=partial(_Sends, setup.pipeline.schedule, warmup=min(setup.pipeline.stages - index, num_mb), num_microbatches=num_mb),
        batch=to_device(inputs, device, dtype) if first else None,
        target=to_device(targets, device, dtype) if last else None,
        recv=[] if first else [boundary.clone() for _ in range(num_mb)],
        grad_recv=[] if last else [torch.randn_like(output) * 1e-3 for _ in range(num_mb)],
        in_flight=warmup,
        num_microbatches=num_mb,
    )


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


def _stage_input(layers, first_layer: str, microbatch: torch.Tensor, dtype: torch.dtype, *, stage: int,
                 path: Path) -> torch.Tensor:
    """The stage's input for one microbatch: the model's input through the layers before it."""
    x = microbatch.to(dtype) if microbatch.is_floating_point() else microbatch
    with torch.no_grad():
        for fqn, layer in layers:
            if fqn == first_layer:
                break
            try:
                x = layer.to(dtype).train()(x)
            except Exception as exc:
                raise UserError(f"stage {stage}: layer {fqn!r}, run to make the stage's input, raised "
                                f"{_user_traceback(exc, path)}") from exc
    return x.detach()


@contextmanager
def _user_code(stage: int, path: Path, what: str | Callable[[], str]) -> Iterator[None]:
    """The user's layer or loss raised: one sentence naming the stage and the code, no traceback."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        name = what() if callable(what) else what
        raise UserError(f"stage {stage}: {name} raised {_user_traceback(exc, path)}") from exc
