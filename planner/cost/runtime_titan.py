"""torchtitan's record, one per version read (9dec370, bbb1b616, 2c8b5947, b5bcd76c): what it holds,
in which dtype and when it frees, each fact with the file, lines and commit it was read from
(docs/framework-facts.md). planner/cost/runtimes.py chooses the version."""

from __future__ import annotations

from planner.cost import runtime_fp16
from planner.cost.bridgesettings import BRIDGE_SETTINGS_NOT_READ
from planner.cost.runtime_facts import LossRegion, RuntimeFacts
from planner.cost.runtime_shared import (
    AFTER_STEP_NOT_READ,
    COMPILED_LOSS,
    EAGER_MOE_KEPT,
    EAGER_WGRAD,
    INPUT_GRADS_CLEARED,
    INPUT_GRADS_KEPT,
    MEMTRACKER,
    MODEL_CODE_KERNELS,
    MULTI_LOCKSTEP,
    PIPELINING_OUTPUTS,
    REDUCES_AFTER_LAST_BACKWARD,
    RS_INPUT_DROPPED,
    RS_INPUT_KEPT,
    TORCH_PIPELINING,
    TORCH_PIPELINING_SOURCES,
    TORCH_V,
    TORCHAO_V,
)

_TITAN_OLD = "torchtitan 9dec370 (2024-12-26)"
_TITAN_NEW = "torchtitan bbb1b616 (2025-04-02) to b5bcd76c (2026-08-21)"
# the torch each torchtitan version ran: 9dec370's benchmarks name torch 1963fc8 (2024-12-23;
# benchmarks/llama3_h100_202412_torchtitan.md); bbb1b616 ran the nightly of its day (2025-04), both
# before pytorch#153383 (2025-05-13) made output_chunks the last stage's only
# the torch each version ran, where a torch fact turns on its date (input_grads_held_to_step_end)
_TITAN_TORCH = {
    "9dec370": "torchtitan 9dec370 ran torch 1963fc8 (2024-12-23; benchmarks/llama3_h100_202412_torchtitan.md)",
    "bbb1b616": "torchtitan bbb1b616 (2025-04-02) ran the torch nightly of its day",
    "2c8b5947": "torchtitan 2c8b5947 (2025-08-08) ran torch 2.9.0.dev20250811 (torchao/float8/README.md 853f87d1)",
}
_TITAN_OUTPUTS = {
    "9dec370": ("every-stage", f"train.py 287-292 (pp_schedule.step(...) returns the merged outputs), {_TITAN_OLD}, "
                "with torch 1963fc8 (2024-12-23; benchmarks/llama3_h100_202412_torchtitan.md): "
                f"{PIPELINING_OUTPUTS}; every stage appended its output until pytorch#153383 (2025-05-13)"),
    "bbb1b616": ("every-stage", "torchtitan/train.py (pp_schedule.step(...) without return_outputs), bbb1b616 "
                 f"(2025-04-02), on the torch nightly of its day: {PIPELINING_OUTPUTS}; every stage appended its "
                 "output until pytorch#153383 (2025-05-13)"),
    "2c8b5947": ("last-stage", "torchtitan/train.py 429-435 (pp_schedule.step(...) without return_outputs), 2c8b5947 "
                 "(2025-08-08), on torch 2.9.0.dev20250811 (torchao's MI300X benchmarks, torchao/float8/README.md "
                 f"853f87d1): {PIPELINING_OUTPUTS}; since pytorch#153383 (2025-05-13) the last stage's alone"),
    "b5bcd76c": ("none", "torchtitan/trainer.py 827-833 (pp_schedule.step(..., return_outputs=False)), b5bcd76c "
                 "(2026-08-21); since e5ef99aab (2025-10-22), with pytorch#165822's return_outputs"),
}

# FSDP2's units as each torchtitan applies them without a pipeline (its apply_fsdp), and what the
# torch it ran keeps gathered from the forward on: (grouping, gathered from forward, source)
_ROOT_CLAMP = ("FSDP2 kept the root unit gathered after its forward whatever reshard_after_forward said "
               "(torch/distributed/fsdp/_fully_shard/_fsdp_state.py _lazy_init: the root's "
               "post_forward_mesh_info = None) until pytorch#154704 (2025-06), after which only an "
               "automatic setting is clamped (_fsdp_state.py 205-207, torch 2.13.0 cf30153c)")

_TITAN_UNITS = {
    "9dec370": ("root-ends", ("first", "before-last"),
                f"torchtitan/parallelisms/parallelize_llama.py 324-339 (every TransformerBlock a unit, the last "
                f"with reshard_after_forward False without PP; then fully_shard(model): tok_embeddings, norm and "
                f"output the root unit), {_TITAN_OLD}, on torch 1963fc8 (2024-12-23); the same at 54ef4222 "
                f"(2025-03-12, torchao's H100 row: torchtitan/models/llama/parallelize_llama.py 346-369): "
                f"{_ROOT_CLAMP}"),
    "bbb1b616": ("root-ends", ("first", "before-last"),
                 "torchtitan/models/llama/parallelize_llama.py 351-374 (as 9dec370), bbb1b616 (2025-04-02), on the "
                 f"torch nightly of its day: {_ROOT_CLAMP}"),
    "2c8b5947": ("per-layer", ("last",),
                 "torchtitan/models/llama3/infra/parallelize.py 402-422 (tok_embeddings a unit, every block a unit "
                 "resharded after forward without PP, [norm, output] one unit resharded only under the policy "
                 "\"always\", then fully_shard(model) with no parameters left), 2c8b5947 (2025-08-08)"),
    "b5bcd76c": ("per-layer", ("last",),
                 "torchtitan/distributed/fsdp.py 234-266 (tok_embeddings a unit, [norm, lm_head] one unit not "
                 "resharded after forward unless \"always\"; tied weights put tok_embeddings in that unit, 238-249, "
                 "fsdpunits.unit_of_layers), 290-368 (every block, then the root), b5bcd76c (2026-08-21)"),
}

# torchtitan's package version (assets/version.txt) names a span of commits whose records differ: a
# run that states only it is scored by the record of its commit, which the sentence helps to choose
PACKAGES = {
    "0.0.2": "every commit from b889f3d5 (2024-04-16) to b461ea82 (2025-06-05), over which the loss became "
             "compiled under training.compile (bbb1b616, 2025-04-02): give 9dec370 for a torchtitan before "
             "2025-04-02 (torchao's H100 float8 benchmarks of 2025-03-12 ran one), bbb1b616 from then",
    "0.1.0": "every commit from b461ea82 (2025-06-05) to 29624e37 (2025-10-17), each compiling the loss under "
             "compile: give 2c8b5947 (a pipeline's last stage keeps its outputs to the step's end with a torch "
             "from after pytorch#153383, 2025-05-13), or bbb1b616 with an earlier torch",
}

# torch.compile of the model (--compile): who compiles it, and what runs where it is not compiled
_TITAN_COMPILES = {
    "9dec370": "torchtitan/parallelisms/parallelize_llama.py 70-77, 297-306 (training.compile: apply_compile, "
               "torch.compile of each TransformerBlock, fullgraph), 9dec370 (2024-12-26)",
    "bbb1b616": "torchtitan/models/llama/parallelize_llama.py 86-88, 308-320 (training.compile: apply_compile, each "
                "TransformerBlock), bbb1b616 (2025-04-02)",
    "2c8b5947": "torchtitan/models/llama3/infra/parallelize.py 95-97, 345-354 (training.compile: apply_compile, "
                "torch.compile of each TransformerBlock), 2c8b5947 (2025-08-08)",
    "b5bcd76c": "torchtitan/models/llama3/parallelize.py 42-55 (compile.enable with \"model\" in compile.components: "
                "apply_compile), torchtitan/distributed/compile.py 39-72 (each TransformerBlock .compile(fullgraph="
                "True)), b5bcd76c (2026-08-21)",
}

# torchtitan's step beside the optimizer's fused 28 B a parameter (the profile's step: read the fp32
# parameter, gradient, exp_avg, exp_avg_sq; write three), per parameter of the rank's fp32 shard:
# gradient clipping, every step (training.max_norm 1.0): get_total_norm's _foreach_norm reads the
# gradient (4 B), clip_grads_with_norm_'s _foreach_mul_ reads and writes it (8 B), whatever the norm
# (torch 2.13 torch/nn/utils/clip_grad.py 95, 173; torchtitan 9dec370 torchtitan/utils.py
# 348-404, train.py 311-316: foreach=True). At 9dec370 AdamW is foreach, not fused (optimizer.py
# 132-138): torch 2.13 torch/optim/adam.py 691-724, 770-799 (_multi_tensor_adam, not capturable) runs
# _foreach_mul_ on the parameters (weight decay 0.1: 8 B), lerp_ of exp_avg (12), mul_ and addcmul_
# of exp_avg_sq (8 + 12), sqrt into a new tensor (8), div_ and add_ on it (8 + 8), addcdiv_ into the
# parameters (16): 80 B, 52 beyond the fused kernel's 28. bbb1b616 and b5bcd76c default to fused
# (optimizer.implementation, b5bcd76c torchtitan/components/optimizer/optimizer.py 110-111).
# An eager checkpoint's rerun: whole at b5bcd76c (early_stop=False); earlier, checkpoint_wrapper(module,
# preserve_rng_state=False) with torch's default early stop (torch 2.6.0 utils/checkpoint.py 735, 1084). A
# compiled block's rerun is the partitioner's at every version (planner/cost/compiledrerun.py, §81).
_EARLY_STOP = ("checkpoint_wrapper(module, preserve_rng_state=False): torch's default early_stop=True "
               "(torch/utils/checkpoint.py 735, 1084, torch 2.6.0), so the rerun stops after the last saved tensor")
_TITAN_EARLY_STOP = {
    "9dec370": f"torchtitan/parallelisms/parallelize_llama.py 233-234 {_EARLY_STOP}, 9dec370",
    "bbb1b616": f"torchtitan/models/llama/parallelize_llama.py 245, 294 {_EARLY_STOP}, bbb1b616",
    "2c8b5947": f"torchtitan/models/llama3/infra/parallelize.py 256, 329 {_EARLY_STOP}, 2c8b5947",
    "b5bcd76c": "torchtitan/distributed/activation_checkpoint.py 180, 285 (early_stop=False), b5bcd76c; a compiled "
                "block's rerun is the partitioner's whatever early_stop says (planner/cost/compiledrerun.py)",
}
# every pipeline stage moves the whole batch, inputs and labels, to the device before the schedule takes its
# share (views: torch's pipelining splits by tensor_split); b5bcd76c a step's group of microbatches at a time,
# with a third int64 tensor of positions, one a token, every stage's kwargs (docs/framework-facts.md §707, §708)
_TITAN_BATCH = {
    "9dec370": "torchtitan 9dec370 train.py 259-265 (input_ids, labels .to(device_type) before the pipeline branch)",
    "bbb1b616": "torchtitan bbb1b616 torchtitan/train.py 305-308 (inputs and labels to the device on every stage)",
    "2c8b5947": "torchtitan 2c8b5947 torchtitan/train.py 393-397 (inputs and labels to the device on every stage)",
    "b5bcd76c": "torchtitan b5bcd76c torchtitan/trainer.py 880-888 (each group's microbatches to the device on every stage)"}
_TITAN_POSITIONS = {
    **dict.fromkeys(("9dec370", "bbb1b616"), "no positions: the dataset yields (input, label) (torchtitan/datasets/"
                    "hf_datasets.py 127)"),
    "2c8b5947": "no positions: the dataset yields ({\"input\": input}, label) (torchtitan/datasets/hf_datasets.py 138)",
    "b5bcd76c": "torchtitan/components/data/collators.py 55-80 (TextCollator: positions by torch.arange, int64, the "
                "inputs' length), trainer.py 672-748 (every batch key but input a model kwarg), 805-830 (kwarg_mbs to "
                "every stage) at b5bcd76c"}
# What the train loop holds of the step's batch while it accumulates without a pipeline (docs/framework-facts.md §745)
_TITAN_ACCUMULATED = {
    **dict.fromkeys(("9dec370", "bbb1b616"), ("whole", "no accumulation at this version (accumulates_without_pipeline)")),
    "2c8b5947": ("current", "torchtitan 2c8b5947 torchtitan/train.py 370-399 (batch_generator moves one batch to the "
                 "device and yields it), 471-474 (train_step rebinds input_dict, labels each microbatch): one "
                 "microbatch's inputs and labels at a time"),
    "b5bcd76c": ("inputs", "torchtitan b5bcd76c torchtitan/trainer.py 854-863 (microbatch_groups keeps every group's "
                 "input_dict to the step's end), 880-896 (each group's tensors .to(device) written back into its "
                 "input_dict; label_mbs a new list each group, its labels alone on the device): every microbatch's "
                 "inputs and positions, the current one's labels")}
_TITAN_CLIP_BYTES = 12
_TITAN_FOREACH_ADAMW_EXTRA_BYTES = 80 - 28

def torchtitan(version: str) -> RuntimeFacts:
    compiles_loss = version != "9dec370"
    read_at = _TITAN_OLD if not compiles_loss else _TITAN_NEW
    return RuntimeFacts(
        name="torchtitan", version=version,
        pipeline_schedules=("1F1B", "GPipe", "interleaved-1F1B", "ZB", "ZBV")
        + (() if version == "9dec370" else ("DualPipeV",)),
        grad_bytes=4, shard_weight_bytes=4, master_bytes=0, zero1_whole_tensors=False, zero_as_fsdp2=True, grads_allocated_at_first_backward=True,
        adam_step_scratch=version == "9dec370",
        loss=LossRegion(kept_x=2.0, peak_x=6.0, kept_counts_logits=False),
        loss_vocab_parallel=LossRegion(kept_x=2.0, peak_x=8.0, kept_counts_logits=False),
        loss_compiled=COMPILED_LOSS if compiles_loss else None, tp_saves_gathered_input=True,
        compiles_model=True, runs_instead="",
        **{**TORCH_PIPELINING, "batch_held": "every-stage"}, batch_positions=version == "b5bcd76c", logits_held_in_backward="pipeline", recompute_whole_forward=version == "b5bcd76c", outputs_held_to_step_end=_TITAN_OUTPUTS[version][0],
        step_shard_bytes=_TITAN_CLIP_BYTES + (_TITAN_FOREACH_ADAMW_EXTRA_BYTES if version == "9dec370" else 0),
        overlaps_grad_reduce=True, prefetches_zero3_gathers=True, tp_overlap="async-tp", cublas_workspace_bytes=None, async_tp_workspace=True, tp_gathers_float8=True,
        cp_comm="allgather", cp_repeats_kv=version != "b5bcd76c", cp_compiled_waits_at_issue=version == "9dec370",
        rotary_table="model-chunk" if version == "9dec370" else "", float8="torchao", float8_memory=True, keeps_last_reduce_scatter_input=version == "9dec370",
        reduces_after_last_backward=version == "9dec370", input_grads_held_to_step_end=version != "b5bcd76c",
        multi_schedule_lockstep=version == "9dec370",
        float8_saves_input=version == "9dec370", chunked_loss=version == "b5bcd76c",
        accumulates_without_pipeline=version not in ("9dec370", "bbb1b616"), ties_across_stages=False,
        accumulated_batch=_TITAN_ACCUMULATED[version][0],
        loss_requests_eager_ce=version == "9dec370", final_norm_eager_fp32=version == "9dec370",
        head_reduce_scatter_cat=version == "9dec370",
        nccl_version="2.21.5" if version == "9dec370" else "2.27.7",
        fsdp2_step_replayed=True, expandable_segments=True, fsdp_units=_TITAN_UNITS[version][0], fsdp_gathered_from_forward=_TITAN_UNITS[version][1],
        sources={
            **BRIDGE_SETTINGS_NOT_READ, "te_moe_experts_kept": EAGER_MOE_KEPT, **runtime_fp16.not_trained(runtime_fp16.TITAN_REFUSED),
            "wgrad_in_gemm": EAGER_WGRAD,
            "fsdp_units": _TITAN_UNITS[version][2],
            "cpu_collectives": "NCCL: the framework trains on GPUs alone",
            "fsdp_gathered_from_forward": _TITAN_UNITS[version][2],
            "cp_comm": f"torch/distributed/tensor/experimental/_context_parallel/_attention.py 77 (_cp_options."
                       f"rotate_method = ALL_GATHER), 273-300, 317-486 (forward), 488-655 (backward: dK/dV by "
                       f"all-to-all in fp32), {TORCH_V}; torchtitan's experimental.context_parallel_rotate_method "
                       f"defaults to allgather at {_TITAN_OLD}; b5bcd76c keeps torch's default",
            "rotary_table": (
                "torchtitan/models/llama/model.py 365-368, 417-425 (freqs_cis, a buffer of every model chunk: "
                "[max_seq_len, head_dim / 2] complex64), train.py 107 (max_seq_len = training.seq_len), 152-163 (every "
                "pipeline part its own), 262-275 (cp_buffers=[input_ids, labels, model.freqs_cis]: under a pipeline "
                "the meta model's), 9dec370; torch 2.6.0 (2236df17) experimental/_attention.py 1157-1169, 1263-1276 "
                "(context_parallel clones the table whole, shards and clones the shard, resize_s in place); "
                "docs/framework-facts.md §67, §98" if version == "9dec370" else
                "not read at this version (its model's rope buffer and its CP buffers' handling): nothing charged"),
            "cp_compiled_waits_at_issue": (
                "9dec370 on torch 1963fc8, read at torch 2.6.0 (2236df17): torch/distributed/_functional_collectives.py "
                "807-820 (_maybe_wrap_tensor: while tracing, wait_tensor at once after the collective), "
                "torch/_inductor/config.py 265 (reorder_for_compute_comm_overlap = False), scheduler.py 1871-1884 "
                "(only reorder_for_peak_memory on); 9dec370 sets no inductor reordering (parallelize_llama.py 204: "
                "_micro_pipeline_tp only); inductor's code for 9dec370's compiled block on the 2.6.0 wheel "
                "(scripts/cp_ring_order.py): every all_gather_into_tensor and all_to_all_single waited on the next "
                "line, step 0's attention before the gather. Later versions (newer torch, its _context_parallel "
                "ring) not read: the eager overlap is kept" if version == "9dec370" else
                "not read at this version (newer torch and its _context_parallel ring): the eager ring's overlap is "
                "kept; read for 9dec370 only (docs/framework-facts.md §37)"),
            "cp_repeats_kv": ("torchtitan/models/llama/model.py 116-126 (repeat_kv: expand + reshape, a copy), 201-209 "
                              "(keys = repeat_kv(xk, n_rep), values likewise, then F.scaled_dot_product_attention), "
                              "torchtitan 9dec370; the same at bbb1b616 (model.py 151, 245-246) and 2c8b5947 "
                              "(models/llama3/model/model.py 98, 185-186); b5bcd76c passes enable_gqa instead "
                              "(models/common/attention.py 901)"),
            "expandable_segments": "run_llama_train.sh 22 (PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\"), 9dec370; "
                                   "run_train.sh 19, 2c8b5947; both one node (torchrun --nproc_per_node, rendezvous at localhost)",
            "expandable_segments_across_nodes": "multinode_trainer.slurm (srun torchrun --nnodes 4) sets no "
                                                "PYTORCH_CUDA_ALLOC_CONF at 9dec370, e7c0cae, 2c8b5947 or b5bcd76c",
            "megatron_step_replayed": "not Megatron-LM's step: FSDP2's (fsdp2_step_replayed)",
            "fsdp2_step_replayed": f"planner/cost/reserve_fsdp2.py replays FSDP2's streams as torch 2.6.0 (git 2236df17) "
                                   f"runs them: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py 68-89, 127-179, "
                                   f"220-229, 234-316, 371-383, _fsdp_param_group.py 271-307, 374-442, 469-500, "
                                   f"_fsdp_param.py 629-674 (the upcast and accumulation beside a pipeline), "
                                   f"pipelining/stage.py 636-652 (the stage's manual post-backward after its last "
                                   f"backward), torchtitan 9dec370 train.py 266-323 (docs/framework-facts.md §24); the "
                                   f"same structure at {TORCH_V} (_fsdp_collectives.py 325-370, 419, 597-612): one stage "
                                   f"and one microbatch under ZeRO 3, or beside 1F1B / GPipe / interleaved 1F1B with the "
                                   f"weights kept whole, a rank's chunks each its own FSDP2 root (planner/cost/"
                                   f"fsdp2_chunks.py: _fsdp_state.py 84, 190, _fsdp_param_group.py 52-81, "
                                   f"pipelining/schedules.py 1168-1266, stage.py 507-520, 703; torchtitan 9dec370 "
                                   f"train.py 154-163, torchtitan/optimizer.py 22-52); ZB, ZBV and DualPipeV keep the divisor",
            "step_replayed": f"not by reserve.py's replay of ckplan's step (fsdp2_step_replayed orders FSDP2's): FSDP2 allocates unsharded parameters and reduce-scatter inputs on its all-gather and reduce-scatter streams (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py FSDPCommContext), whose pools the replay does not run, {TORCH_V}",
            "keeps_last_reduce_scatter_input": (f"{RS_INPUT_KEPT}; {_TITAN_OLD} runs torch 1963fc8 (2024-12-23)"
                                                if version == "9dec370" else RS_INPUT_DROPPED),
            "input_grads_held_to_step_end": (f"{INPUT_GRADS_KEPT}; {_TITAN_TORCH[version]}" if version != "b5bcd76c"
                                             else f"{INPUT_GRADS_CLEARED}; b5bcd76c (2026-08-21) runs a torch after it"),
            "ddp_buckets": "not Megatron-LM's DDP (dataparallel.exposed_comm_ms charges its collectives)",
            "pipeline_schedules": ("torchtitan/distributed/pipeline_parallel.py get_schedule_class by name, any stages_per_rank >= 2 a multi-stage schedule takes (pipeline_parallel.py 219-263 at b5bcd76c); 9dec370 runs torch 1963fc8, whose DualPipeV was not read: left out (docs/framework-facts.md §251)"),
            "stage_sends_beside": "not read (branch p2pcheck): its pipeline sends stay in the passes", "multi_schedule_lockstep": (f"{MULTI_LOCKSTEP}; {_TITAN_OLD} runs torch 1963fc8" if version == "9dec370"
                                        else f"{TORCH_V}: interleaved schedules run on _PipelineScheduleRuntime "
                                             f"(schedules.py 2216, 2891), which waits a receive where it is needed"),
            "reduces_after_last_backward": (f"{REDUCES_AFTER_LAST_BACKWARD}; {_TITAN_OLD} runs torch 1963fc8"
                                            if version == "9dec370" else
                                            f"not read at {TORCH_V}, whose pipelining reduces in a REDUCE_GRAD action "
                                            f"(stage.py 1164-1191) and whose FSDP2 keeps several reduce-scatters in "
                                            f"flight: the reductions stay charged as hidden behind the backward"),
            "grads_allocated_at_first_backward": f"torch/distributed/fsdp/_fully_shard/_fsdp_param.py 802-820 (unsharded_accumulated_grad made in the first post-backward), _fsdp_param_group.py 605-611; torch/distributed/pipelining/stage.py 844-847, 1164-1177 (sync off until the last backward), {TORCH_V}",
            "grad_bytes": f"torchtitan/parallelisms/parallelize_llama.py 91, 320 (reduce_dtype fp32), {_TITAN_OLD}; "
                          f"torch/distributed/fsdp/_fully_shard/_fsdp_param.py 802-820 (unsharded_accumulated_grad "
                          f"in reduce_dtype under PP), {TORCH_V}",
            "shard_weight_bytes": f"torchtitan builds the model in fp32; FSDP2 MixedPrecisionPolicy(param_dtype=bf16) "
                                  f"casts when gathering, parallelize_llama.py 320, {_TITAN_OLD}",
            "master_bytes": "the fp32 sharded parameter is the master (no copy)",
            "zero1_whole_tensors": "torchtitan shards with FSDP2 only",
            "zero_as_fsdp2": f"parallelize_llama.py 324-339 (fully_shard every block; reshard_after_forward = not "
                             f"pp_enabled), {_TITAN_OLD}; torchtitan/distributed/fsdp.py 112-136, b5bcd76c; "
                             f"torch/distributed/pipelining/stage.py 844-847, {TORCH_V}",
            "adam_step_scratch": f"torchtitan/optimizer.py 132-138 (foreach unless --optimizer.fused), {_TITAN_OLD}; "
                                 f"torch/optim/adam.py 760-790, {TORCH_V}; fused AdamW by default since 6e498855 "
                                 f"(2025-02-24, config_manager.py --optimizer.implementation default \"fused\"; "
                                 f"bbb1b616 config_manager.py 240-243): torch._fused_adamw_ updates in place "
                                 f"(torch/optim/adam.py 802-877, {TORCH_V}), no scratch",
            "loss": f"train.py 131-138 cross_entropy(pred.float()), `del pred` before backward, {_TITAN_OLD}; "
                    f"the same and still not compiled at 54ef4222 (2025-03-12; torchtitan/train.py 324-331, "
                    f"components/loss.py 10-18, its compile commented out), the torchtitan 0.0.2 of torchao's H100 "
                    f"float8 benchmarks (torchao 8c81863b); {MEMTRACKER}: kept 2.00, peak 5.97",
            "loss_vocab_parallel": f"parallelize_llama.py 138-142 (loss_parallel), {_TITAN_OLD}; torch/distributed/"
                                   f"tensor/parallel/loss.py 197-222, {TORCH_V}; {MEMTRACKER}: kept 2.00, peak 7.97",
            "loss_compiled": f"train.py torch.compile(loss_fn) under training.compile, bbb1b616; "
                             f"torchtitan/components/loss.py 25-30, 2c8b5947; "
                             f"torchtitan/components/loss.py 242-252, b5bcd76c (none at {_TITAN_OLD}); "
                             f"inductor's generated code on CPU, torch 2.13 (scripts/compiled_loss.py): kept 1.00, "
                             f"peak 2.00 (the saved bf16 logits and their bf16 gradient)",
            "compiles_model": _TITAN_COMPILES[version],
            "runs_instead": "it compiles (compiles_model)",
            "tp_saves_gathered_input": f"parallelize_llama.py 117-191 (apply_tp), {_TITAN_OLD}; torch/distributed/"
                                       f"tensor/parallel/style.py 95-117 (redistribute to Replicate), {TORCH_V}",
            **TORCH_PIPELINING_SOURCES, "batch_held": _TITAN_BATCH[version], "batch_positions": _TITAN_POSITIONS[version],
            "outputs_held_to_step_end": _TITAN_OUTPUTS[version][1],
            "logits_held_in_backward": ("torchtitan/train.py forward_backward_step: without PP `del pred` (\"need to free "
                                        "pred before bwd to avoid peaking memory\") before `loss.backward()`; with PP "
                                        "torch's pipelining holds the stage output (torch/distributed/pipelining/stage.py "
                                        f"961-991, {TORCH_V})"),
            "chunked_loss": ("torchtitan/components/loss.py 567-836 (ChunkedLossWrapper, GradAccumulator), trainer.py "
                             "510-535 (_skip_lm_head), models/common/decoder.py 245, b5bcd76c (pip 0.3.0)"
                             if version == "b5bcd76c" else f"no ChunkedLossWrapper read at {version}"),
            "recompute_whole_forward": _TITAN_EARLY_STOP[version],
            "overlaps_grad_reduce": f"FSDP2 reduce-scatter on its own stream, {TORCH_V}",
            "prefetches_zero3_gathers": f"FSDP2 implicit forward / backward prefetch, {TORCH_V}",
            "tp_overlap": f"--experimental.enable_async_tensor_parallel (torch._inductor micro-pipeline TP), {read_at}; "
                          f"what it fuses: torch/_inductor/fx_passes/micro_pipeline_tp.py 782-910, 957-1175, how the "
                          f"fused op runs: torch/distributed/_symmetric_memory/__init__.py 146-294, 325-440, 1254-1320, "
                          f"torch 2.13.0 (planner/cost/asynctp.py)",
            "float8": f"torchtitan/float8.py Float8Handler (every nn.Linear but `output`), {_TITAN_OLD}; "
                      f"torchtitan/components/quantization/float8.py, utils.py module_filter_fn, e7c0cae; "
                      f"torchao/float8/float8_linear.py 61-200 (three float8 GEMMs), {TORCHAO_V}",
            "float8_memory": f"torchao/float8/float8_linear.py 77 (save_for_backward(input_hp, weight_hp_t)), 330-358 "
                             f"(the weight cast before it: the saved weight is float8), {TORCHAO_V}",
            "cublas_workspace_bytes": "not sourced",
            "float8_saves_input": ("torchao/float8/float8_linear.py 46-51 (manual_float8_matmul_with_args_in_float8 "
                                   "saves input_fp8), 355-390 (Float8Linear.forward casts the input first), torchao "
                                   "eab345c (the benchmarks' of 2024-12-23)" if version == "9dec370" else
                                   f"torchao/float8/float8_linear.py 61-78 (matmul_with_hp_or_float8_args saves "
                                   f"input_hp, the bf16 input, and casts it again in the backward), {TORCHAO_V}"),
            "tp_gathers_float8": ("torchao/float8/float8_tensor_parallel.py 49-60, 210-217 (Float8ColwiseParallel, "
                                  "PrepareFloat8ModuleInput: hp_tensor_to_float8_dynamic, then redistribute to "
                                  "Replicate), float8_linear.py 51 (manual_float8_matmul_with_args_in_float8 saves "
                                  "input_fp8), torchao eab345c (the benchmarks' of 2024-12-23)"
                                  if version == "9dec370" else
                                  f"torchao/float8/float8_tensor_parallel.py 60-69, 232-239 (the cast before the "
                                  f"redistribute), {TORCHAO_V}"),
            "async_tp_workspace": f"parallelize_llama.py 201-205 (enable_symm_mem_for_group on the TP group, "
                                  f"inductor's _micro_pipeline_tp), {_TITAN_OLD}; torch/distributed/_symmetric_memory/"
                                  f"__init__.py 99-137 (one workspace a group, _SymmetricMemory.empty_strided_p2p), "
                                  f"172-175 (an all-gather's shard), 336-337 (two of a reduce-scatter's row chunks), "
                                  f"torch 2.6.0 (git 2236df17); the same at {TORCH_V} (96-131, 170-173, 344-345); "
                                  f"mapped by cuMemCreate outside the caching allocator (torch/csrc/distributed/c10d/"
                                  f"CUDASymmetricMemory.cu, pytorch 07506d39)",
            **AFTER_STEP_NOT_READ,
            "nccl_version": ("torch 1963fc8's NCCL as torch 2.6.0 pins it (nvidia-nccl-cu12 2.21.5: framework-facts "
                             "§141, §148)" if version == "9dec370" else
                             "not read at this version: NCCL v2.27.7-1's tuning tables, the newest read"),
            "loss_requests_eager_ce": ("torchtitan/train.py 9dec370: loss_fn = cross_entropy(pred.flatten(0, 1).float(), "
                                       "labels.flatten(0, 1)), eager, under loss_parallel with TP; its requests as "
                                       "torch/distributed/tensor/parallel/loss.py and derivatives.yaml make them "
                                       "(framework-facts §71)" if version == "9dec370" else
                                       "not played as eager cross-entropy's requests: a compiled or chunked loss, or a "
                                       "version whose loss requests were not read"),
            "final_norm_eager_fp32": (
                "torchtitan/models/norms.py build_norm, RMSNorm.forward (`self._norm(x.float()).type_as(x) * "
                "self.weight`), models/llama/model.py 35, 374-376, 444 (norm_type \"rmsnorm\" the default; "
                "config_manager.py 174-177 --model.norm_type default \"rmsnorm\"; train_configs/llama3_405b.toml "
                "norm_type = \"rmsnorm\"), parallelisms/parallelize_llama.py 297-306 (apply_compile: each "
                "TransformerBlock, not the final norm), 9dec370; torch 2.6 derivatives.yaml for the ops' saved "
                "tensors (docs/framework-facts.md §205)" if version == "9dec370" else
                "not read at this version: torch's nn.RMSNorm (2c8b5947 models/llama3/model/model.py 350) or "
                "b5bcd76c's models/common RMSNorm, whose eager tensors depend on the torch it ran: the analytic "
                "head's fused norm"),
            "head_reduce_scatter_cat": (
                "parallelisms/parallelize_llama.py 137-142 (\"output\": ColwiseParallel(input_layouts=Shard(1))), "
                "297-306 (apply_compile: each TransformerBlock, not the head), 9dec370; torch 2.6.0 distributed/tensor/"
                "_redistribute.py 321-363, placement_types.py 183-212, _functional_collectives.py 252-291 (the cat on "
                "scatter_dim 1) (docs/framework-facts.md §219-§221)" if version == "9dec370" else
                "not read at this version: the analytic head's input gradient and its shard"),
            "step_shard_bytes": "gradient clipping's foreach norm and multiply (12 B), torch/nn/utils/clip_grad.py 95, "
                                f"173, {TORCH_V}; torchtitan/utils.py 348-404, train.py 311-316, {_TITAN_OLD}"
                                + ("; foreach AdamW's 52 B beyond the fused step (optimizer.py 132-138; torch/optim/"
                                   f"adam.py 691-724, 770-799, {TORCH_V})" if version == "9dec370" else
                                   "; AdamW fused by default (b5bcd76c torchtitan/components/optimizer/optimizer.py "
                                   "110-111): the profile's step"),
            **MODEL_CODE_KERNELS,
            "ties_across_stages": (
                "torchtitan/models/common/decoder.py 168-171 (update_from_config: enable_weight_tying with "
                "pipeline_parallel_degree > 1 raises NotImplementedError), b5bcd76c (docs/framework-facts.md §248)"
                if version == "b5bcd76c" else
                "no model of this version ties (torchtitan/models/llama/model.py: tok_embeddings and output two "
                "parameters; enable_weight_tying came later), and its pipeline split deep-copies the model a stage "
                "(9dec370 parallelisms/pipeline_llama.py 75-92, bbb1b616 models/llama/pipeline_llama.py 104-127, "
                "2c8b5947 distributed/pipeline_parallel.py 279-310) with no sum of a shared parameter's gradients "
                "(docs/framework-facts.md §305)"),
            "accumulated_batch": _TITAN_ACCUMULATED[version][1],
            "accumulates_without_pipeline": (
                "9dec370 train.py 253-323, bbb1b616 torchtitan/train.py 311-370: train_step takes one batch, one "
                "forward and backward, the optimizer step (gradient accumulation came in 8570415c, #1238)"
                if version in ("9dec370", "bbb1b616") else
                "torchtitan/train.py train_step: zero_grad once, a forward and backward a microbatch over "
                "gradient_accumulation_steps, one optimizer step (8570415c, #1238; 2c8b5947 198-218, 457-490)"),
        })
