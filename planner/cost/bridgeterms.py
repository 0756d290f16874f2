"""The memory terms of Megatron-Bridge's settings (the facts and their sources: planner/cost/bridgesettings.py,
which the runtime records read): what FP8 primary weights or TE's cached FP8 weights save against bf16 weights,
and the optimizer step's fp32 copy of bf16 gradients."""

from __future__ import annotations

from planner.cost import dataparallel, megatron_fsdp, runtimes
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
    """The optimizer step's fp32 copy of the rank's bf16 gradient shard (the record's bf16_grad_step_copy_bytes
    a parameter of its 1/K) under grad_reduce_bf16; 0 without it or with the optimizer on the host."""
    training = setup.training
    if not getattr(training, "grad_reduce_bf16", False) or setup.data_parallel.offload:
        return 0.0
    copy = runtimes.of(training).bf16_grad_step_copy_bytes
    return param_count * copy / dataparallel.shard_size(setup)
