"""The memory terms of Megatron-Bridge's settings (the facts and their sources: planner/cost/bridgesettings.py,
which the runtime records read): what FP8 primary weights or TE's cached FP8 weights save against bf16 weights,
and the optimizer step's fp32 copy of bf16 gradients."""

from __future__ import annotations

from planner.cost import dataparallel, megatron_fsdp, runtime_fp16, runtimes
from planner.cost.bridgesettings import TN_ONLY_GPUS


def fp8_primary_weights(training, record) -> bool:
    """The Float8 linears' weights are kept in FP8 (Megatron-LM's --fp8-param-gather under TE)."""
    return bool(training.float8 and training.fp8_all_gather and record.fp8_param_bytes)


def fp8_param_saving_bytes(fp8_count: float, setup, profile) -> float:
    """What Transformer Engine's Float8 weights save against the bf16 weights bytes_per_param charges, for these
    `fp8_count` Float8 weight parameters held whole (ZeRO 0/1): with FP8 primary weights the bf16 weight less
    fp8_param_bytes and, on Hopper (the profile's GPU), the transpose beside it; without them, less TE's cached FP8
    copy of the weight beside the bf16 one (te_weight_workspace_bytes and the Hopper transpose: negative).
    0 under ZeRO 2/3 (the shard and its gathers: dataparallel.gathered_bytes; TE's workspaces there not read)
    but Megatron-FSDP's ZeRO 3, whose shard of them is FP8 (megatron_fsdp.fp8_shard_saving_bytes), and without
    Float8 under a record that reads them."""
    if megatron_fsdp.runs(setup):
        return megatron_fsdp.fp8_shard_saving_bytes(fp8_count, setup)
    record = runtimes.of(setup.training)
    if not (fp8_count and setup.training.float8 and record.fp8_param_bytes) or setup.data_parallel.zero >= 2:
        return 0.0
    transpose = record.fp8_param_transpose_bytes if dataparallel.profile_gpu(profile).name in TN_ONLY_GPUS else 0
    if fp8_primary_weights(setup.training, record):
        return fp8_count * (dataparallel.param_bytes(setup).shard_weights - record.fp8_param_bytes - transpose)
    return -fp8_count * (record.te_weight_workspace_bytes + transpose)


def step_grad_copy_bytes(param_count: float, setup) -> float:
    """The optimizer step's fp32 copy of the rank's 16-bit gradient shard, held from the step to the next
    zero_grad: under grad_reduce_bf16 the record's bf16_grad_step_copy_bytes a parameter of its 1/K, under
    fp16-mixed its fp16_grad_step_copy_bytes (runtime_fp16.py); 0 without either or with the optimizer on the host."""
    training = setup.training
    if setup.data_parallel.offload:
        return 0.0
    record = runtimes.of(training)
    copy = record.fp16_grad_step_copy_bytes if getattr(training, "precision", None) == runtime_fp16.FP16 else \
        record.bf16_grad_step_copy_bytes if getattr(training, "grad_reduce_bf16", False) else 0
    return param_count * copy / dataparallel.shard_size(setup)


def held_step_copy_bytes(layers, setup) -> float:
    """step_grad_copy_bytes of these layers, held past the step on their rank: a parameter an earlier layer shares
    copied once where one stage holds both (the step's own rule, stepscratch.layer_step_scratch_bytes)."""
    one_stage = setup.pipeline.stages == 1
    return sum(step_grad_copy_bytes(layer.param_count - (layer.shared_before if one_stage else 0), setup)
               for layer in layers)
