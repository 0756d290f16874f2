"""Transformer Engine's FP8 delayed scaling as Megatron-core runs it (the setting fp8_delayed_scaling: Megatron-LM's
`--fp8-recipe delayed`, its default under `--fp8-format`; TE v2.9, megatron-core d98e8a64; docs/framework-facts.md
§235-§242). Three things differ from tensorwise current scaling, each charged here:

- the casts (time): each quantize casts at the scale the amax history gave and writes its amax as it casts (no amax
  pass), the norm writes FP8 itself: a TE block's record of those passes (Float8Delayed, planner/profiler/
  te_delayed.py) takes the place of its tensorwise one (`delayed_profile`). A block without one (a MoE block's
  record) keeps its tensorwise casts, and the command says so (`undelayed_layers`);
- the amax reductions (time): Megatron wraps a model chunk's whole forward in one `fp8_autocast` under delayed
  scaling (transformer_block.py 619-629) over the amax group (fp8_utils.py 857-866: `get_amax_reduction_group
  (with_context_parallel=True, tp_only_amax_red)`, parallel_state.py 1877-1900: TP x DP x CP, or TP x CP under
  `--tp-only-amax-red`). At the autocast's exit `reduce_and_update_fp8_tensors(forward=True)` concatenates every
  registered module's amaxes and all-reduces them (MAX, `async_op=False`: the compute stream waits) where the group
  holds more than one rank (quantization.py 487-537, 590-600); the chunk's first FP8 module's backward does the same
  for the backward amaxes at its end (layernorm_linear.py 498-505, 1000-1003): two a chunk a microbatch
  (`stage_amax_ms`). TE's checkpoint reruns a checkpointed chunk under its own autocast, entered at depth 0 inside
  the backward with grad enabled (distributed.py 420-425), whose exit reduces the forward amaxes once more: one a
  checkpointed chunk (`recompute_amax_ms`: a layer under full recompute, Megatron's --recompute-num-layers 1). Each
  is a few hundred floats (12 B a GEMM forward, 8 B backward): NCCL's latency for the group (stepcomm.scalar_all_reduce);
- the meta buffers (memory): each TE module under the autocast holds a DelayedScalingRecipeState a direction
  (quantization.py 1068-1077): `scale` (num_quantizers floats) and `amax_history` (amax_history_len x num_quantizers
  floats), three forward and two backward quantizers a GEMM (module/base.py 765-775); each its own fp32 request,
  which torch's caching allocator rounds up to 512 B (CUDACachingAllocator.cpp `round_size`, kMinBlockSize):
  `meta_buffer_bytes`, static. A checkpointed module's forward under TE's checkpoint stashes clones of its forward
  `amax_history` and `scale` until its recompute (quantization.py 603-628: kept a microbatch in flight), and the
  recompute keeps its updated ones in fp8_meta (630-648: held once it has run): `recompute_stash_bytes`.

Not charged: the amaxes' concatenation (`torch.cat`, one kernel) and `fused_amax_and_scale_update_after_reduction`
(one multi-tensor kernel over the buffers: scales from the history's max or most recent amax, with the margin) at
each reduction; each Float8Tensor's fp32 scale_inv (one float).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import nccl_buffers, nccltuner, stepcomm
from planner.schema import OPTION_FULL, Profile, TrainingSetup, TrainSetup

ROUND_BYTES = 512  # the caching allocator's smallest block: every request rounded up to a multiple (round_size)
FP32_BYTES = 4
FORWARD_QUANTIZERS, BACKWARD_QUANTIZERS = 3, 2  # a GEMM's: input, weight, output; grad_output, grad_input


def applies(training: TrainingSetup) -> bool:
    return bool(training.float8 and training.fp8_delayed_scaling)


def delayed_profile(profile: Profile, training: TrainingSetup) -> Profile:
    """Under delayed scaling, each layer's TE Float8 record (LayerProfile.te_time's) with its delayed scaling passes
    in place of its tensorwise ones, the record's `delayed` kept (its modules); else the profile itself."""
    if not applies(training):
        return profile
    layers = []
    for layer in profile.layers:
        timed = layer.te_time
        fp8 = timed.float8 if timed is not None else None
        if fp8 is None or fp8.delayed is None:
            layers.append(layer)
            continue
        delayed = fp8.delayed
        swapped = fp8.model_copy(update={"fwd_ms": delayed.fwd_ms, "bwd_ms": delayed.bwd_ms,
                                         "recompute_ms": {**fp8.recompute_ms, **delayed.recompute_ms},
                                         "weight_cast_ms": delayed.weight_cast_ms,
                                         "rerun_weight_cast_ms": {**fp8.rerun_weight_cast_ms,
                                                                  **delayed.rerun_weight_cast_ms}})
        layers.append(layer.model_copy(update={"te_time": timed.model_copy(update={"float8": swapped})}))
    return profile.model_copy(update={"layers": layers})


def undelayed_layers(profile: Profile) -> list[str]:
    """The layers with a TE Float8 record but no delayed scaling one (a MoE block's): charged as tensorwise."""
    return [layer.name for layer in profile.layers if layer.te_time is not None and layer.te_time.float8 is not None
            and layer.te_time.float8.delayed is None]


def history_len(training: TrainingSetup) -> int:
    """The amax history's rows: the setting's, or Megatron-LM's default 1 (transformer_config.py 621)."""
    return training.fp8_amax_history_len or 1


def _rounded(num_bytes: int) -> int:
    return -(-num_bytes // ROUND_BYTES) * ROUND_BYTES


def direction_bytes(quantizers: int, history_len: int) -> int:
    """One DelayedScalingRecipeState's two requests, each rounded: `scale` and `amax_history`."""
    return _rounded(quantizers * FP32_BYTES) + _rounded(history_len * quantizers * FP32_BYTES)


def meta_buffer_bytes(module_gemms: Sequence[int], history_len: int) -> int:
    """The meta buffers of TE modules holding `module_gemms` GEMMs each: a forward and a backward state each."""
    return sum(direction_bytes(FORWARD_QUANTIZERS * gemms, history_len)
               + direction_bytes(BACKWARD_QUANTIZERS * gemms, history_len) for gemms in module_gemms)


def recompute_stash_bytes(module_gemms: Sequence[int], history_len: int) -> int:
    """One copy of the modules' forward state (clones of amax_history and scale): what a checkpointed forward stashes
    a microbatch, and what a recompute keeps updated."""
    return sum(direction_bytes(FORWARD_QUANTIZERS * gemms, history_len) for gemms in module_gemms)


def static_bytes(layer, training: TrainingSetup, option) -> int:
    """A layer's meta buffers under delayed scaling (LayerCost.float8_module_gemms); with full recompute possible on
    it (`option` full) the updated forward state the recompute keeps too."""
    if not applies(training) or not layer.float8_module_gemms:
        return 0
    held = meta_buffer_bytes(layer.float8_module_gemms, history_len(training))
    return held + (recompute_stash_bytes(layer.float8_module_gemms, history_len(training))
                   if _full(layer, option) else 0)


def kept_bytes(layer, training: TrainingSetup, option) -> int:
    """A checkpointed layer's stashed forward state, a microbatch in flight."""
    if not applies(training) or not layer.float8_module_gemms or not _full(layer, option):
        return 0
    return recompute_stash_bytes(layer.float8_module_gemms, history_len(training))


def _full(layer, option) -> bool:
    return layer.options[int(option)].name == OPTION_FULL


def amax_group(setup: TrainSetup) -> list[int]:
    """The amax group's first instance, ranks in Megatron-core's order (tp, cp, ep, dp, pp; the setup's dp counts a
    replica's cp ranks): TP x DP x CP, or TP x CP under --tp-only-amax-red."""
    tp, cp = setup.comm.tp, max(1, setup.training.context_parallel)
    width = tp * (cp if setup.training.fp8_amax_tp_only else max(1, setup.data_parallel.dp))
    return list(range(width))


def amax_reduce_ms(setup: TrainSetup, profile: Profile | None = None) -> float:
    """One all-reduce of the amaxes over the amax group: NCCL's latency for its ranks and nodes (its NVLS where the
    group runs it); 0 where the group is one rank or the setup charges no collectives (no link rate)."""
    ranks = amax_group(setup)
    if len(ranks) < 2 or setup.comm.tp_gb_per_s is None:
        return 0.0
    per_node = setup.comm.domain
    nodes = [rank // per_node for rank in ranks]
    gpu = nccl_buffers.profile_nccl_gpu(profile) if profile is not None else None
    nvls = gpu is not None and nccltuner.nvls_supported(
        multicast=gpu.multicast, local_gpus=max(nodes.count(node) for node in set(nodes)),
        enabled=not setup.training.nccl_nvls_off)
    return stepcomm.scalar_all_reduce(len(ranks), len(set(nodes)), setup, nvls=nvls)[2]


def stage_amax_ms(stage: int, ctx) -> float:
    """Per microbatch, a model chunk's two amax reductions: its autocast's exit (forward) and its first FP8
    module's backward end."""
    if not applies(ctx.setup.training) or not any(
            layer.float8 is not None and layer.float8.delayed is not None for layer in ctx.profile.layers):
        return 0.0
    return 2 * amax_reduce_ms(ctx.setup, ctx.profile)


def recompute_amax_ms(layer, option, ctx) -> float:
    """Per microbatch, a fully recomputed layer's rerun autocast's reduction of the forward amaxes."""
    if not applies(ctx.setup.training) or not layer.float8_module_gemms or not _full(layer, option):
        return 0.0
    return amax_reduce_ms(ctx.setup, ctx.profile)


SOURCE = "TE v2.9 quantization.py, module/base.py, distributed.py; megatron-core d98e8a64 (te_delayed.py)"
ROWS = (
    ("FP8 delayed scaling's meta buffers (each TE module's scale and amax history a direction)", "static", "layer",
     lambda layer, ckpt, ctx: static_bytes(layer, ctx.setup.training, ckpt), SOURCE),
    ("FP8 delayed scaling's forward state stashed by a checkpointed layer until its recompute", "kept", "layer",
     lambda layer, ckpt, ctx: kept_bytes(layer, ctx.setup.training, ckpt), SOURCE),
    ("FP8 delayed scaling's amax all-reduce at a recompute's autocast exit", "time", "layer",
     lambda layer, ckpt, ctx: recompute_amax_ms(layer, ckpt, ctx), SOURCE),
    ("FP8 delayed scaling's amax all-reduces: a model chunk's autocast exit and its first module's backward",
     "comm", "stage", stage_amax_ms, SOURCE),
)
