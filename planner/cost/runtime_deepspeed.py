"""DeepSpeed's step facts beyond the record in planner/cost/runtimes.py: what ZeRO's optimizer does around its step
and each gradient's reduce-scatter, read at DeepSpeed v0.6.2 (32d97976, the version DeepSpeed's 2022-07-26 Azure post
ran; docs/framework-facts.md §176), charged by planner/cost/deepspeed_step.py and planner/cost/stepcomm.py.

- every gradient's reduce-scatter: `reduce_scatter_coalesced` (deepspeed/runtime/comm/coalesced_collectives.py 41-116)
  divides the whole gradient in place by the ranks (`tensor_partition_flat_buffer.div_(world_sz)`, "pre-divide")
  before `_reduce_scatter_base`, on the reduce-and-partition stream: one eager elementwise pass, read 2 B and write 2
  B a parameter in fp16 (a single tensor that divides evenly is its own flat buffer; several are first interleaved by
  `torch.cat`, which a bucket of the Azure blocks' biases and norms takes and their weights, each over
  reduce_bucket_size, do not);
- the step's end: `_post_step` (stage3.py 2247-2262) all-gathers the persistent parameters (`ds_numel <
  stage3_param_persistence_threshold`, stage3.py 1048-1062; `_partition_all_parameters` released them at the step's
  start, 2498-2506) with `_allgather_params_coalesced` (partition_parameters.py 1244-1304): one `_all_gather_base` a
  parameter, then `torch.cuda.synchronize()`;
- the step's scalars: `has_overflow` (stage3.py 2402-2432) all-reduces the overflow flag over the data-parallel group
  (MAX), and the gradients' norm for clipping one more scalar (SUM: `get_grad_norm_direct` 1934-1990 on the GPU,
  `complete_grad_norm_calculation_for_cpu_offload` 1614-1641 under the optimizer's offload); ZeRO 1/2 the same two
  (stage_1_and_2.py 1141, 1824 at v0.6.2). Each read back on the host (`.item()`) before the step goes on.
- the offloaded optimizer's gradient copy: under `offload_optimizer`, `__partition_grads` (stage3.py 1643-1717) ends
  each reduced partition's path with `fp32_grad_tensor.copy_(grad_buffer)`, non_blocking False, on the reduce stream,
  inside the gradient hook that issued the reduce-scatter (1469-1546), at the accumulation boundary: the backward's
  host thread waits for that reduce-scatter before it issues anything more (planner/cost/deepspeed_waits.py).
- the offloaded step at ZeRO 3: `step` (stage3.py 2300-2315) walks the sub-groups one at a time, each's CPU Adam
  (`_optimizer_step` 1241-1247: `optimizer.step()` on the fp32 partition alone, no fp16 copy inside) and then its
  fp16 partition's copy to the GPU (`_reassign_or_swap_out_partitioned_parameters` 2264-2272): serial, the default of
  --offload-copies at ZeRO 3 (ZeRO 1 and 2 under fp16 hand the GPU's fp16 partitions to DeepSpeedCPUAdam, whose
  `adam_update_copy` copies tile by tile beside the step: stage_1_and_2.py 1725-1731, ops/adam/cpu_adam.py 171-185).
"""

from __future__ import annotations

DS_V062 = "DeepSpeed v0.6.2 (32d97976)"

# over the data-parallel group under ZeRO (at TP 1 and one stage, where ckplan scores ZeRO 3: the world, stepcomm's
# "grad_stats"); without ZeRO the model-parallel group's, where FP16_Optimizer reduces them (not read further)
STEP_COLLECTIVES = (("overflow check", "grad_stats", ""), ("gradient norm", "grad_stats", ""))

STEP_FACTS = {"reduce_scatter_prepass_bytes": 2 + 2, "partition_check_bytes": 2 * (2 + 1 + 1),
              "regathers_persistent": True, "step_collectives": STEP_COLLECTIVES,
              "waits_offloaded_grad_copy": True, "offload_step_serial_zero": (3,)}

SOURCES = {
    "reduce_scatter_prepass_bytes": f"deepspeed/runtime/comm/coalesced_collectives.py 41-116 (reduce_scatter_coalesced: "
                                    f"tensor_partition_flat_buffer.div_(world_sz) over the whole gradient before "
                                    f"_reduce_scatter_base), {DS_V062}",
    "partition_check_bytes": f"deepspeed/runtime/zero/stage3.py 1676-1677 (__partition_grads, every reduced partition: "
                             f"__inf_or_nan_tracker.logical_or_(torch.isinf(grad_buffer).any()), the same with "
                             f"torch.isnan: each reads the partition, 2 B, and writes and reads a bool), {DS_V062}",
    "regathers_persistent": f"deepspeed/runtime/zero/stage3.py 2247-2262 (_post_step: persistent_parameters[0]."
                            f"all_gather(persistent_parameters)), partition_parameters.py 1244-1304 "
                            f"(_allgather_params_coalesced: one _all_gather_base a parameter, torch.cuda.synchronize()), "
                            f"{DS_V062}",
    "step_collectives": f"deepspeed/runtime/zero/stage3.py 2402-2432 (has_overflow: all_reduce MAX over the "
                        f"data-parallel group), 1934-1990 / 1614-1641 (the gradients' norm: all_reduce SUM); "
                        f"stage_1_and_2.py 1141, 1824, {DS_V062}",
    "waits_offloaded_grad_copy": f"deepspeed/runtime/zero/stage3.py 1643-1717 (__partition_grads under offload_optimizer: "
                                 f"fp32_grad_tensor.copy_(grad_buffer), blocking, on the reduce-and-partition stream; "
                                 f"at the boundary first each partition's fp64 norm, 1690-1692: deepspeed_grads), "
                                 f"1469-1546 (called from the gradient hook that issues the bucket's reduce-scatter), "
                                 f"{DS_V062}",
    "offload_step_serial_zero": f"deepspeed/runtime/zero/stage3.py 2300-2315 (step: for each sub-group "
                                f"_optimizer_step, 1241-1247, then _reassign_or_swap_out_partitioned_parameters, "
                                f"2264-2272: the fp16 copy after the CPU Adam, one sub-group at a time); ZeRO 1/2 "
                                f"overlapped (stage_1_and_2.py 1725-1731: DeepSpeedCPUAdam's adam_update_copy, "
                                f"ops/adam/cpu_adam.py 171-185), {DS_V062}",
}

# the same facts where not read (every other record's sources)
NOT_READ = {
    "reduce_scatter_prepass_bytes": "not read for this runtime (nothing charged before its reduce-scatters)",
    "partition_check_bytes": "not read for this runtime (no ZeRO 3 gradient partitions checked every microbatch)",
    "regathers_persistent": "not read for this runtime (no ZeRO 3 persistent parameters)",
    "waits_offloaded_grad_copy": "not read for this runtime (no blocking copy of a reduced gradient to the host)",
    "offload_step_serial_zero": "not read for this runtime (ckplan's overlapped offload chunks)",
}

# BLOOM's DeepSpeed (the big-science fork's BF16_Optimizer at ZeRO 1, runtimes._deepspeed's older record): not read
BLOOM_FACTS = {"reduce_scatter_prepass_bytes": 0, "partition_check_bytes": 0, "regathers_persistent": False,
               "step_collectives": (),
               "waits_offloaded_grad_copy": False, "offload_step_serial_zero": ()}
BLOOM_NOT_READ = {**NOT_READ, "step_collectives": "not read for BLOOM's BF16_Optimizer (its step's scalar all-reduces "
                                                  "not charged)"}


# DeepSpeed as BLOOM 176B trained (bigscience tr11-176B-ml README: the olruwase/bf16-updates branch, merged as
# pull request #1801 "bf16+pipeline parallelism", 56c52238, 2022-04-19): framework-facts §61
DS_BLOOM = "DeepSpeed 56c52238 (2022-04-19, #1801: the bf16-updates branch BLOOM 176B ran)"
BLOOM_SOURCES = {
    "grad_bytes": f"reduced in bf16: deepspeed/runtime/engine.py 712-721 (communication_data_type: bfloat16 under bf16 "
                  f"where the config names none, as tr11-176B-ml.slurm's ds_config does not), 2063-2088 "
                  f"(allreduce_bucket casts the fp32 bucket to it); held: the bf16 .grad autograd makes each backward "
                  f"(pipe/engine.py 746-760: clear_lp_grads before it, update_hp_grads(clear_lp_grads=False) after; "
                  f"engine.py 1807-1811: no zero_grad under bf16 without ZeRO), whole, 2 B; the fp32 ones beside "
                  f"them are hp_grad_bytes, {DS_BLOOM}",
    "overlaps_grad_reduce": f"deepspeed/runtime/pipe/engine.py 250-267 (ReduceGrads, the schedule's instruction after "
                            f"the last microbatch: _bf16_reduce_grads, buffered_allreduce_fallback over the fp32 "
                            f"gradients), pipe/schedule.py TrainSchedule (ReduceTiedGrads, ReduceGrads, OptimizerStep "
                            f"after the last step's commands), {DS_BLOOM}",
    "zero1_all_reduces": f"deepspeed/runtime/pipe/engine.py 263-267 (_bf16_reduce_grads: buffered_allreduce_fallback "
                         f"over the whole gradients), engine.py 2063-2088 (dist.all_reduce over the data-parallel "
                         f"group); each rank then steps its partition (bf16_optimizer.py 146-160), {DS_BLOOM}",
    "hp_grad_accumulate_bytes": f"deepspeed/runtime/pipe/engine.py 754-760 (update_hp_grads after every backward), "
                                f"bf16_optimizer.py 383-400 (hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))): "
                                f"2 + 4 (the cast) + 4 + 4 + 4 (the add) B a parameter a microbatch, {DS_BLOOM}",
    "hp_grad_bytes": f"deepspeed/runtime/bf16_optimizer.py 163-172 (fp32_groups_gradients_flat: torch.zeros_like of "
                     f"the whole flat bf16 group in float32, split into per-parameter views), 182-187 (the rank's "
                     f"partition only a narrow of it: not sharded), 431-433 (zeroed in place after the step, never "
                     f"freed), {DS_BLOOM}; bigscience tr11-176B-ml README 461 (9e64ede): \"It doesn't shard the static "
                     f"fp32 buffer it reuses, which consumes `4 bytes * params` of additional memory\"",
    "hp_grad_cast_bytes": f"deepspeed/runtime/bf16_optimizer.py 383-393 (update_hp_grads: "
                          f"hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype)), a new fp32 tensor of one parameter, freed "
                          f"after its add), called after each microbatch's backward (pipe/engine.py 758-760) before the "
                          f"stage's output buffer is let go (763-764), {DS_BLOOM}",
    "reduce_cast_bytes": f"deepspeed/runtime/pipe/engine.py 263-267 (_bf16_reduce_grads: buffered_allreduce_fallback over "
                         f"get_grads_for_reduction(), the flat fp32 groups, bf16_optimizer.py 401-403), engine.py 2095-2106 "
                         f"(allreduce_no_retain: a group above 500M elements is its own bucket), 2063-2088 "
                         f"(allreduce_bucket: flatten of one tensor is a view, then tensor.to(communication_data_type), "
                         f"bf16 under bf16: a new 2 B copy of the group, all-reduced and copied back), {DS_BLOOM}; "
                         f"Megatron-DeepSpeed's two groups (megatron/optimizer/__init__.py 26-47, bigscience-workshop "
                         f"0fef0705: weights; biases and LayerNorms) reduced one after the other: charged per parameter "
                         f"of every layer, the small group's too",
    "bf16_zero": f"deepspeed/runtime/engine.py 1067-1100 (_configure_optimizer: bf16 without ZeRO -> BF16_Optimizer), "
                 f"bf16_optimizer.py 146-160, 201-202 (the fp32 master an even 1/dp partition of the flat group, the "
                 f"only parameter the wrapped optimizer steps, so its Adam states too), pipe/engine.py 250-261 (bf16 "
                 f"at ZeRO 1 raises NotImplementedError in _exec_reduce_grads), dp_support (ZeRO 2/3 asserted "
                 f"beside a pipeline), {DS_BLOOM}; bigscience tr11-176B-ml.slurm 144 (9e64ede): 'ZERO_STAGE=0 # "
                 "important: bf16 must use z0! it implements its own zero stage 1 equivalent'",
    "pipeline_max_zero": f"deepspeed/runtime/pipe/engine.py 72 (PipelineEngine.__init__: assert zero_optimization_stage() "
                         f"< 2, 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'), {DS_BLOOM}",
    "shard_group_zero": f"none: every ZeRO stage partitions over the whole data-parallel group at {DS_BLOOM}; MiCS "
                        f"(deepspeed/runtime/zero/mics.py) came a year later (2e99f6ed, 2023-04-25)",
    "adam_step_scratch": "bigscience-workshop/Megatron-DeepSpeed megatron/optimizer/__init__.py 16, 57-72, 82-83 (0fef0705): "
                         "apex FusedAdam handed to deepspeed.initialize, which BF16_Optimizer wraps (engine.py 1280-1294, "
                         f"{DS_BLOOM}): a fused multi-tensor step in place, no scratch",
}
