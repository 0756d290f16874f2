"""FSDP2's own GPU work around its collectives: the memory-bound copies before and after each
all-gather and reduce-scatter, which run on the GPU beside the layers' compute (the collectives'
transfer time is dataparallel.exposed_comm_ms). Charged once per iteration per layer, as bytes at
the profile's GPU's HBM bandwidth (cost/terms.py's "FSDP2's copies" row)."""

from __future__ import annotations

from planner.cost import fsdpunits, links, runtimes, stepcomm
from planner.cost.comm import MS_PER_US
from planner.cost.dataparallel import (
    collectives_ms,
    expert_setup,
    exposed_comm_ms,
    gathered_bytes,
    held_expert_params,
    kept_whole,
    param_bytes,
    reductions_per_iteration,
    replicas,
    shard_size,
)
from planner.cost.layers import LayerCost, layer_costs
from planner.cost.rules import compute_ms
from planner.schema import Profile, TrainSetup

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


# The torchtitan records' FSDP2 units (RuntimeFacts.fsdp_units) whose order is read from code:
# "largest-layer" (ckplan's own runtime, measured) keeps dataparallel.exposed_comm_ms as it is.
ORDERED_UNITS = ("root-ends", "per-layer")


def _collectives_once_ms(layer: LayerCost, setup: TrainSetup) -> tuple[float, float]:
    """(one all-gather, one reduction) of the layer's parameters, ms: dataparallel's per-iteration
    gathers and reductions over their counts (their bytes over the link; no latency)."""
    gather, reduce = collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                                    fp8_count=layer.float8_param_count, frozen=layer.frozen_param_count)
    return gather / (2 * setup.pipeline.microbatches), reduce / reductions_per_iteration(setup)


def unit_latency_ms(setup: TrainSetup) -> tuple[float, float]:
    """(one all-gather, one reduction) of an FSDP2 unit: NCCL's ring latency (links.ring_latency_us, Ring /
    Simple) over the shard group, whose ranks lie tp apart, and for HSDP the replicas' all-reduce over their
    group (shard group x tp apart) after the reduce-scatter; the groups' nodes of the setup's gpus_per_node. One
    collective a unit (FSDP2's foreach_all_gather and foreach_reduce, _fsdp_collectives.py), whatever it holds."""
    k, r, tp = shard_size(setup), replicas(setup), setup.comm.tp
    per_node, intra = setup.comm.domain, stepcomm.in_node_hardware(setup)
    gather = links.ring_latency_us("all-gather", k, links.group_nodes(k, tp, per_node), intra)
    reduce = links.ring_latency_us("reduce-scatter", k, links.group_nodes(k, tp, per_node), intra)
    if r > 1:
        reduce += links.ring_latency_us("all-reduce", r, links.group_nodes(r, tp * k, per_node), intra)
    return gather * MS_PER_US, reduce * MS_PER_US


def edge_units_exposed_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """What FSDP2's first unit and the layer after it expose per iteration beyond what
    dataparallel.exposed_comm_ms charges them (which hides each layer's gathers and reduction behind
    its own compute), under ZeRO 3 resharded after forward with a record whose units were read.
    Read at torch 2.6.0 (the release of torch 1963fc8, torchtitan 9dec370's; the same at 2.13.0)
    torch/distributed/fsdp/_fully_shard/:
      - the first unit's all-gather waits for the optimizer step (_fsdp_state.py 130-138,
        _root_pre_forward: the all-gather streams wait on the current stream) and precedes every
        layer's compute: exposed whole, once a microbatch. Its reduce-scatter runs after the last
        backward op (the root's post_backward runs in _root_post_backward_final_callback, 284-309,
        where the root's inputs, the token ids, need no gradient; per-layer units: after the
        embedding's backward) and the step waits on it (304-307): exposed whole;
      - the second layer's all-gather queues behind the first unit's on the all-gather stream
        (_fsdp_collectives.py 128-170: the copy-in and all-gather streams wait on nothing else in
        forward) and its compute waits on it, so only the first layer's forward hides it; its
        reduce-scatter, issued after its backward, is hidden only by the first layer's backward, the
        last before the first unit's reduce-scatter on the same stream (379-382).
    Under torchtitan's "root-ends" units (9dec370: fully_shard(model) holds tok_embeddings, norm and
    output) the model's last layer is in the first unit; never resharded after forward (the root's
    clamp), it is gathered once and has no backward gather. A unit "per-layer" (2c8b5947, b5bcd76c)
    holds the first layer alone, and the last unit is hidden as every other. Beside a pipeline
    (weights kept whole) nothing changes here. The second layer's part is charged on the first, so
    that the blocks stay alike (the solvers' bounds count a kind's layers as one, solve/bounds.py).
    Each of these collectives takes NCCL's ring latency beside its bytes (unit_latency_ms: 32 µs over 8
    ranks of one node, 599 µs over 128 of 16, docs/framework-facts.md §141); the first unit's once, on the
    first layer, however many layers it holds. The collectives dataparallel.exposed_comm_ms hides carry
    none (their bytes alone)."""
    record = runtimes.of(setup.training)
    if record.fsdp_units not in ORDERED_UNITS or not fsdpunits.regathered_per_moment(setup, record.fsdp_units):
        return 0.0
    layers = profile.layers
    # the first unit: the first layer, and under "root-ends" the last (fsdpunits.unit_of_layers), read by
    # name, not by index: a stage's every layer asks
    root_last = record.fsdp_units == "root-ends" and len(layers) >= 3 and layer.name == layers[-1].name
    if layer.name != layers[0].name and not root_last:
        return 0.0
    m = setup.pipeline.microbatches
    extra = m * sum(_collectives_once_ms(layer, setup)) - _charged_ms(layer, setup)
    if layer.name == layers[0].name and len(layers) > 1:
        latency_gather, latency_reduce = unit_latency_ms(setup)
        extra += m * (latency_gather + latency_reduce)  # the first unit's one all-gather and one reduction
        second = layer_costs(profile)[1]
        gather, reduce = _collectives_once_ms(second, setup)
        extra += m * (max(0.0, gather + latency_gather - compute_ms(layer.fwd_ms, setup.time))
                      + max(0.0, reduce + latency_reduce - compute_ms(layer.bwd_ms, setup.time))) \
            - _charged_ms(second, setup)
    return extra


def _charged_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """dataparallel.exposed_comm_ms of the layer, as the step row charges it (rules.layer_step_ms)."""
    return exposed_comm_ms(layer.param_count, setup, fwd_ms=compute_ms(layer.fwd_ms, setup.time),
                           bwd_ms=compute_ms(layer.bwd_ms, setup.time), expert_count=layer.expert_param_count,
                           fp8_count=layer.float8_param_count, frozen=layer.frozen_param_count)
