"""`ckplan launch --reference`: the same training in one process, to check the pipeline.

The reference builds the whole model as every rank builds it (same seed), trains the
same number of steps on the same batch, split into the same microbatches, with the
same optimizer, and records the mean microbatch loss of each step as the last stage
does. The schedule scales each microbatch's gradient by 1/M; so does the reference.
With data parallelism the batch is dp x M microbatches, replica d training the d-th run of
M of them and the replicas averaging their gradients: the reference trains on all dp x M
microbatches in order (replica d's microbatch j is the reference's d x M + j, its random
numbers too), each gradient scaled by 1/(dp x M), and records the mean over all of them.
ZeRO, shard groups and offload change where the state lives, not the values.
Checkpointing changes no value, so the reference runs without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from planner.runtime.checks import Prepared, prepare
from planner.runtime.stagemodule import (
    build_layers,
    optimizer_for,
    stage_module,
    to_device,
    torch_dtype,
    training_batch,
)
from planner.schema import Plan, RunReport


@dataclass(frozen=True)
class LossDiff:
    step: int
    pipeline: float
    reference: float
    tolerance: float

    @property
    def diff(self) -> float:
        return self.pipeline - self.reference

    @property
    def ok(self) -> bool:
        return abs(self.diff) <= self.tolerance


def reference_losses(plan: Plan, prepared: Prepared, *, num_steps: int, seed: int,
                     device: torch.device | str = "cpu") -> list[float]:
    """Train `num_steps` steps in this process; the mean microbatch loss of each."""
    setup, model_file = plan.setup, prepared.model_file
    dtype = torch_dtype(plan.dtype)
    model = stage_module(build_layers(model_file, seed=seed)).to(device=device, dtype=dtype)
    optimizer = optimizer_for(setup.training.optimizer, model)
    num_microbatches = setup.pipeline.microbatches * setup.data_parallel.dp
    inputs, targets = training_batch(model_file, setup.pipeline.micro_batch_size * num_microbatches, seed=seed)
    pairs = list(zip(to_device(inputs, device, dtype).tensor_split(num_microbatches),
                     to_device(targets, device, dtype).tensor_split(num_microbatches), strict=True))
    torch.manual_seed(seed)
    losses = []
    for step in range(num_steps):
        model.zero_grad(set_to_none=False)
        step_losses = []
        for microbatch, (x, target) in enumerate(pairs):
            model.rng_key = (seed, step, microbatch)  # each layer's random numbers as on its stage
            loss = model_file.loss_fn(model(x), target)
            (loss / num_microbatches).backward()
            step_losses.append(loss.detach())
        if optimizer is not None:
            optimizer.step()
        losses.append(torch.stack(step_losses).mean().item())
    return losses


def loss_tolerance(dtype: torch.dtype, loss: float) -> float:
    """Float tolerance for one step's loss: sqrt(eps) of the plan's dtype, relative to the
    loss (absolute below 1). The pipeline sums gradients in another order than one
    process (per stage, then across stages), which rounds differently; anything a
    training bug causes (an untied copy, a missed microbatch) is orders larger."""
    return math.sqrt(torch.finfo(dtype).eps) * max(1.0, abs(loss))


def compare_losses(pipeline: list[float], reference: list[float], dtype: torch.dtype) -> list[LossDiff]:
    return [LossDiff(step, got, want, loss_tolerance(dtype, want))
            for step, (got, want) in enumerate(zip(pipeline, reference, strict=True))]


def against_reference(plan: Plan, report: RunReport, *, plan_file: str | Path | None, seed: int,
                      force: bool = False) -> list[LossDiff]:
    """Every step of `report` (warm-up, timed, memory) next to the same step in one process."""
    prepared = prepare(plan, plan_file=plan_file, strategy=report.strategy, force=force)
    device = "cuda" if report.device.type == "cuda" else "cpu"
    reference = reference_losses(plan, prepared, num_steps=len(report.losses), seed=seed, device=device)
    return compare_losses(report.losses, reference, torch_dtype(plan.dtype))
