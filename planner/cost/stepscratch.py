"""The optimizer step's temporaries per layer (the term step_scratch, planner/cost/terms.py): what torch's
Adam allocates beside its states, none where the runtime's Adam is fused and in place, Megatron-LM's fp32
copy of bf16 gradients, and the copy in the communication dtype DeepSpeed 56c52238's reduction makes of each
flat gradient group (the record's reduce_cast_bytes)."""

from __future__ import annotations

import dataclasses

from planner.cost import bridgeterms, dataparallel
from planner.cost.layers import LayerCost
from planner.cost.rules import per_param_bytes, runtime_facts
from planner.schema import TrainSetup

# Bytes per parameter of the temporaries torch's optimizer step allocates: Adam computes
# sqrt(v) / bias correction as a new tensor in the state's dtype (fp32 for fp32 and for
# bf16-mixed's master, bf16 for bf16) and updates in place (torch/optim/adam.py at torch 2.13,
# _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)); SGD with momentum
# updates in place. Measured on an H100 with torch 2.11 (docs/gpu-check.md): a bf16 stage's step peak at
# 2 B/param, where 4 predicted 2.6 GiB too many.
_STEP_SCRATCH_PER_PARAM = {("adam", "fp32"): 4, ("adam", "bf16-mixed"): 4, ("adam", "bf16"): 2, ("adam", "fp16-mixed"): 4,
                           ("sgd", "fp32"): 0, ("sgd", "bf16-mixed"): 0, ("sgd", "bf16"): 0, ("sgd", "fp16-mixed"): 0}


def layer_step_scratch_bytes(layer: LayerCost, setup: TrainSetup, device_type: str) -> float:
    """The optimizer step's temporaries for this layer's parameters (offload: the step runs on
    the host; none where the runtime's record says its Adam is fused and in place). ZeRO ≥ 1 steps 1/K of them: FSDP2 (ZeRO 2/3) 1/K of every tensor; ZeRO 1
    (ZeroRedundancyOptimizer) whole tensors, 1/K of them, so on cpu, where the step's scratch
    is that of its largest tensor (step_scratch_bytes), a rank may hold the whole of it. On one stage a parameter an
    earlier layer shares is stepped there, once (rules.layer_step_ms). A frozen parameter is never stepped (torch's
    optimizers skip a parameter without .grad: §710) and has no gradient to copy or cast."""
    if layer.shared_before and setup.pipeline.stages == 1:
        layer = dataclasses.replace(layer, param_count=layer.param_count - layer.shared_before)
    if layer.frozen_param_count:
        layer = dataclasses.replace(layer, param_count=max(0, layer.param_count - layer.frozen_param_count))
    copy = bridgeterms.step_grad_copy_bytes(layer.param_count, setup) + reduce_cast_bytes(layer, setup)
    if setup.data_parallel.offload or not runtime_facts(setup).adam_step_scratch:
        return copy  # fused multi-tensor Adam (Megatron-LM's TE/apex FusedAdam) allocates none
    per_param = _STEP_SCRATCH_PER_PARAM[(setup.training.optimizer, setup.training.precision)]
    if setup.training.optimizer_state_dtype == "bf16" and setup.training.precision != "bf16":
        per_param /= 2  # sqrt(v) in v's dtype
    if setup.data_parallel.zero == 1 and device_type != "cuda":
        return per_param_bytes(layer, setup, lambda _: per_param)
    return per_param_bytes(layer, setup, lambda part: per_param / dataparallel.shard_size(part))


def reduce_cast_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """The reduction's copy of the layer's whole gradients in the communication dtype, at the step beside the held
    state (the record's reduce_cast_bytes, under bf16-mixed: DeepSpeed 56c52238 all-reduces each flat fp32 group
    as a new bf16 tensor, copied back and freed before the next group's); every parameter of the layer, the
    step's scratch of a stage summing its layers as the groups' copies, one after the other, would not exceed."""
    per_param = runtime_facts(setup).reduce_cast_bytes
    if not per_param or setup.training.precision != "bf16-mixed":
        return 0.0
    return per_param_bytes(layer, setup, lambda _: per_param)
