"""torch's Adam keeps each parameter tensor's step count, a 4 B fp32 scalar, on the CPU unless capturable or fused
(torch 2.13.0 torch/optim/adam.py 168-176, optimizer.py 210-215; docs/framework-facts.md §382): device memory only
where the profile's device is the CPU (ckplan's runtime on gloo), host memory beside a GPU. Measured: 52 tensors x 4 B
= 208 B of the tied GPT fixture's peak at ZeRO 0, 2 and 3 (dp 2).

FSDP2 (ZeRO 2/3) keeps one per parameter, every rank a shard of each; ZeroRedundancyOptimizer (ZeRO 1) only its
partition's: charged all of them here, and zeroone.py charges the fullest rank's own instead where the profile records
each tensor's size (else over by at most the other ranks' 4 B each). An offloaded optimizer's are the host's (planner/runtime/offload.py). A profile that records no tensor
count (analytic ones, those made before) charges none.
"""

from __future__ import annotations

from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

STEP_COUNT_BYTES = 4  # torch.tensor(0.0): float32 under the default dtype (optimizer.py _get_scalar_dtype)


def per_tensor_bytes(profile: Profile, setup: TrainSetup) -> int:
    """A step count's device bytes: 4 for Adam on a CPU device with the optimizer on it, else 0."""
    return device_bytes(profile.device.type, setup)


def device_bytes(device_type: str, setup: TrainSetup) -> int:
    """per_tensor_bytes on a `device_type` device."""
    on_device = device_type == "cpu" and not setup.data_parallel.offload
    return STEP_COUNT_BYTES if on_device and setup.training.optimizer == "adam" else 0


def layer_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """The step counts of the layer's trained parameter tensors (each holder of a tied one counts it)."""
    return per_tensor_bytes(profile, setup) * layer.param_tensors


def tied_once_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """A tied parameter whose holders all share the stage is stepped once: minus the holders' counts beyond the
    first, known from the stage's position only on one stage (as rules.tied_once_bytes); none where the holders'
    counts are not recorded."""
    if setup.pipeline.stages != 1:
        return 0
    counted = {layer.name for layer in profile.layers if layer.param_tensors}
    return -per_tensor_bytes(profile, setup) * sum(sum(name in counted for name in item.layers[1:])
                                                   for item in profile.tied)


def rank_tied_once_bytes(profile: Profile, chunks, setup: TrainSetup) -> int:
    """A rank of several chunks (their layer names) steps a tied parameter once, its one module holding it once (a V
    puts the token embedding and the LM head on rank 0): minus the counts of its holders beyond the first chunk's."""
    counted = {layer.name for layer in profile.layers if layer.param_tensors}
    return -per_tensor_bytes(profile, setup) * sum(item.extra_holders(chunks, among=counted)
                                                   for item in profile.tied)
