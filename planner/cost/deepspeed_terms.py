"""DeepSpeed ZeRO 3's gathers as its coordinator runs them, charged per layer (framework-facts §103, §105).

Where the plan is scored for DeepSpeed at ZeRO 3 (sharded, per microbatch) on a profile whose block ckplan
can split into DeepSpeed's submodules (an analytic profile of a GPT block: planner/cost/deepspeed_zero3.py
gpt_block, its parameters equal to the layer's), two terms replace FSDP2's:

- memory: the largest-layer term (dataparallel.unsharded_bytes: 8 B a parameter of the largest layer, FSDP2's
  two gathered layers and two gradients) gives way to what the coordinator holds at the layer's backward
  (deepspeed_zero3.simulate over a step of the profile's blocks at the setup's stage3 knobs): the partitioned
  parameters gathered or being prefetched, in the weights' dtype, and the gradients of the submodule computing
  and of the one before it, which stays in its own .grad until a later hook reduces it (stage3.py 1469-1540
  at v0.6.2), in the gradients' dtype; the peak over the block's recompute and backward;
- time: where the layer is checkpointed (option 1, the reentrant whole rerun), the elements gathered again
  for the backward because the reuse distance released them after the recompute (the third gather), over
  the shard group's link, as far as the checkpointed backward's window (recompute + backward) does not hide it
  beside the second gather and the reduce-scatter: max(0, (1 + f) g + r - W) - max(0, g + r - W). The
  second gather itself stays where dataparallel.exposed_comm_ms charges it (behind the backward).

Selective options rerun no linear (Megatron-DeepSpeed's selective checkpoint is the core attention, which
has no parameters; ckplan's selective options rerun norms, activations and attention), so they gather no
third time. Elsewhere (other runtimes, other ZeRO stages, measured or non-GPT profiles) both are 0 and the
existing terms stand.
"""

from __future__ import annotations

from functools import lru_cache

from planner.cost import dataparallel, deepspeed_zero3, runtimes
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup


def knobs(setup: TrainSetup) -> tuple[int, int, int]:
    """(stage3_max_reuse_distance, stage3_prefetch_bucket_size, stage3_max_live_parameters): the setup's, or
    DeepSpeed's defaults (deepspeed/runtime/zero/config.py: 1e9, 5e7, 1e9)."""
    dp = setup.data_parallel
    return (deepspeed_zero3.MAX_REUSE_DISTANCE_DEFAULT if dp.stage3_max_reuse_distance is None
            else dp.stage3_max_reuse_distance,
            deepspeed_zero3.PREFETCH_BUCKET_DEFAULT if dp.stage3_prefetch_bucket_size is None
            else dp.stage3_prefetch_bucket_size,
            deepspeed_zero3.MAX_LIVE_DEFAULT if dp.stage3_max_live_parameters is None
            else dp.stage3_max_live_parameters)


def runs_zero3(setup: TrainSetup) -> bool:
    """A runtime whose record gathers by submodule (fsdp_units "submodules": DeepSpeed's coordinator) at ZeRO 3,
    gathering per microbatch over more than one rank."""
    return (runtimes.of(setup.training).fsdp_units == "submodules" and setup.data_parallel.zero == 3
            and not dataparallel.kept_whole(setup) and dataparallel.shard_size(setup) > 1)


def profile_block(profile: Profile, layer) -> tuple[deepspeed_zero3.Submodule, ...] | None:
    """The layer's DeepSpeed submodules where ckplan knows them: an analytic profile's GPT block (its arch
    `assumptions["model"]`, style "gpt", fused QKV) at tensor parallelism 1, whose parameters are the
    layer's (a profile's layer or its LayerCost); None otherwise."""
    model, tp = profile.assumptions.get("model"), profile.assumptions.get("tp", 1)
    if layer.kind != "decoder_block" or not isinstance(model, dict) or tp != 1:
        return None
    if model.get("style") != "gpt" or model.get("separate_qkv") or layer.expert_param_count:
        return None
    hidden, intermediate = model.get("hidden_size"), model.get("intermediate_size")
    if not isinstance(hidden, int) or not isinstance(intermediate, int):
        return None
    block = tuple(deepspeed_zero3.gpt_block(hidden, intermediate))
    return block if sum(m.numel for m in block) == layer.param_count else None


@lru_cache(maxsize=64)
def _moments(block, layers: int, checkpointed: bool, knob: tuple[int, int, int]) -> tuple[deepspeed_zero3.Moment, ...]:
    reuse, bucket, live = knob
    return tuple(deepspeed_zero3.simulate(block, layers=layers, checkpointed=checkpointed, max_reuse_numel=reuse,
                                          prefetch_bucket=bucket, max_live=live))


def _layer_runs(profile: Profile, layer: LayerCost, checkpointed: bool, setup: TrainSetup):
    """(the layer's block, its recompute and backward runs) in the step's trace of the profile's blocks, every
    block checkpointed alike (DeepSpeed runs no pipeline at ZeRO 3: one stage holds them all)."""
    names = [known.name for known in profile.layers if known.kind == "decoder_block"]
    block = profile_block(profile, layer)
    moments = _moments(block, len(names), checkpointed, knobs(setup))
    index = names.index(layer.name)
    return block, [m for m in moments if m.layer == index and m.phase != "forward"]


def charged(profile: Profile, setup: TrainSetup) -> bool:
    """Whether these terms replace the largest-layer term: DeepSpeed's ZeRO 3 and every decoder block known."""
    if not runs_zero3(setup):
        return False
    blocks = [layer for layer in profile.layers if layer.kind == "decoder_block"]
    return bool(blocks) and all(profile_block(profile, layer) is not None for layer in blocks)


def working_set_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """What the coordinator holds beyond the shards while the layer recomputes and runs its backward
    (the module docstring); 0 where these terms are not charged."""
    if not charged(profile, setup):
        return 0
    if layer.kind != "decoder_block":
        return 0
    held = dataparallel.param_bytes(setup)
    _, runs = _layer_runs(profile, layer, option == 1, setup)
    peak = deepspeed_zero3.peak_held(runs, weight_bytes=held.weights, grad_bytes=held.grads)
    return int(peak.gathered * held.weights + peak.grads * held.grads)


def third_gather_share(profile: Profile, layer: LayerCost, setup: TrainSetup) -> float:
    """Elements gathered for a checkpointed layer's recompute and backward beyond one gather of its
    partitioned parameters, a share of them (0: all kept from recompute to backward)."""
    block, runs = _layer_runs(profile, layer, True, setup)
    return deepspeed_zero3.third_gather_share(block, runs)


def third_gather_ms(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> float:
    """The third gather's exposed time a layer adds per iteration under full recompute (the module
    docstring); 0 for other options and where these terms are not charged."""
    if option != 1 or layer.kind != "decoder_block" or not charged(profile, setup):
        return 0.0
    share = third_gather_share(profile, layer, setup)
    if not share:
        return 0.0
    gather, reduce = dataparallel.collectives_ms(layer.param_count, setup)
    microbatches = setup.pipeline.microbatches
    gather_once, reduce_once = gather / (2 * microbatches), reduce / dataparallel.reductions_per_iteration(setup)
    # the record reruns whole forwards (recompute_whole_forward: DeepSpeed's reentrant checkpoint)
    window = (layer.bwd_ms + layer.fwd_ms) * setup.time.compute_scale
    with_third = max(0.0, (1 + share) * gather_once + reduce_once - window)
    without = max(0.0, gather_once + reduce_once - window)
    return microbatches * (with_third - without)
