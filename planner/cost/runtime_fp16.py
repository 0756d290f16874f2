"""fp16 with a loss scaler (TrainingSetup.precision "fp16-mixed": Megatron-LM's --fp16, DeepSpeed's fp16.enabled):
each runtime's facts under it, read from its code (docs/framework-facts.md §694-§698), filled into its record
(each record names them), the record as a setup under fp16 reads it (`under_fp16`), and the refusal where a runtime trains none.

- Megatron-LM d98e8a64 (and the Bridge's megatron-core 92c8482e): the DDP gradient buffer is in the parameter's
  dtype unless grad_reduce_in_fp32, which only --bf16 turns on (Bridge's fp16_mixed sets it False): fp16, 2 B; the
  step copies each gradient of the rank's shard into a new fp32 tensor (main_param.grad = main_grad.float()), 4 B,
  held to the next zero_grad, past the step; then the loss scaler unscales it and checks for inf/nan
  (torch._amp_foreach_non_finite_check_and_unscale_: 4 B read, 4 B written) and all-reduces the found-inf flag
  (MAX over the gradient-statistics group). Under bf16 the copy is the fp32 buffer itself and no scaler runs.
- DeepSpeed (v0.6.2's and edaa7221's ZeRO): every flat buffer is made in the parameters' dtype (`self.dtype`), and
  the overflow check and its all-reduce run whatever that dtype is: fp16's bytes and passes are the ones the record
  already charges (2 B gradients). DeepSpeed 56c52238's BLOOM record reads BF16_Optimizer, which fp16 does not run.
- torchtitan b5bcd76c: training.mixed_precision_param takes "bfloat16" or "float32" only, and nothing in it scales
  the loss; ckplan's own runtime has no gradient scaler; ColossalAI's fp16 path was not read: each refused.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost.runtime_facts import RuntimeFacts

FP16 = "fp16-mixed"
_MCORE = "Megatron-LM d98e8a64"
MEGATRON = {"fp16_grad_bytes": 2, "fp16_grad_step_copy_bytes": 4, "fp16_scaler_bytes": (2 + 4) + (4 + 4),
             "fp16_step_collectives": (("loss scaler's found-inf", "grad_stats", ""),), "fp16_min_zero": 0}
MEGATRON_SOURCES = {
    "fp16_grad_bytes": f"megatron/core/distributed/param_and_grad_buffer.py 924 (grad_dtype = torch.float if "
                       f"grad_reduce_in_fp32 else param.dtype), megatron/training/arguments.py 1195-1217 (only the "
                       f"--bf16 branch sets accumulate_allreduce_grads_in_fp32), {_MCORE}; Megatron-Bridge 067f987d "
                       f"src/megatron/bridge/training/mixed_precision.py 201-213 (fp16_mixed: grad_reduce_in_fp32 False)",
    "fp16_grad_step_copy_bytes": f"megatron/core/optimizer/optimizer.py 1092-1106 (Float16OptimizerWithFloat16Params: "
                                 f"main_param.grad = model_param.main_grad.float()), distrib_optimizer.py 2756-2792 "
                                 f"(the shard's: shard_main_param.grad = shard_model_grad.float()), optimizer.py "
                                 f"1048-1061 (zero_grad(set_to_none) at the next train_step), {_MCORE}; the same at "
                                 f"megatron-core 92c8482e (optimizer.py 755)",
    "fp16_scaler_bytes": f"megatron/core/optimizer/optimizer.py 741-772 (prepare_grads: the copy, 2 B read and 4 B "
                         f"written; then _unscale_main_grads_and_check_for_nan 713-738: "
                         f"torch._amp_foreach_non_finite_check_and_unscale_ over the fp32 main grads, 4 B read and 4 B "
                         f"written), {_MCORE}",
    "fp16_step_collectives": f"megatron/core/optimizer/optimizer.py 729-736 (found_inf all_reduce MAX over "
                             f"get_grad_stats_parallel_group(), then .item()), {_MCORE}",
    "fp16_min_zero": f"both optimizers read: Float16OptimizerWithFloat16Params (ZeRO 0) and the distributed optimizer "
                     f"(ZeRO 1), {_MCORE}",
}
DEEPSPEED_SOURCES = {
    "fp16_grad_bytes": "deepspeed/runtime/zero/stage3.py 275 (self.dtype, the parameters'), 524-545 (the gradient "
                       "bucket and partitions in it), 487-499 (the loss scaler, dynamic unless given a scale), "
                       "stage_1_and_2.py 262, 1800 (has_overflow at every step), DeepSpeed v0.6.2 (32d97976); "
                       "stage3.py 236, 511, 2547 at edaa7221: fp16's gradients are 2 B as bf16's",
    "fp16_grad_step_copy_bytes": "deepspeed/runtime/zero/stage3.py 2094-2112 (the sub-group's fp32 gradient made and "
                                 "dropped inside the step, fp16 or bf16 alike: the record's replay), v0.6.2",
    "fp16_scaler_bytes": "deepspeed/runtime/zero/stage3.py 2232-2245 (_overflow_check_and_loss_scale_update, under "
                         "either dtype: the record's partition_check_bytes and step_collectives), v0.6.2",
    "fp16_step_collectives": "deepspeed/runtime/zero/stage3.py 2402-2432 (has_overflow's all-reduce, under either "
                             "dtype: already the record's step_collectives), v0.6.2",
    "fp16_min_zero": "deepspeed/runtime/engine.py 1067-1080 (ZeRO's optimizer whatever the dtype), 1097-1098 (without "
                     "ZeRO fp16 runs FP16_Optimizer, not read), v0.6.2",
}
CKPLAN_REFUSED = ("planner/runtime has no gradient scaler (no torch.amp.GradScaler; stagemodule.py runs float32 or "
                  "bfloat16): ckplan's own runtime trains no fp16")
TITAN_REFUSED = ("torchtitan b5bcd76c torchtitan/config/configs.py 94 (mixed_precision_param: Literal['bfloat16', "
                 "'float32']) and no loss scaler anywhere in torchtitan/: torchtitan trains no fp16")
COLOSSALAI_REFUSED = "ColossalAI's fp16 path (its mixed-precision optimizer's loss scaler) was not read"
BLOOM_REFUSED = "DeepSpeed 56c52238's record reads BLOOM's BF16_Optimizer; fp16 runs FP16_Optimizer there, not read"
FIELDS = tuple(MEGATRON)
# DeepSpeed's ZeRO: fp16's gradients are the record's own 2 B, nothing beside bf16's
DEEPSPEED = {"fp16_grad_bytes": 2, "fp16_grad_step_copy_bytes": 0, "fp16_scaler_bytes": 0, "fp16_step_collectives": (),
             "fp16_min_zero": 1}


def not_trained(reason: str) -> dict[str, str]:
    """The sources of a record that trains no fp16: the reason, which the refusal quotes."""
    return {name: reason for name in FIELDS}


def under_fp16(record: RuntimeFacts) -> RuntimeFacts:
    """The record as an fp16-mixed setup reads it: its gradients at fp16_grad_bytes (dataparallel.param_bytes, so the
    static bytes and the reduction); the step's passes over the whole gradient buffer (step_whole_bytes: Megatron-LM's
    norm check and zeroing of it) at that buffer's bytes; the loss scaler's pass over the shard in the step's reads
    (rules.step_checks_ms) and its all-reduces among the step's (stepcomm)."""
    if not record.fp16_grad_bytes:
        return record
    whole = record.step_whole_bytes * record.fp16_grad_bytes // record.grad_bytes
    return replace(record, grad_bytes=record.fp16_grad_bytes, step_whole_bytes=whole,
                   step_shard_bytes=record.step_shard_bytes + record.fp16_scaler_bytes,
                   step_collectives=record.step_collectives + record.fp16_step_collectives)


def refused(training, record: RuntimeFacts) -> list[str]:
    """One sentence where the setup trains fp16 and its runtime does not (or was not read doing so)."""
    found = refusal(getattr(training, "precision", None), record)
    return [found] if found else []


def refusal(precision: str | None, record: RuntimeFacts, zero: int | None = None) -> str | None:
    """The sentence refusing fp16-mixed under a record that trains no fp16, naming it and why, or at a ZeRO stage
    (`zero`, where known) below the one whose fp16 optimizer was read; else None."""
    if precision != FP16:
        return None
    if record.fp16_grad_bytes and zero is not None and zero < record.fp16_min_zero:
        return (f"--precision {FP16} at ZeRO {zero} under --runtime {record.name}: {record.sources['fp16_min_zero']}; "
                f"give --zero {record.fp16_min_zero} or more, or bf16-mixed")
    if record.fp16_grad_bytes:
        return None
    return (f"--precision {FP16} (fp16 with a loss scaler) is not modelled under --runtime {record.name}: "
            f"{record.sources['fp16_grad_bytes']}; give bf16-mixed or choose --runtime megatron or deepspeed")


def mixed(precision: str) -> bool:
    """16-bit weights and gradients with an fp32 master in the optimizer (bf16-mixed, fp16-mixed)."""
    return precision in ("bf16-mixed", FP16)
