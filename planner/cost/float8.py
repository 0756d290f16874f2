"""Float8 training (--float8) and FSDP2's float8 all-gather (--fp8-all-gather) applied to a profile.

A profile is made at bf16; its layers carry what Float8 changes (LayerProfile.float8, written by
planner/profiler/float8.py). Under the setting, `float8_profile` returns the profile as the cost
model then charges it, term by term:

Time, per layer with a record:
- forward, backward and each recompute option's rerun: the record's, the converted GEMMs at the FP8
  peak with the activations' and gradients' casts; an option the record does not name reruns no
  converted linear (attention core, activations, offload's copies) and keeps its time; the backward
  without the saved inputs' recast where the runtime's torchao saved the float8 input
  (RuntimeFacts.float8_saves_input: eab345c, torchtitan 9dec370's; Float8Linears.bwd_input_recast_ms);
- the weights' casts (amax and cast, per forward and per rerun): charged unless the weights are
  gathered in float8 (then FSDP2's pre-all-gather casts each rank's shard, 1/K of them); under
  Transformer Engine (RuntimeFacts.float8 "transformer-engine") once per step instead, in the layer's
  step time: TE caches a weight's float8 copy across microbatches (`get_weight_workspace(...,
  cache_name=(None if is_first_microbatch is None else "weight"))`, transformer_engine/pytorch/module/
  linear.py `_Linear.forward`, as stored; docs/framework-facts.md §21) and Megatron passes
  is_first_microbatch; reruns reuse it. With TE's FP8 weights (Megatron's --fp8-param-gather on its
  distributed optimizer or under Megatron-FSDP, current or delayed scaling: te_primary_weights) the parameter is
  the FP8 tensor, cast in no microbatch: the step casts the fp32 master shard into it (te_master_cast_ms, in the
  layer's step time) and on Hopper the distributed optimizer's next forward transposes it once, Megatron-FSDP's
  every forward and backward (fsdp_transpose_ms, in the layer's passes);
- with the float8 all-gather (torchao's; and TE's FP8 weights where te_primary_weights does not read them), the scales of every converted weight's shard computed once per
  iteration after the optimizer step (torchao `precompute_float8_dynamic_scale_for_fsdp`,
  v0.11.0 `torchao/float8/fsdp_utils.py` 29-80: max(abs) of each fp32 shard, one all-reduce of
  the amaxes): its shard's bytes read at the HBM bandwidth, in the layer's step time. The amax
  all-reduce (one float per weight) is not charged.

Memory, where the runtime's record says its Float8 memory is read (RuntimeFacts.float8_memory):
- kept without recompute: torchao's tensorwise Float8Linear saves the float8 weight it cast
  (`matmul_with_hp_or_float8_args` saves `weight_hp_t`, which is the cast weight: v0.11.0
  `torchao/float8/float8_linear.py` 77, 330-358), 1 B per converted parameter per microbatch in
  flight, beside the bf16 input a bf16 linear saves too. Under the float8 all-gather the saved weight
  is FSDP2's gathered float8 buffer, freed after the forward and gathered again: nothing kept. A
  checkpointed layer keeps only its input (the cast is rerun);
- transient: the float8 copies of grad_output and the input at the largest linear's weight-grad
  GEMM (Float8Linears.transient_bytes), added to the layer's; in a checkpointed forward's replay each linear's
  own forward casts instead, at its matmul (`forward_casts`, planner/cost/fsdp2_split.py);
- a Megatron-core MoE block (no Float8 record of its own): its TE record's, the experts' grouped GEMMs in FP8, and
  for option none the FP8 inputs TE's linears save in place of the bf16 ones (planner/cost/te_moe_float8.py);
- under TE, each selective option's kept bytes with the FP8 inputs the linears outside its rerun save
  (planner/cost/te_float8_kept.py);
- the gathered weights: planner/cost/dataparallel.py charges the converted ones at 1 B under the
  float8 all-gather (the gather buffers and, under a pipeline, the weights kept whole); the sharded
  parameter stays fp32.
"""

from __future__ import annotations

import math

from planner.cost import (
    chunkedloss,
    runtimes,
    te_delayed,
    te_float8_kept,
    te_kept,
    te_moe_float8,
    te_moe_kept,
)
from planner.errors import UserError
from planner.schema import AllocRecord, Float8Linears, LayerProfile, Profile, TrainSetup
from planner.schema.profile import Float8Cast

FP32_BYTES = 4


def float8_profile(profile: Profile, setup: TrainSetup) -> Profile:
    """The profile as the cost model charges it under setup.training.float8 (the module's
    docstring), its layers first timed on the runtime's fused kernels where the profile records them
    (planner/cost/fusedkernels.py) and kept as its fused SwiGLU keeps them (planner/cost/te_kept.py); without
    --float8 only that. Refuses, in one sentence, a profile
    without Float8 records."""
    return float8_applied(runtime_profile(profile, setup), setup)


def runtime_profile(profile: Profile, setup: TrainSetup) -> Profile:
    """float8_profile's first part: what reads setup.training alone (the runtime's kernels and kept tensors, TE's
    records of its MoE blocks and delayed scaling, the chunked loss), so that a search whose configurations share
    their training settings makes it once a profile (jobsearch.Profiles.for_setup)."""
    from planner.cost import fusedkernels

    if setup.training.float8:  # a MoE block's Float8 record is its TE record's (te_moe_float8.py)
        profile = te_moe_float8.with_records(profile, runtimes.of(setup.training))
    profile = te_delayed.delayed_profile(profile, setup.training)  # TE's delayed scaling's casts (te_delayed.py)
    profile = fusedkernels.fused_profile(profile, runtimes.of(setup.training).fused_kernels,
                                         unfused_accumulation=setup.training.unfused_grad_accumulation,
                                         router_scores=runtimes.of(setup.training).te_router_scores)
    profile = te_kept.fused_swiglu_profile(profile, runtimes.of(setup.training))
    profile = te_moe_kept.megatron_moe_profile(profile, runtimes.of(setup.training))  # Megatron-core's MoE layers' tensors
    return chunkedloss.chunked_head_profile(profile, setup)  # --chunked-cross-entropy N: the head's backward


def float8_applied(profile: Profile, setup: TrainSetup) -> Profile:
    """float8_profile's second part, on runtime_profile's profile: the Float8 records applied, which read the
    setup's shard group (the float8 all-gather where FSDP shards, TE's once-a-step weight cast times the group);
    the profile itself without --float8."""
    if not setup.training.float8:
        return profile
    if not any(layer.float8 is not None for layer in profile.layers):
        raise UserError("--float8 needs a profile that records its Float8 linears: an analytic profile of "
                        "dense blocks made by `ckplan profile --arch` (without --mfu) for a GPU with FP8 tensor "
                        "cores; this one records none")
    bare = [layer for layer in profile.layers
            if layer.float8 is None and layer.kind in ("decoder_block", "moe_block") and profile.source == "analytic"]
    if bare:
        raise UserError(f"--float8 on {bare[0].name} ({bare[0].kind}) is not modelled: the analytic profile records "
                        "Float8 for dense blocks, and for MoE blocks under --runtime megatron only (Transformer Engine's "
                        "grouped experts), not latent-attention blocks")
    record = runtimes.of(setup.training)
    from planner.cost import dataparallel

    # torchtitan turns the float8 all-gather on only where FSDP shards (parallel_dims.dp_shard_enabled)
    gathered = setup.training.fp8_all_gather and dataparallel.shard_size(setup) > 1
    primary = te_primary_weights(setup)
    step_ms = te_master_cast_ms(profile, setup) if primary else _precompute_ms(profile) if gathered else 0.0
    transpose_ms = fsdp_transpose_ms(profile, setup)  # Megatron-FSDP's per-microbatch transposes (Hopper)
    # Transformer Engine casts a weight once per step, not per microbatch (the module's docstring): charged
    # in the step time, which the cost model divides over the shard group, so taken times it (each rank
    # casts its whole weight); none where the weight is the FP8 parameter (te_master_cast_ms instead)
    per_step = dataparallel.shard_size(setup) if record.float8 == "transformer-engine" and not (gathered or primary) \
        else 0
    te_delta = te_kept.te_saved_inputs_delta(profile) if record.te_float8_saved_inputs else 0
    te_inputs = te_kept.te_saved_inputs(profile) if te_delta else None  # the same tensors, for the records
    # a Megatron-core MoE block's FP8 saved inputs (te_moe_float8.py), where its tensors are Megatron's
    moe_inputs = te_moe_float8.saved_inputs(profile) if record.te_float8_saved_inputs and record.te_moe_experts_kept \
        else None
    if moe_inputs:
        profile = profile.model_copy(update={"layers": [
            te_moe_float8.with_saved_inputs(layer, moe_inputs) if layer.kind == "moe_block" and layer.float8 is not None
            else layer for layer in profile.layers]})
    if te_inputs or moe_inputs:  # the selective options' FP8 saved inputs (te_float8_kept.py)
        profile = te_float8_kept.selective_kept(profile, dense=te_inputs, moe=moe_inputs)
    layers = [_layer(layer, gathered=gathered or bool(primary), memory=record.float8_memory, step_ms=step_ms,
                     per_step=per_step, transpose_ms=transpose_ms,
                     saves_input=record.float8_saves_input,
                     kept_delta=te_delta if layer.kind == "decoder_block" else 0,
                     te_inputs=te_inputs if layer.kind == "decoder_block" else None)
              if layer.float8 is not None else layer for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def _layer(layer: LayerProfile, *, gathered: bool, memory: bool, step_ms: float, per_step: int = 0,
           saves_input: bool = False, kept_delta: int = 0, te_inputs: dict | None = None,
           transpose_ms: float = 0.0) -> LayerProfile:
    fp8: Float8Linears = layer.float8
    transpose = transpose_ms * fp8.param_count  # one in the forward, one in the backward (fsdp_transpose_ms)
    update = {"bwd_ms": fp8.bwd_ms - fp8.bwd_input_recast_ms} if saves_input else {}  # the float8 input saved:
    if transpose:  # its recast does not run (the record's part of bwd_ms)
        update["bwd_ms"] = update.get("bwd_ms", fp8.bwd_ms) + transpose
    fp8 = fp8.model_copy(update=update) if update else fp8
    cast = 0.0 if gathered or per_step else fp8.weight_cast_ms
    fwd = fp8.fwd_ms + cast + transpose
    kept_weight = fp8.param_count if memory and not gathered else 0  # float8 weight saved, 1 B a parameter
    options = []
    for option in layer.recompute_options:
        update = {}
        if option.name in fp8.recompute_ms:
            rerun_cast = 0.0 if gathered or per_step else fp8.rerun_weight_cast_ms.get(option.name, 0.0)
            update["recompute_ms"] = fp8.recompute_ms[option.name] + rerun_cast
        if option.name == "none":  # a selective option's TE inputs: te_float8_kept.selective_kept
            update["kept_bytes"] = option.kept_bytes + kept_weight + kept_delta
        options.append(option.model_copy(update=update))
    full = fp8.recompute_ms.get("full")
    recompute = layer.recompute_ms if full is None else full + (0.0 if gathered or per_step else
                                                                fp8.rerun_weight_cast_ms.get("full", 0.0))
    scale_fwd, scale_bwd = fwd / layer.fwd_ms if layer.fwd_ms else 1.0, fp8.bwd_ms / layer.bwd_ms if layer.bwd_ms else 1.0
    return layer.model_copy(update={
        "fwd_ms": fwd, "bwd_ms": fp8.bwd_ms, "recompute_ms": recompute,
        "fwd_ms_min": layer.fwd_ms_min * scale_fwd, "fwd_ms_max": layer.fwd_ms_max * scale_fwd,
        "bwd_ms_min": layer.bwd_ms_min * scale_bwd, "bwd_ms_max": layer.bwd_ms_max * scale_bwd,
        "act_bytes": layer.act_bytes + kept_weight + kept_delta,
        "transient_bytes": layer.transient_bytes + (fp8.transient_bytes if memory else 0),
        "recompute_options": options,
        "step_ms": {name: ms + step_ms * fp8.param_count + per_step * fp8.weight_cast_ms for name, ms in layer.step_ms.items()},
        "alloc_records": {name: _te_inputs(with_float8(record, kept=kept_weight if name == "none" else 0,
                                                       transient=fp8.transient_bytes if memory else 0,
                                                       parts=transient_parts(fp8)),
                                           te_inputs if name == "none" else None)
                          for name, record in layer.alloc_records.items()},
    })


def _te_inputs(record: AllocRecord, te_inputs: dict | None) -> AllocRecord:
    """none's record holding Transformer Engine's FP8 saved inputs where the kept bytes charge them (kept_delta)."""
    return te_kept.te_record(record, float8=te_inputs) if te_inputs else record


def with_float8(record: AllocRecord, *, kept: int, transient: int, parts: tuple[int, ...] = ()) -> AllocRecord:
    """An allocation record (planner/schema/profile.py AllocRecord) with Float8's tensors added:
    the saved float8 weight (`kept`) made last in the forward and freed at the end of the backward;
    the casts (`transient`) made first in the backward and freed at its end: as `parts` where they add up to it
    (transient_parts: the tensors torchao makes), else one tensor. The backward's ids after a new forward allocation
    move up by one, and after the casts by their count."""
    forward, backward = list(record.forward), list(record.backward)
    made = sum(1 for code in forward if code > 0)
    shift = 1 if kept else 0
    kept_id = made + 1

    def moved(ident: int) -> int:
        return ident + shift if ident >= kept_id else ident

    backward = [code if code > 0 else -moved(-code) for code in backward]
    input_grad = moved(record.input_grad) if record.input_grad else 0
    frees = []
    if kept:
        forward.append(kept)
        frees.append(-kept_id)
    if transient:
        casts = list(parts) if parts and sum(parts) == transient and min(parts) > 0 else [transient]
        cast_id, count = made + shift + 1, len(casts)  # the backward's first allocations
        backward = casts + [code if code > 0 else -(-code + count if -code >= cast_id else -code) for code in backward]
        input_grad = input_grad + count if input_grad >= cast_id else input_grad
        frees[:0] = [-(cast_id + n) for n in range(count)]
    return record.model_copy(update={"forward": forward, "backward": backward + frees, "input_grad": input_grad})


def transient_parts(fp8: Float8Linears) -> tuple[int, ...]:
    """Float8's transient (the largest linear's weight-grad GEMM's casts, Float8Linears.transient_bytes) as the
    tensors torchao eab345c makes there (docs/framework-facts.md §222): `preprocess_addmm` copies grad_output
    transposed (T x n, 1 B: `a_data.contiguous()`), then the input column-major (T x k: `b.t().contiguous().t()`),
    of the linear the backward runs first among those whose two make the transient (the last converted in the
    forward's order: w2 in a LLaMA block). A linear's T x n is found from its cast record (weight n x k, input
    T x k); () where no linear's two make the transient (one tensor, as before)."""
    for cast in reversed(fp8.forward_casts):
        inp, weight, grad = cast.input_bytes, cast.weight_bytes, fp8.transient_bytes - cast.input_bytes
        if inp <= 0 or weight <= 0 or grad <= 0:
            continue
        square, rest = divmod(weight * grad, inp)  # n / k = grad / inp and n x k = weight: n squared
        n = math.isqrt(square)
        if not rest and n * n == square and weight % n == 0 and inp % (weight // n) == 0 \
                and inp // (weight // n) * n == grad:
            return (grad, inp)
    return ()


def forward_casts(layer: LayerProfile, setup: TrainSetup) -> list[Float8Cast]:
    """The layer's converted linears' forward casts as this setup's forward makes them (Float8Linears.forward_casts):
    each input's float8 copy, none where TP + SP's Float8 plan gathers it already cast (the runtime's
    `tp_gathers_float8`: then the module's sequence shard's copy, `shard_bytes`, made before the gather); each
    weight's, none where FSDP2 gathers the weights in float8 (`--fp8-all-gather` where FSDP shards: torchao eab345c
    `Float8Linear.cast_weight_to_float8_t` returns the gathered float8 weight transposed, a view). [] unless the
    layer runs torchao's Float8 linears with their memory charged (RuntimeFacts.float8_memory) and its record
    holds the casts. torch.compile fuses each cast (`float8_tensor.py` 150-154: the fp32 upcast, the scaling and
    the clamp are one pointwise kernel writing the float8 copy), so a cast makes its 1-byte copy and its fp32
    scale; eager's fp32 intermediates (4 B an element) are not modelled, as the record's times are compiled."""
    from planner.cost import dataparallel

    record = runtimes.of(setup.training)
    fp8 = layer.float8
    if not (setup.training.float8 and fp8 is not None and fp8.forward_casts and record.float8 == "torchao"
            and record.float8_memory):
        return []
    gathered = setup.training.fp8_all_gather and dataparallel.shard_size(setup) > 1
    pre_cast = record.tp_gathers_float8
    return [cast.model_copy(update={"input_bytes": 0 if pre_cast and cast.shard_bytes else cast.input_bytes,
                                    "shard_bytes": cast.shard_bytes if pre_cast else 0,
                                    "weight_bytes": 0 if gathered else cast.weight_bytes})
            for cast in fp8.forward_casts]


def te_primary_weights(setup: TrainSetup) -> str:
    """Where Transformer Engine's FP8 weights are the parameters and cast from an fp32 master shard once a step
    (Megatron-LM's --fp8-param-gather, bridgeterms.fp8_primary_weights; current or delayed scaling): "zero1" on
    Megatron-core's distributed optimizer (ZeRO 1, or DP 1: `_copy_main_params_to_model_params` ->
    fp8_utils.quantize_param_shard), "megatron-fsdp" under Megatron-FSDP (`copy_main_weights_to_model_weights`, the
    same TE call with the FSDP shards: docs/framework-facts.md §673); "" where not (as before: torchao's float8
    all-gather path, or TE's workspace cast). No weight cast in any microbatch where it is set (te_master_cast_ms,
    fsdp_transpose_ms). The value keys the search's Float8 application (jobsearch.Profiles.for_setup)."""
    from planner.cost import bridgeterms, megatron_fsdp

    training = setup.training
    if not (bridgeterms.fp8_primary_weights(training, runtimes.of(training))
            and (training.fp8_current_scaling or training.fp8_delayed_scaling)):
        return ""
    if megatron_fsdp.runs(setup):
        return "megatron-fsdp"
    return "zero1" if setup.data_parallel.zero <= 1 else ""


def te_master_cast_ms(profile: Profile, setup: TrainSetup) -> float:
    """Per converted parameter, the step's FP8 weight under te_primary_weights, ms in the layer's step time (which
    the cost model divides over the shard group K, dataparallel.device_step_ms), at the fused rate ckplan charges
    TE's casts (planner/profiler/float8.py `_bytes_ms`; planner/models/membound_rate.py). TransformerEngine v2.9
    (70f53666) `transformer_engine/pytorch/tensor/utils.py` (docs/framework-facts.md §639, §674):
    `cast_master_weights_to_fp8` first copies each fp32 master shard to the parameter's nominal dtype (107:
    `master_weight.to(model_weight.dtype)`, bf16: 4 B read, 2 written); current scaling then reads that copy for
    its amax (274 `tex.compute_amax`, 2 B) and casts it (332, 2 + `fp8_param_bytes`): 11 B a shard element;
    delayed scaling casts it at the scale the history gave, the amax written by the cast itself (195
    `update_quantized`, 2 + 1): 9 B. Each drops the weight's transpose (`_reset_caches`, 166 / 309): on Hopper
    the distributed optimizer's next forward makes it again once from the whole local FP8 weight
    (`tensor/storage/float8_tensor_storage.py` 183-229: 1 B read, `fp8_param_transpose_bytes` written) and keeps
    it across microbatches: a local element's bytes, so taken times K; under Megatron-FSDP it is made per
    microbatch instead (fsdp_transpose_ms). No transpose on Blackwell (bridgesettings.TN_ONLY_GPUS). The amax
    all-reduce over the group: the runtime's step_collectives (stepcomm.py)."""
    from planner.cost import dataparallel
    from planner.cost.bridgesettings import TN_ONLY_GPUS
    from planner.models.membound_rate import achieved_tbps

    record, gpu = runtimes.of(setup.training), dataparallel.profile_gpu(profile)
    nominal = dataparallel.param_bytes(setup).weights  # the bf16 copy of the shard (utils.py 107)
    master = FP32_BYTES + nominal + (nominal if setup.training.fp8_current_scaling else 0) \
        + nominal + record.fp8_param_bytes
    once = gpu.name in TN_ONLY_GPUS and te_primary_weights(setup) == "zero1"
    transpose = record.fp8_param_bytes + record.fp8_param_transpose_bytes if once else 0
    return (master + transpose * dataparallel.shard_size(setup)) / (achieved_tbps(gpu, "fused") * 1e12) * 1e3


def fsdp_transpose_ms(profile: Profile, setup: TrainSetup) -> float:
    """Per converted parameter, Megatron-FSDP's FP8 weight transpose on Hopper in one forward or one backward of a
    microbatch, ms (0 elsewhere): megatron-core 92c8482e's unit post-forward and post-backward set each FP8
    parameter's `_transpose = None` (megatron_fsdp.py 492-504, 779-783; keep_fp8_transpose_cache off, §673), so
    TE v2.9's forward makes it for the dgrad (linear.py 393-395, layernorm_linear.py 416-418) and the backward
    makes it again (linear.py 682-685, layernorm_linear.py 690-691; under full recompute the rerun's forward, whose
    weights are kept to the backward: two a microbatch either way, so rules.recompute_ms charges the rerun's whole
    forward less the backward's): 1 B read and `fp8_param_transpose_bytes` written a gathered weight element, each,
    at the fused rate."""
    from planner.cost import dataparallel
    from planner.cost.bridgesettings import TN_ONLY_GPUS
    from planner.models.membound_rate import achieved_tbps

    if te_primary_weights(setup) != "megatron-fsdp":  # decided before the profile's GPU is read: a CPU profile has none
        return 0.0
    record, gpu = runtimes.of(setup.training), dataparallel.profile_gpu(profile)
    if gpu.name not in TN_ONLY_GPUS:
        return 0.0
    return (record.fp8_param_bytes + record.fp8_param_transpose_bytes) / (achieved_tbps(gpu, "fused") * 1e12) * 1e3


def _precompute_ms(profile: Profile) -> float:
    """Per converted parameter, the float8 all-gather's scale precompute: its fp32 master read
    once per iteration at the HBM bandwidth, in ms. Added to the layer's step time, which the
    cost model divides over the shard group as it does the step (dataparallel.device_step_ms):
    each rank reads its 1/K."""
    from planner.cost import dataparallel

    return FP32_BYTES / (dataparallel.profile_gpu(profile).hbm_tbps * 1e12) * 1e3
