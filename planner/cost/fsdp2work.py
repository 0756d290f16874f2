"""FSDP2's own GPU work around its collectives: the memory-bound copies before and after each
all-gather and reduce-scatter, which run on the GPU beside the layers' compute (the collectives'
transfer time is dataparallel.exposed_comm_ms). Charged once per iteration per layer, as bytes at
the profile's GPU's HBM bandwidth (cost/terms.py's "FSDP2's copies" row)."""

from __future__ import annotations

from planner.cost import runtimes
from planner.cost.dataparallel import (
    expert_setup,
    gathered_bytes,
    held_expert_params,
    kept_whole,
    param_bytes,
    reductions_per_iteration,
    shard_size,
)
from planner.schema import TrainSetup

# The analytic and fake profiles' backward adds every weight's gradient into its .grad, 3 x its bytes
# (planner/profiler/analytic_time.py ACCUMULATE: read both, write one), as autograd does where .grad
# exists. Under FSDP2 it never does: the unsharded parameter's .grad is None at every backward (taken
# by the reduce-scatter's copy-in, or moved into the fp32 accumulator: _fsdp_param_group.py 603-630),
# so autograd's AccumulateGrad stores the new gradient without a kernel.
PROFILE_ACCUMULATE = 3


def fsdp2_copy_bytes(param_count: float, setup: TrainSetup, *, fp8_count: float = 0) -> float:
    """Bytes FSDP2's own kernels move per iteration around its collectives for these parameters,
    where the runtime shards with FSDP2 (its record's zero_as_fsdp2) over K > 1 ranks; read from torch
    2.13.0 (cf30153c) torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:
      each all-gather (G B a parameter gathered, gathered_bytes; S B a parameter of the shard, w the weights' dtype):
        the shard cast into the flat all-gather input, `_foreach_copy_` 416-425 (read S, write w, / K;
        a Float8 weight's own pre-all-gather cast is torchao's, not counted here),
        copied into its slot of the all-gather output, all_gather_copy_in 263-276 (read and write G / K),
        and the copy-out into the unsharded parameters, split_with_sizes_copy 485-492 (read and write G);
      each reduce-scatter: the unsharded gradients (the weights' dtype) copied into the reduce-scatter
        input in the reduce dtype, 603 and 778-786 (`_chunk_cat`: read w, write g); from the second
        reduction of an iteration on, the reduced shard added into .grad, 749 (read 2 g / K, write g / K).
    Kept whole through M > 1 microbatches (a pipeline: no reduction until the last backward), the
    unsharded gradient is upcast to the reduce dtype after the first backward (read w, write g) and
    each later one added into it (read w + g, write g), _fsdp_param.py 802-820, _fsdp_param_group.py
    603-611; the reduce-scatter's copy-in then reads the reduce dtype. No divide runs: an fp32 or bf16
    reduce averages inside NCCL (ReduceOp.AVG, 812-846; so since pytorch#120919, 2024-02, before the
    torch torchtitan 9dec370 ran); the first reduced shard is the gradient
    itself (a view, 696-749: no copy where .grad is None, after zero_grad)."""
    k = shard_size(setup)
    if k == 1 or setup.data_parallel.zero < 2 or not runtimes.of(setup.training).zero_as_fsdp2:
        return 0.0
    held = param_bytes(setup)
    gathered = gathered_bytes(param_count, setup, fp8_count=fp8_count)
    cast_params = param_count - (fp8_count if setup.training.fp8_all_gather else 0)
    gather = cast_params * (held.shard_weights + held.weights) / k + 2 * gathered / k + 2 * gathered
    gathers = 2 * setup.pipeline.microbatches if setup.data_parallel.zero >= 3 and not kept_whole(setup) else 1
    reductions, microbatches = reductions_per_iteration(setup), setup.pipeline.microbatches
    if kept_whole(setup) and microbatches > 1:  # the unsharded gradient accumulated in the reduce dtype
        accumulate = param_count * ((held.weights + held.grads) + (microbatches - 1) * (held.weights + 2 * held.grads))
        return gathers * gather + accumulate + param_count * 2 * held.grads
    accumulate = (reductions - 1) * param_count * 3 * held.grads / k
    return gathers * gather + reductions * param_count * (held.weights + held.grads) + accumulate


def fsdp2_copies_ms(param_count: float, setup: TrainSetup, hbm_tbps: float | None, *, expert_count: float = 0,
                    fp8_count: float = 0) -> float:
    """fsdp2_copy_bytes, less the profile's .grad accumulation FSDP2 does not run (unrun_accumulate_bytes),
    at the GPU's HBM bandwidth (memory-bound copies; the copy-out and the
    reduce-scatter copy-in run on the compute stream, the two copy-ins on FSDP2's all-gather copy-in
    stream, charged the same: they share the HBM with the compute), in ms; 0 where the bandwidth is
    not known (a measured profile, whose step already ran them). Routed experts' parameters in their
    expert-data-parallel group (expert_setup)."""
    if not hbm_tbps:
        return 0.0
    dense = param_count - expert_count
    moved = fsdp2_copy_bytes(dense, setup, fp8_count=fp8_count) - unrun_accumulate_bytes(dense, setup)
    if expert_count:
        held, experts = held_expert_params(expert_count, setup), expert_setup(setup)
        moved += fsdp2_copy_bytes(held, experts) - unrun_accumulate_bytes(held, experts)
    return moved / (hbm_tbps * 1e12) * 1e3


def unrun_accumulate_bytes(param_count: float, setup: TrainSetup) -> float:
    """What the profile's backward charged for `.grad` accumulation (PROFILE_ACCUMULATE x the weights'
    bytes, every microbatch) that FSDP2 does not run, where it shards these parameters."""
    if shard_size(setup) == 1 or setup.data_parallel.zero < 2 or not runtimes.of(setup.training).zero_as_fsdp2:
        return 0.0
    return setup.pipeline.microbatches * PROFILE_ACCUMULATE * param_bytes(setup).weights * param_count
