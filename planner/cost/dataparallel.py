"""The data-parallel side of the cost model: ZeRO stages, shard groups (HSDP) and
optimizer offload. Pure functions of a layer's parameter count and the TrainSetup;
costmodel.py folds them into its per-layer terms, so both solvers and evaluate() see them.

Ranks: `dp` replicas of every pipeline stage. ZeRO shards over a shard group of K ranks
(`shard_group`, default all dp) and replicates across the R = dp / K groups: dp 4, K 2
gives shard groups [0,1] [2,3] and replica groups [0,2] [1,3].

Memory per parameter (w, g, o: weights, gradients, optimizer state incl. an fp32 master):
    ZeRO 1: o / K     ZeRO 2: + g / K     ZeRO 3: + w / K     offload: o on the host
    beside them, whole at every stage, the optimizer's own fp32 gradients where its record keeps
    some (DeepSpeed 56c52238's BF16_Optimizer: + 4, hp_grad_bytes)
    ZeRO 1 on ckplan's runtime gives each rank whole tensors: a stage's largest, where it
    outweighs 1/K of the stage, is held whole (zero_one_excess_bytes)
    where weights stay gathered (ZeRO 2; ZeRO 3 with per-iteration gathers) FSDP2 keeps its
    w / K shard beside them: w + w / K (measured by scripts/bench_dp_static.py)
    ZeRO 2/3 also hold a layer's unsharded gradient and FSDP2's buffers for the layer computing
    (unsharded_bytes), and HSDP's ZeRO 3 the reduced gradient shards of the layers its backward
    has passed (reduced_bytes_per_param)

Communication, bandwidth terms of ring collectives (n ranks, B bytes, bandwidth bw):
    all-reduce 2 (n-1)/n · B / bw        reduce-scatter = all-gather = (n-1)/n · B / bw
    ZeRO 0: all-reduce the gradients over dp, once per iteration (accumulated over microbatches)
    ZeRO 1: reduce-scatter in the shard group + all-reduce of the 1/K shard across the R
            replicas, once per iteration; after the step all-gather the updated weights in the group
    ZeRO 2: the same reduction every microbatch (gradients stay sharded, so they cannot be
            accumulated unsharded); after the step the weight all-gather
    ZeRO 3: the reduction every microbatch, and the weights all-gathered for every microbatch's
            forward and again for its backward (resharded after forward); no gather after the step
    ZeRO 2/3 with zero_gather "per-iteration" (torch.distributed.pipelining with FSDP2): weights
            and gradients stay whole through the microbatches, one reduce-scatter and one gather
            per iteration; memory and time then those of ZeRO 1
Offload (the rank's 1/K of the parameters with ZeRO ≥ 1, all of them without): device→host
gradient copy, host optimizer step, host→device weight copy; serial, or overlapped in chunks
of OFFLOAD_CHUNK_PARAMS: every chunk costs the slowest of the three, plus one chunk's other two
to fill the pipeline (per layer: the runtime overlaps within each layer's parameters).

All of it is charged once per iteration to the layer's optimizer-step term (after the last
backward, before the next forward): not overlapped with compute, an upper bound where the
framework overlaps the reduction with the backward or ZeRO-3's gathers with the previous layer.

Expert parallelism (ep E, E dividing dp): the routed experts of a MoE layer are split over E of
the dp ranks, as Megatron-LM (expert-model-parallel ranks taken from the data-parallel ones)
and torchtitan (expert_parallel_degree, EP borrowing the FSDP ranks) run them. A rank holds
1/E of the experts' parameters, and each expert is replicated over the dp / E ranks of its
expert-data-parallel group, where its gradients are reduced and ZeRO shards its state (shard
group K / E under HSDP): Megatron's distributed optimizer shards expert state over that group,
torchtitan's FSDP2 over its efsdp mesh dimension. Every term above applies to the expert
parameters with that group (expert_setup); the dense ones keep dp and K.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import expertsetup, runtime_fp16, runtimes, sizedreduce
from planner.errors import UserError
from planner.schema import Profile, TrainSetup

# (weights, grads, optimizer state) bytes per parameter before sharding. bf16 mixed
# precision keeps an fp32 master copy in the optimizer state; bf16 (pure) keeps everything
# in bf16, as ckplan's runtime trains a bf16 profile (torch.optim's state takes the
# parameter's dtype).
BYTES_PER_PARAM = {
    ("fp32", "adam"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 4),  # momentum
    ("bf16", "adam"): (2, 2, 4),  # m + v in bf16
    ("bf16", "sgd"): (2, 2, 2),  # momentum in bf16
    ("bf16-mixed", "adam"): (2, 2, 12),  # master + m + v
    ("bf16-mixed", "sgd"): (2, 2, 8),  # master + momentum
    ("fp16-mixed", "adam"): (2, 2, 12),  # the same, the gradient's dtype the record's (runtime_fp16.py)
    ("fp16-mixed", "sgd"): (2, 2, 8),
}
FP32_BYTES = 4
OFFLOAD_CHUNK_PARAMS = 2**22  # 16 MiB of fp32 master per chunk
GB = 1e9


def expert_setup(setup: TrainSetup) -> TrainSetup:
    """The setup the routed experts' parameters see: dp / E replicas of each expert (its
    expert-data-parallel group), ZeRO over shard groups of K / E where the dense parameters
    shard over K. The setup itself without expert parallelism. Made once a setup (expertsetup.py)."""
    return expertsetup.made(setup)


def held_expert_params(expert_count: float, setup: TrainSetup) -> float:
    """The routed-expert parameters of a layer one rank holds: 1/E of them."""
    return expert_count / setup.data_parallel.ep


def shard_size(setup: TrainSetup) -> int:
    """Ranks one ZeRO shard group spans (1: nothing sharded)."""
    if setup.data_parallel.zero == 0:
        return 1
    return setup.data_parallel.shard_group or setup.data_parallel.dp


def replicas(setup: TrainSetup) -> int:
    """Shard groups that hold the same shards (all-reduced across)."""
    return setup.data_parallel.dp // shard_size(setup)


def kept_whole(setup: TrainSetup) -> bool:
    """ZeRO 2/3 keeping weights and gradients whole through the iteration's microbatches."""
    return setup.data_parallel.zero >= 2 and setup.data_parallel.zero_gather == "per-iteration"


@dataclass(frozen=True)
class ParamBytes:
    """Bytes per parameter before sharding, as the setup's runtime holds them."""

    weights: float  # the weights the layers compute with (gathered, or the replica's own)
    shard_weights: float  # the weights a rank's shard holds (fp32 where the parameter is the master)
    grads: float  # the gradient accumulated and reduced
    optim: float  # the optimizer's state, a separate fp32 master included
    hp_grads: float = 0.0  # the optimizer's own whole gradients beside `grads`, never sharded (record's hp_grad_bytes)


def param_bytes(setup: TrainSetup) -> ParamBytes:
    """BYTES_PER_PARAM for the precision and optimizer; under bf16-mixed the runtime's record says
    the gradient's dtype (Megatron-LM's fp32 main_grad, FSDP2's fp32 reduce_dtype), whether the
    shard is an fp32 parameter with no separate master (FSDP2's mixed precision), and the
    moments' dtype follows training.optimizer_state_dtype (Megatron --exp-avg-dtype), and the optimizer's
    own fp32 gradients beside them where the record keeps some (DeepSpeed 56c52238's BF16_Optimizer)."""
    weights, grads, optim = BYTES_PER_PARAM[(setup.training.precision, setup.training.optimizer)]
    shard, master, hp_grads = weights, 0, 0
    if runtime_fp16.mixed(setup.training.precision):
        record = runtimes.of(setup.training)  # under fp16-mixed its gradients are fp16_grad_bytes (runtime_fp16)
        shard, grads, master, optim = record.shard_weight_bytes, record.grad_bytes, record.master_bytes, optim - FP32_BYTES
        hp_grads = record.hp_grad_bytes
    if setup.training.optimizer_state_dtype == "bf16" and setup.training.precision != "bf16":
        optim /= 2  # the moments in bf16 (2 B) where they were fp32 (4 B)
    return ParamBytes(weights, shard, grads, optim + master, hp_grads)


def bytes_per_param(setup: TrainSetup) -> float:
    """Weights + grads + optimizer state per parameter on one device at its peak (during the
    microbatches), after ZeRO and offload."""
    held = param_bytes(setup)
    weights, grads, optim = held.shard_weights, held.grads, held.optim
    k = shard_size(setup)
    if setup.data_parallel.offload:
        optim = 0
    optim /= k
    if setup.data_parallel.zero >= 2 and not kept_whole(setup):
        grads /= k
    if setup.data_parallel.zero >= 3 and not kept_whole(setup):
        weights /= k
    elif setup.data_parallel.zero >= 2:
        # FSDP2, the runtime's ZeRO 2/3, keeps its 1/K shard of the weights beside the
        # gathered weights while it holds them gathered (measured: w + w/K, not w)
        weights = held.weights + weights / k
    return weights + grads + optim + held.hp_grads  # the optimizer's own gradients whole, whatever ZeRO shards


def unsharded_bytes(largest_param_count: int, setup: TrainSetup, *, fp8_count: int = 0) -> float:
    """Device bytes beyond the sharded state while FSDP2 (the runtime's ZeRO 2/3) works through
    one layer, for the model's largest layer (a constant per stage as the solvers take it).
    Measured on the runtime (scripts/bench_dp_static.py, the peak's tensors by kind):
        ZeRO 3, backward: the weights of the layer computing and the prefetched next layer's
            all-gather buffer (2 w); the layer's unsharded gradient and the previous layer's
            reduce-scatter input, which FSDP2 keeps until the next reduce-scatter (2 g)
        ZeRO 2, forward: the all-gather buffer of the layer copying out and the previous one's,
            kept to overlap (2 w; the gathered weights themselves are in its static bytes);
            backward: the unsharded gradient and the kept reduce-scatter input (2 g)
    Under the float8 all-gather the two gathered buffers hold its `fp8_count` Float8 weights at 1 B
    (gathered_bytes). 0 without sharding, and when ZeRO 2/3 keep weights and gradients whole."""
    if shard_size(setup) == 1 or kept_whole(setup) or setup.data_parallel.zero < 2:
        return 0.0
    held = param_bytes(setup)
    weights, grads = held.weights, held.grads
    if setup.data_parallel.zero >= 3:
        # the unsharded gradient in the weights' dtype, the reduce-scatter input in the reduce dtype
        # (FSDP2's reduce_dtype: fp32 under torchtitan's mixed precision)
        return 2 * gathered_bytes(largest_param_count, setup, fp8_count=fp8_count) + largest_param_count * (weights + grads)
    return largest_param_count * 2 * max(weights, grads)


def fp8_whole_saving_bytes(fp8_count: float, setup: TrainSetup) -> float:
    """ZeRO 2/3 kept whole beside a pipeline (bytes_per_param charges the gathered weights whole in
    their dtype): under the float8 all-gather a Float8 weight's whole copy is the gathered float8
    one, 1 B; what that saves of these `fp8_count` parameters."""
    if not (setup.training.fp8_all_gather and setup.data_parallel.zero >= 2 and kept_whole(setup)
            and shard_size(setup) > 1):
        return 0.0
    return fp8_count * (param_bytes(setup).weights - FP8_GATHERED_BYTES)


def zero_one_excess_bytes(param_count: float, largest_param_count: int, setup: TrainSetup) -> float:
    """ZeRO 1 where the runtime's record says it partitions whole tensors (ckplan's runtime:
    ZeroRedundancyOptimizer; Megatron-LM's, DeepSpeed's and ColossalAI's flat buffers split
    evenly and hold no excess): each rank of a shard group steps whole tensors, so where a stage's largest tensor outweighs 1/K of its
    parameters the rank holding it keeps that tensor's optimizer state whole:
    o · max(0, largest - params / K) beyond the even 1/K (the greedy partition's result
    when the other tensors are small beside it; `launch` warns where they are not). 0 for
    other ZeRO stages, with the optimizer on the host, and where tensor sizes are unknown
    (analytic profiles: Megatron-LM's and DeepSpeed's flat partitions shard evenly)."""
    return whole_tensor_optim_bytes(setup) * max(0.0, (largest_param_count or 0) - param_count / shard_size(setup))


def whole_tensor_optim_bytes(setup: TrainSetup) -> float:
    """Optimizer state bytes per parameter that ZeRO 1's whole-tensor partition places on the
    device (o); 0 where no rank holds whole tensors of a shard group's state there."""
    if setup.data_parallel.zero != 1 or shard_size(setup) == 1 or setup.data_parallel.offload:
        return 0.0
    if not runtimes.of(setup.training).zero1_whole_tensors:
        return 0.0
    return param_bytes(setup).optim


def reduced_bytes_per_param(setup: TrainSetup) -> float:
    """HSDP's ZeRO 3 (shard groups with replicas, reducing per microbatch): FSDP2 keeps every
    layer's reduce-scatter output (its 1/K of the gradient, the input of the all-reduce across
    replicas) until the backward ends, so a stage's backward holds one for each layer it has
    reduced: g / K per parameter of every layer but the one computing (costmodel charges the
    stage's layers and takes the first one's back). ZeRO 2 frees more as it goes: each
    reduced layer's gathered weights (w >= g / K) are resharded."""
    if setup.data_parallel.zero < 3 or kept_whole(setup) or replicas(setup) == 1 or shard_size(setup) == 1:
        return 0.0
    return param_bytes(setup).grads / shard_size(setup)


def host_bytes_per_param(setup: TrainSetup) -> float:
    """Host bytes per parameter of the rank with the optimizer offloaded: the fp32 optimizer
    state, the fp32 master weights and the fp32 gradient the step reads, whatever the device
    trains in (planner/runtime/offload.py steps fp32 masters); / K with ZeRO ≥ 1. 0 without offload."""
    if not setup.data_parallel.offload:
        return 0.0
    _, _, fp32_state = BYTES_PER_PARAM[("fp32", setup.training.optimizer)]
    return (fp32_state + FP32_BYTES + FP32_BYTES) / shard_size(setup)


# ---------------------------------------------------------------- time


def _ms(num_bytes: float, gb_per_s: float | None) -> float:
    return 0.0 if gb_per_s is None else num_bytes / (gb_per_s * GB) * 1e3


def all_reduce_ms(num_bytes: float, ranks: int, gb_per_s: float | None) -> float:
    return _ms(2 * (ranks - 1) / ranks * num_bytes, gb_per_s)


def reduce_scatter_ms(num_bytes: float, ranks: int, gb_per_s: float | None) -> float:
    """Also an all-gather's time: each rank sends and receives (n-1)/n of the buffer."""
    return _ms((ranks - 1) / ranks * num_bytes, gb_per_s)


def all_to_all_ms(num_bytes: float, ranks: int, gb_per_s: float | None) -> float:
    """One all-to-all of `num_bytes` per rank, split evenly: each rank sends (n-1)/n of it to the
    others and receives as much (full duplex), at the link's one-way bandwidth."""
    return _ms((ranks - 1) / ranks * num_bytes, gb_per_s)


def reductions_per_iteration(setup: TrainSetup) -> int:
    """ZeRO 2/3 reduce every microbatch's gradients; ZeRO 0/1 (and 2/3 kept whole) accumulate,
    then reduce once."""
    return setup.pipeline.microbatches if setup.data_parallel.zero >= 2 and not kept_whole(setup) else 1


def grad_reduce_ms(param_count: int, setup: TrainSetup, *, stride: int | None = None) -> float:
    """Gradient reduction of these parameters per iteration; `stride`: its group's ranks apart (sizedreduce)."""
    if setup.data_parallel.dp == 1:
        return 0.0
    grads = param_bytes(setup).grads  # reduced in the dtype accumulated (fp32 main_grad, FSDP2's reduce_dtype)
    num_bytes, k, r = param_count * grads, shard_size(setup), replicas(setup)
    if k == 1 or (setup.data_parallel.zero == 1 and runtimes.of(setup.training).zero1_all_reduces):
        return sizedreduce.all_reduce_ms(num_bytes, setup.data_parallel.dp, setup, setup.data_parallel.shard_gb_per_s,
                                         stride=stride)
    once = reduce_scatter_ms(num_bytes, k, setup.data_parallel.shard_gb_per_s) + all_reduce_ms(num_bytes / k, r,
                                                                                 setup.data_parallel.replica_gb_per_s)
    return once * reductions_per_iteration(setup)


FP8_GATHERED_BYTES = 1  # a Float8 linear's weight gathered in float8 (torchao fsdp_utils.py fsdp_pre_all_gather)


def gathered_bytes(param_count: float, setup: TrainSetup, *, fp8_count: float = 0) -> float:
    """Bytes of these parameters gathered (in the dtype computed with), of which `fp8_count` are
    Float8 linears' weights: 1 B each under FSDP2's float8 all-gather (torchao v0.11.0
    `torchao/float8/fsdp_utils.py` WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather casts the
    shard to float8 and gathers it, its scale beside), the weights' dtype otherwise."""
    fp8 = fp8_count if setup.training.fp8_all_gather else 0
    return (param_count - fp8) * param_bytes(setup).weights + fp8 * FP8_GATHERED_BYTES


def weight_gather_ms(param_count: int, setup: TrainSetup, *, fp8_count: int = 0) -> float:
    """Weight all-gathers in the shard group per iteration: ZeRO 1/2 once after the step
    (each rank updated its shard), ZeRO 3 twice per microbatch (forward, backward); Float8
    linears' weights in float8 under the float8 all-gather (gathered_bytes)."""
    k = shard_size(setup)
    if k == 1:
        return 0.0
    gathers = 2 * setup.pipeline.microbatches if setup.data_parallel.zero >= 3 and not kept_whole(setup) else 1
    return gathers * reduce_scatter_ms(gathered_bytes(param_count, setup, fp8_count=fp8_count), k,
                                       setup.data_parallel.shard_gb_per_s)


def offload_phases_ms(param_count: int, setup: TrainSetup) -> tuple[float, float, float]:
    """(device→host gradient copy, host step, host→device weight copy) for the parameters of
    these that this rank steps. The host step needs setup.data_parallel.host_step_ns_per_param. No gradient copy at
    the step where ZeRO 3 copies each reduced partition in the backward's hooks (the record's
    waits_offloaded_grad_copy: planner/cost/deepspeed_waits.py charges it there)."""
    weights, grads, _ = BYTES_PER_PARAM[(setup.training.precision, setup.training.optimizer)]
    owned, host = param_count / shard_size(setup), setup.data_parallel.host_gb_per_s
    step_ms = owned * (setup.data_parallel.host_step_ns_per_param or 0.0) / 1e6
    in_backward = setup.data_parallel.zero == 3 and runtimes.of(setup.training).waits_offloaded_grad_copy
    return 0.0 if in_backward else _ms(owned * grads, host), step_ms, _ms(owned * weights, host)


def offload_ms(param_count: int, setup: TrainSetup) -> float:
    """Copy–step–copy for these parameters: serial, the sum; overlapped in chunks, every chunk
    the slowest phase, plus the first chunk's other two phases (the fill)."""
    phases = offload_phases_ms(param_count, setup)
    if not setup.data_parallel.offload_overlap:
        return sum(phases)
    owned = param_count / shard_size(setup)
    first_chunk = min(owned, OFFLOAD_CHUNK_PARAMS) / owned if owned else 0.0
    return max(phases) + first_chunk * (sum(phases) - max(phases))


def device_step_ms(step_ms: float, setup: TrainSetup) -> float:
    """The measured device step of these parameters, for the 1/K of them this rank owns;
    with offload the step runs on the host instead (offload_ms)."""
    return 0.0 if setup.data_parallel.offload else step_ms / shard_size(setup)


def as_torchtitan_runs(setup: TrainSetup) -> TrainSetup:
    """torchtitan shards with FSDP2 only, and beside a pipeline it keeps FSDP2's weights whole
    after the forward (its default reshard policy with PP, torchtitan/distributed/fsdp.py) and
    torch.distributed.pipelining syncs gradients on the last backward only: any ZeRO stage runs
    as ZeRO 3 kept whole through the iteration. Without a pipeline (one stage) torchtitan trains
    no pipeline schedule and FSDP2 reshards after every forward and reduce-scatters every
    backward (reshard_after_forward's default without PP): ZeRO 3 per microbatch. Unchanged
    without sharding, but under context parallelism, where FSDP2 shards over the cp ranks at least
    (torchtitan/distributed/parallel_dims.py 644-645 at b5bcd76c: fsdp_enabled = dp_shard_enabled or
    cp_enabled): ZeRO 0 there runs as ZeRO 3 in shard groups of cp."""
    dp = setup.data_parallel
    gather = "per-iteration" if setup.pipeline.stages > 1 else "per-microbatch"
    cp = setup.training.context_parallel
    if dp.zero == 0 and cp > 1:
        return setup.model_copy(update={"zero": 3, "zero_gather": gather, "shard_group": cp if dp.dp > cp else None})
    if dp.dp == 1 or dp.zero == 0 or (dp.zero == 3 and dp.zero_gather == gather):
        return setup
    return setup.model_copy(update={"zero": 3, "zero_gather": gather})


def overlaps_comm(setup: TrainSetup) -> bool:
    """Whether the runtime runs a layer's gradient reduction beside the backward of the layers
    before it, and prefetches ZeRO 3's weight gathers beside the compute: every framework does
    (DDP's and FSDP's buckets, Megatron's overlap-grad-reduce, DeepSpeed's overlap_comm);
    ckplan's runtime does under FSDP2 (ZeRO 2/3 reduced per microbatch) and reduces ZeRO 0/1
    after the last backward, and ZeRO 2/3 kept whole once at the end (runtime/mesh.py): the
    record's overlaps_grad_reduce, or the setup's overlap_grad_reduce where it says (Megatron-LM's flag)."""
    given = setup.data_parallel.overlap_grad_reduce
    if given if given is not None else runtimes.of(setup.training).overlaps_grad_reduce:
        return True
    return setup.data_parallel.zero >= 2 and not kept_whole(setup)


def exposed_comm_ms(param_count: int, setup: TrainSetup, *, fwd_ms: float = 0.0, bwd_ms: float = 0.0,
                    expert_count: int = 0, fp8_count: int = 0, shared: int = 0, frozen: int = 0) -> float:
    """A layer's gradient reductions and weight gathers per iteration, as far as they are not
    hidden behind compute (Megatron-LM's DDP under a schedule of several chunks a rank: none, the schedule's
    simulation places them, megatron_dp.py). Overlapped, each reduction hides behind a backward as long as this
    layer's (the layers before it run while it reduces) and each ZeRO 3 gather behind a
    forward or that backward; what the collective takes beyond that is exposed. Exact for a
    stage of equal layers but for one layer's reduction (the first layer's, which nothing
    follows; under 0.1% of the step for LLaMA 70B), which it leaves out. ZeRO 1/2's gather
    after the step waits for the step and is never hidden, but under Megatron-LM's --overlap-param-gather,
    where the next forward waits for it: each layer's behind its forward. Of param_count, `expert_count` are
    routed experts': the rank's 1/E of them reduce and gather in their expert-data-parallel
    group, in the same window as the dense ones (the collectives run one after the other). Where a
    pipeline's runtime reduces after the stage's last backward, the schedule carries them (pipereduce.py)."""
    gather, reduce = collectives_ms(param_count, setup, expert_count=expert_count, fp8_count=fp8_count, shared=shared, frozen=frozen)
    if ddp_buckets(setup):  # the schedule carries the reductions and overlapped gathers (megatron_dp.py)
        return 0.0 if gathers_in_forward(setup) else gather
    if gathers_in_forward(setup):  # each layer's behind the first forward of the one before: as its own
        gather = max(0.0, gather - fwd_ms)
    if not overlaps_comm(setup):
        return reduce + gather
    reductions = reductions_per_iteration(setup)
    reduce_once = reduce / reductions if reductions else 0.0
    if setup.data_parallel.zero >= 3 and not kept_whole(setup):
        gather_once = gather / (2 * setup.pipeline.microbatches)
        per_microbatch = (max(0.0, gather_once - fwd_ms)
                          + max(0.0, gather_once + reduce_once * (reductions > 1) - bwd_ms))
        last = 0.0 if reductions > 1 else max(0.0, reduce_once - bwd_ms)
        return setup.pipeline.microbatches * per_microbatch + last
    if reduced_after_last_backward(setup):
        return gather  # the reductions run after the stage's last backward, in the schedule
    return reductions * max(0.0, reduce_once - bwd_ms) + gather


def collectives_ms(param_count: int, setup: TrainSetup, *, expert_count: int = 0,
                   fp8_count: int = 0, shared: int = 0, frozen: int = 0) -> tuple[float, float]:
    """(the weight gathers, the gradient reductions) of a layer's parameters per iteration, ms, the routed experts'
    (`expert_count`, the rank's 1/E held) in their own group; `frozen` dense ones never reduced nor ZeRO 1-sent (§729)."""
    dense, experts = param_count - expert_count, expert_setup(setup)
    held = held_expert_params(expert_count, setup)
    apart = setup.comm.tp * setup.data_parallel.ep  # the expert-data-parallel group's ranks (Megatron-LM's order)
    reduce = grad_reduce_ms(max(0, dense - shared - frozen), setup) + (grad_reduce_ms(held, experts, stride=apart) if expert_count else 0.0)
    per_use = setup.data_parallel.zero >= 3 and not kept_whole(setup)  # ZeRO 3 gathers for each module using it
    unsent = frozen if setup.data_parallel.zero == 1 else 0  # ZeroRedundancyOptimizer sends the params it steps
    gather = weight_gather_ms(dense - (0 if per_use else shared) - unsent, setup, fp8_count=fp8_count) + (weight_gather_ms(held, experts)
                                                                   if expert_count else 0.0)
    return gather, reduce


def ddp_buckets(setup: TrainSetup) -> bool:
    """Whether the runtime's record says its DDP issues the collectives by bucket and chunk where the
    schedule places them (Megatron-LM, ZeRO 0 and 1 with data parallelism), and the schedule's
    simulation places them (several chunks a rank: planner/cost/megatron_dp.py). A schedule in closed
    form (1F1B, no pipeline), which the solvers' objective must equal, keeps exposed_comm_ms's per-layer form."""
    return (setup.data_parallel.dp > 1 and setup.data_parallel.zero <= 1 and setup.pipeline.chunks > 1
            and runtimes.of(setup.training).ddp_buckets)


def gathers_in_forward(setup: TrainSetup) -> bool:
    """Megatron-LM's --overlap-param-gather under its distributed optimizer (ZeRO 1): the gather after the step
    waited for bucket by bucket in the next forward instead (the record's ddp_buckets)."""
    return (setup.data_parallel.zero == 1 and setup.data_parallel.overlap_param_gather
            and runtimes.of(setup.training).ddp_buckets)


def reduced_after_last_backward(setup: TrainSetup) -> bool:
    """Whether a pipeline stage's gradients, kept whole through its microbatches, are reduced only after
    its last backward (the record's reduces_after_last_backward): the schedule carries them (pipereduce.py)."""
    return (setup.pipeline.stages > 1 and kept_whole(setup) and setup.data_parallel.dp > 1
            and runtimes.of(setup.training).reduces_after_last_backward)


def step_term_ms(param_count: int, step_ms: float, setup: TrainSetup, *, fwd_ms: float = 0.0, bwd_ms: float = 0.0,
                 expert_count: int = 0, fp8_count: int = 0, shared: int = 0, frozen: int = 0) -> float:
    """Everything data parallelism charges a layer once per iteration: its optimizer step (on
    the device, or offloaded), and its gradient reduction and weight gathers where not hidden
    behind its forward (`fwd_ms`) and backward (`bwd_ms`) compute (exposed_comm_ms). Of
    param_count, `expert_count` are routed experts': the rank steps its 1/E of them, sharded
    over their expert-data-parallel group (the step's time per parameter, the layer's); `shared` are reduced,
    offloaded and stepped by an earlier layer (a tied head's weight on its embedding's rank), gathered here too;
    `frozen` gathered, neither reduced nor offloaded (runtime/mesh.py dp_optimizer holds those requiring grad)."""
    comm = exposed_comm_ms(param_count, setup, fwd_ms=fwd_ms, bwd_ms=bwd_ms, expert_count=expert_count,
                           fp8_count=fp8_count, shared=shared, frozen=frozen)
    if not expert_count:
        offload = offload_ms(max(0, param_count - shared - frozen), setup) if setup.data_parallel.offload else 0.0
        return device_step_ms(step_ms, setup) + offload + comm
    dense, experts = param_count - expert_count, expert_setup(setup)
    held = held_expert_params(expert_count, setup)
    per_param = step_ms / param_count
    step = device_step_ms(per_param * dense, setup) + device_step_ms(per_param * held, experts)
    offload = offload_ms(max(0, dense - frozen), setup) + offload_ms(held, experts) if setup.data_parallel.offload else 0.0
    return step + offload + comm


# ---------------------------------------------------------------- defaults and checks

def profile_gpu(profile: Profile):
    """The GPU spec a cuda profile was made for (analytic: recorded; measured: by name)."""
    from planner.models import archs

    named = profile.assumptions.get("gpu")
    if isinstance(named, str):
        return archs.gpu(named)
    device = profile.device.name.lower().replace(" ", "")
    for key in sorted(archs.GPUS, key=len, reverse=True):
        if key.split("-")[0] in device:
            return archs.GPUS[key]
    raise UserError(f"no link bandwidths known for {profile.device.name}; give --shard-bandwidth, "
                    "--replica-bandwidth and --host-bandwidth (GB/s)")


def host_bytes_per_node(busiest_rank_bytes: float, setup: TrainSetup) -> float:
    """Host memory a plan takes on one node: every rank there as much as the busiest stage's
    rank (the node's ranks may hold any stage)."""
    return busiest_rank_bytes * min(setup.data_parallel.devices_per_node, setup.pipeline.stages * setup.data_parallel.dp)


def described(setup: TrainSetup) -> str:
    """The ZeRO stage, shard group, expert parallelism and offload in words: "ZeRO-1 in shard
    groups of 4, experts over ep 2, optimizer offloaded"."""
    group = f" in shard groups of {shard_size(setup)}" if setup.data_parallel.zero else ""
    ep = f", experts over ep {setup.data_parallel.ep}" if setup.data_parallel.ep > 1 else ""
    return f"ZeRO-{setup.data_parallel.zero}{group}{ep}" + (", optimizer offloaded" if setup.data_parallel.offload else "")


def communicated(setup: TrainSetup) -> str:
    """What crosses links per iteration, in a few words: AR all-reduce, RS reduce-scatter, AG
    all-gather (over n ranks: /n), xN times per iteration, offload's copies and host step."""
    k, r, m = shard_size(setup), replicas(setup), setup.pipeline.microbatches
    parts = []
    if setup.data_parallel.dp > 1 and k == 1:
        parts.append(f"AR grads/{setup.data_parallel.dp}")
    elif k > 1:
        per_microbatch = setup.data_parallel.zero >= 2 and not kept_whole(setup)
        across = f"+AR/{r}" if r > 1 else ""
        parts.append(f"RS grads/{k}{across}" + (f" x{m}" if per_microbatch else ""))
        parts.append(f"AG weights/{k} x{2 * m}" if per_microbatch and setup.data_parallel.zero >= 3 else f"AG weights/{k}")
    if setup.data_parallel.offload:
        parts.append("D2H, host step, H2D " + ("overlapped" if setup.data_parallel.offload_overlap else "serial"))
    return ", ".join(parts) or "nothing"
