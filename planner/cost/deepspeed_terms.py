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

A selective option that reruns linears (`attn`, `mlp`, `attn,mlp`: torch's checkpoint of that module, its
forward rerun when the backward first needs it) gathers its rerun submodules a third time by the same
reuse-distance rule, the distance counted over the rerun range only (deepspeed_zero3.rerun_ranges); options
rerunning no linear (core-attn, mlp-act, norm-out, op-sac) gather nothing again. The blocks known: GPT with fused
QKV (Megatron-DeepSpeed's) and LLaMA-style as transformers builds them (deepspeed_zero3.llama_block). Elsewhere
(other runtimes, other ZeRO stages, measured or fake profiles, TP > 1, MoE blocks) both are 0, the existing terms
stand, and `not_charged` gives the sentence the commands print.

Under the optimizer's offload (`offload_optimizer.device` cpu) ZeRO 3 allocates its flat buffer of fp16 gradient
partitions on the host, pinned, not on the GPU (stage3.py 312-313, 532-545 at v0.6.2: `self.device` is the
offload device): `offloaded_grad_partition_bytes` moves them from the device's static bytes to the host's. That
holds for any profile (it needs no submodules), wherever the coordinator runs (`runs_zero3`).
"""

from __future__ import annotations

from functools import lru_cache

from planner.cost import dataparallel, deepspeed_zero3, rules, runtimes
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


def offloaded_grad_partition_bytes(layer, setup: TrainSetup) -> float:
    """The layer's fp16 gradient partitions (the rank's 1/K, in the gradients' dtype) that DeepSpeed's ZeRO 3 keeps
    in pinned host memory when the optimizer is offloaded, where dataparallel.bytes_per_param charges them to the
    device (stage3.py 532-545 at v0.6.2: `grad_partitions_flat_buffer` on `self.device`, the offload device);
    0 without offload or where the coordinator does not run."""
    if not (runs_zero3(setup) and setup.data_parallel.offload):
        return 0.0
    grads = dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)
    return rules.per_param_bytes(layer, setup, lambda _: grads)


# DeepSpeed's reduce_bucket_size default (deepspeed/runtime/zero/constants.py at v0.6.2; config.py at edaa7221): 5e8
REDUCE_BUCKET_DEFAULT = 500_000_000


def gradient_bucket_bytes(setup: TrainSetup) -> float:
    """ZeRO 3's contiguous gradient bucket: `reduce_bucket_size` elements in the training dtype (the weights'),
    allocated on the GPU at init under contiguous_gradients, DeepSpeed's default (stage3.py 524-529 at v0.6.2:
    `__ipg_bucket_flat_buffer`); 0 where the coordinator does not run."""
    if not runs_zero3(setup):
        return 0.0
    size = setup.data_parallel.reduce_bucket_size
    return (REDUCE_BUCKET_DEFAULT if size is None else size) * dataparallel.param_bytes(setup).weights


def tied_offloaded_grad_partition_bytes(profile: Profile, setup: TrainSetup) -> float:
    """The gradient partitions of a tied parameter's copies beyond the first (rules.tied_once_bytes takes them off the
    device's static bytes at the device's bytes a parameter, which hold these too): the device gets them back, the
    host holds them once. 0 where offloaded_grad_partition_bytes is, or with more than one stage (no copy taken)."""
    if setup.pipeline.stages != 1 or not (runs_zero3(setup) and setup.data_parallel.offload):
        return 0.0
    copies = sum((len(item.layers) - 1) * item.param_count for item in profile.tied)
    return copies * dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)


def _block_of(model: dict, layer, modules: str | None) -> tuple[deepspeed_zero3.Submodule, ...] | None:
    """The submodules of an analytic arch's dense block (its `assumptions["model"]`): a GPT block with fused
    QKV (Megatron-DeepSpeed's), or a LLaMA-style one as transformers builds it, or as Megatron-DeepSpeed does
    (`modules` "fused": the profile of a Megatron-DeepSpeed script, its assumptions["modules"]); None for
    others."""
    hidden, intermediate = model.get("hidden_size"), model.get("intermediate_size")
    if not isinstance(hidden, int) or not isinstance(intermediate, int) or layer.expert_param_count:
        return None
    if model.get("style") == "gpt" and not model.get("separate_qkv"):
        return tuple(deepspeed_zero3.gpt_block(hidden, intermediate))
    heads, kv_heads = model.get("num_heads"), model.get("num_kv_heads")
    if model.get("style") != "llama" or not isinstance(heads, int) or model.get("kv_lora_rank"):
        return None
    head_dim = model.get("head_dim") or hidden // heads
    if modules == "fused":
        return tuple(deepspeed_zero3.megatron_llama_block(hidden, intermediate, heads=heads,
                                                          kv_heads=kv_heads or heads, head_dim=head_dim,
                                                          qkv_bias=bool(model.get("qkv_bias"))))
    return tuple(deepspeed_zero3.llama_block(hidden, intermediate, heads=heads, kv_heads=kv_heads or heads,
                                             head_dim=head_dim, qkv_bias=bool(model.get("qkv_bias")),
                                             qk_norm=bool(model.get("qk_norm"))))


def profile_block(profile: Profile, layer) -> tuple[deepspeed_zero3.Submodule, ...] | None:
    """The layer's DeepSpeed submodules where ckplan knows them: an analytic profile's dense decoder block
    (a GPT block with fused QKV, or a LLaMA-style block: `_block_of`) at tensor parallelism 1, whose
    parameters are the layer's (a profile's layer or its LayerCost); None otherwise (`not_charged` says why)."""
    model, tp = profile.assumptions.get("model"), profile.assumptions.get("tp", 1)
    if layer.kind != "decoder_block" or not isinstance(model, dict) or tp != 1:
        return None
    block = _block_of(model, layer, profile.assumptions.get("modules"))
    return block if block is not None and sum(m.numel for m in block) == layer.param_count else None


def not_charged(profile: Profile, setup: TrainSetup) -> str | None:
    """One sentence where DeepSpeed's ZeRO 3 runs but its working set and third gather cannot be charged
    (the plan keeps the largest-layer term and no third gather), saying why; None where they are charged
    or ZeRO 3's coordinator does not run."""
    if not runs_zero3(setup) or charged(profile, setup):
        return None
    model, tp = profile.assumptions.get("model"), profile.assumptions.get("tp", 1)
    blocks = [layer for layer in profile.layers if layer.kind == "decoder_block"]
    if not blocks:
        why = "the profile has no decoder block"
    elif not isinstance(model, dict):
        why = "a measured or fake profile does not record its blocks' submodules (an analytic profile does)"
    elif tp != 1:
        why = f"under tensor parallelism ({tp}) ckplan does not know the coordinator's order of the split linears"
    elif any(layer.expert_param_count for layer in blocks):
        why = ("a mixture-of-experts block runs its experts in the order the tokens route them, which changes "
               "DeepSpeed's trace every step")
    else:
        why = (f"ckplan knows the submodules of GPT (fused QKV) and LLaMA-style dense blocks only, not "
               f"this arch's {model.get('style')!r} blocks")
    return (f"DeepSpeed ZeRO 3: the coordinator's working set and the third gather of rerun submodules are not "
            f"charged ({why}); memory keeps 8 B a parameter of the largest layer, as FSDP2's, and no third gather")


@lru_cache(maxsize=64)
def _moments(block, layers: int, reruns: tuple, knob: tuple[int, int, int]) -> tuple[deepspeed_zero3.Moment, ...]:
    reuse, bucket, live = knob
    return tuple(deepspeed_zero3.simulate(block, layers=layers, checkpointed=False, reruns=reruns,
                                          max_reuse_numel=reuse, prefetch_bucket=bucket, max_live=live))


def _layer_runs(profile: Profile, layer: LayerCost, option: int, setup: TrainSetup):
    """(the layer's block, its recompute and backward runs) in the step's trace of the profile's blocks, every
    block at the layer's option (DeepSpeed runs no pipeline at ZeRO 3: one stage holds them all); the option's
    reruns are the submodules it names (deepspeed_zero3.rerun_ranges)."""
    names = [known.name for known in profile.layers if known.kind == "decoder_block"]
    block = profile_block(profile, layer)
    reruns = deepspeed_zero3.rerun_ranges(block, layer.options[option].name)
    moments = _moments(block, len(names), reruns, knobs(setup))
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
    _, runs = _layer_runs(profile, layer, option, setup)
    peak = deepspeed_zero3.peak_held(runs, weight_bytes=held.weights, grad_bytes=held.grads)
    return int(peak.gathered * held.weights + peak.grads * held.grads)


def third_gather_share(profile: Profile, layer: LayerCost, setup: TrainSetup, option: int = 1) -> float:
    """Elements gathered for a layer's recompute and backward under `option` beyond one gather of its
    partitioned parameters, a share of them (0: every rerun submodule kept from recompute to backward)."""
    block, runs = _layer_runs(profile, layer, option, setup)
    return deepspeed_zero3.third_gather_share(block, runs)


def third_gather_ms(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> float:
    """The third gather's exposed time a layer adds per iteration under an option that reruns linears (the
    module docstring); 0 for other options and where these terms are not charged."""
    if option == 0 or layer.kind != "decoder_block" or not charged(profile, setup):
        return 0.0
    share = third_gather_share(profile, layer, setup, option)
    if not share:
        return 0.0
    gather, reduce = dataparallel.collectives_ms(layer.param_count, setup, frozen=layer.frozen_param_count)
    microbatches = setup.pipeline.microbatches
    gather_once, reduce_once = gather / (2 * microbatches), reduce / dataparallel.reductions_per_iteration(setup)
    # full: the record reruns whole forwards (recompute_whole_forward: DeepSpeed's reentrant checkpoint);
    # a selective option its own recompute
    rerun_ms = layer.fwd_ms if option == 1 else (layer.options[option].recompute_ms or 0.0)
    window = (layer.bwd_ms + rerun_ms) * setup.time.compute_scale
    with_third = max(0.0, (1 + share) * gather_once + reduce_once - window)
    without = max(0.0, gather_once + reduce_once - window)
    return microbatches * (with_third - without)
