"""Frozen parameters (requires_grad False: a fine-tuning model file's pretrained backbone): held as weights, but
torch makes them no gradient and its optimizers keep no state for them. The profile records each layer's trained
count (LayerProfile.trained_param_count), the layer costs its frozen rest (LayerCost.frozen_param_count), and the
static term takes off what dataparallel.bytes_per_param charges them beyond their weights."""

from __future__ import annotations

from planner.cost import dataparallel
from planner.schema import TrainSetup


def trained_bytes_per_param(setup: TrainSetup) -> float:
    """Of dataparallel.bytes_per_param, what only a trained parameter holds, after ZeRO and offload: its gradient
    (sharded under ZeRO 2/3 but where kept whole), its optimizer state and fp32 master (1/K of them, none on the
    device when offloaded) and the optimizer's own gradients (hp_grads, whole)."""
    held = dataparallel.param_bytes(setup)
    k = dataparallel.shard_size(setup)
    optim = 0.0 if setup.data_parallel.offload else held.optim / k
    sharded = setup.data_parallel.zero >= 2 and not dataparallel.kept_whole(setup)
    return (held.grads / k if sharded else held.grads) + optim + held.hp_grads


def frozen_saving_bytes(frozen_count: float, setup: TrainSetup) -> float:
    """What the static term would charge these frozen parameters beyond their weights: no gradient (autograd
    accumulates none into a leaf with requires_grad False), no optimizer state (torch's Adam, AdamW and SGD step
    only parameters whose .grad is set: §710), so no fp32 master nor optimizer-owned gradient either."""
    return frozen_count * trained_bytes_per_param(setup) if frozen_count else 0.0
