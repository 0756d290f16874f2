"""What each key of a torchtitan job a reader above did not take does (torchtitan.py's `_rest`): no effect on memory
or time, not modelled (it changes them and the prediction leaves it out), or unknown — each with its reason, read
at the torchtitan versions torchtitan.py names."""

from __future__ import annotations

# whole sections that change neither memory nor time
NO_EFFECT_SECTIONS = {"job": "job name and output folder", "profiling": "profiler traces", "metrics": "logging",
                      "checkpoint": "checkpoints (written between steps)", "validation": "evaluation",
                      "lr_scheduler": "learning-rate schedule", "comm": "timeouts and traces",
                      "debug": "seeds and determinism", "experimental": "custom imports",
                      "fault_tolerance": "fault tolerance", "memory_estimation": "torchtitan's own estimate",
                      # Trainer.Config's fields in 0.3.0 and main (trainer.py at b5bcd76c)
                      "profiler": "profiler traces", "dataloader": "data loading", "validator": "evaluation",
                      "hf_assets_path": "tokenizer and weights path", "tokenizer": "tokenizer"}
NO_EFFECT = {
    "model.hf_assets_path": "tokenizer and weights path", "model.tokenizer_path": "tokenizer path",
    "model.print_after_conversion": "logging",
    "optimizer.lr": "learning rate", "optimizer.eps": "Adam epsilon",
    "optimizer.weight_decay": "weight decay", "optimizer.beta1": "Adam beta", "optimizer.beta2": "Adam beta",
    "training.max_norm": "gradient clipping threshold", "training.steps": "run length", "training.dataset": "data",
    "training.dataset_path": "data path", "training.gc_freq": "Python garbage collection schedule",
    "training.gc_debug": "garbage collection debugging", "training.mixed_precision_reduce": "fp32 reductions (the "
    "only choice; the gradients' fp32 is the cost model's)", "training.seed": "random seed",
    "compile.backend": "compiler backend", "activation_checkpoint.preserve_rng_state": "RNG state kept for recompute",
    "activation_checkpoint.determinism_check": "recompute check", "activation_checkpoint.debug": "logging",
    "activation_checkpoint.early_stop": "recompute stops after the last saved tensor (the cost model's recompute)",
    "parallelism.pipeline_parallel_expert_parallel_overlap": "overlap of expert all-to-all with the pipeline",
    "parallelism.expert_parallel_comm_backend": "all-to-all kernels",
    "quantize.linear.float8.filter_fqns": "modules left in bf16 (with Float8)",
    "quantize.linear.float8.recipe_name": "Float8 scaling recipe",
    "quantize.linear.float8.emulate": "Float8 emulation (tests)",
    "activation_checkpoint.visualize_memory_budget_pareto": "an SVG of the memory-budget trade-off (debugging)",
}
NOT_MODELLED = {
    "training.enable_cpu_offload": "weights, gradients and optimizer state on the host (FSDP2 CPUOffloadPolicy)",
    "optimizer.early_step_in_backward": "each parameter stepped during the backward (its gradient freed at once)",
    "parallelism.disable_loss_parallel": "the loss computed on gathered logits rather than vocab-parallel",
    "parallelism.fsdp_reshard_after_forward": "FSDP2 resharding other than torchtitan's default",
    "parallelism.pipeline_parallel_schedule_csv": "a schedule from a CSV file",
    # model_registry's keyword arguments at b5bcd76c (models/deepseek_v3/__init__.py, common/config_utils.py 68)
    "model.moe_comm_backend": "the experts' token exchange kernel (DeepEP's HybridEP, minimal async EP): timed as "
                              "NCCL's all-to-all",
    "model.non_blocking_capacity_factor": "HybridEP's token buffer capacity (distributed/deepep/hybridep.py): its "
                                          "buffers not charged",
    "model.tp_gemm_backend": "TP matmuls fused with their collectives (dist_gemm): timed as the matmul and the "
                             "collective apart",
    "activation_checkpoint.memory_budget": "torch.compile's memory-budget recompute",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": "op-level recompute of named matmuls",
    "training.dataloader.pin_memory": "pinned host buffers (host memory only)",
    "optimizer.implementation": "the optimizer's kernels: the step is timed as the version's default (fused from "
                                "bbb1b616; planner/cost/runtimes.py step_shard_bytes)",
    "optimizer.fused": "the optimizer's kernels: the step is timed as 9dec370's default (foreach; planner/cost/"
                       "runtimes.py step_shard_bytes)",
}


def key_status(key: str, value) -> tuple[str, str]:
    """(status, what) of a key no reader above took."""
    section = key.split(".", 1)[0]
    if key == "parallelism.fsdp_reshard_after_forward" and value == "default":
        return "modelled", ("torchtitan's default: resharded after forward without a pipeline, kept whole with one "
                            "(as the cost model's torchtitan runtime)")
    if key == "training.disable_cuda_graphs":  # since f84224af0 (planner/emit/titan_keys.py graphs_line)
        return ("no effect", "CUDA graphs off, as ckplan scores the step") if value is True else (
            "not modelled", "CUDA graph capture of the step (0.3.0 and main by default): its private memory pool, "
                            "and gradients zeroed in place rather than freed; refused with a pipeline")
    if key == "parallelism.enable_fsdp_symm_mem":  # 0.3.0, main: FSDP2's collectives on symmetric memory
        return ("no effect", "off") if value is False else (
            "not modelled", "FSDP2's collectives on symmetric memory (its buffers outside the caching allocator)")
    if key == "parallelism.spmd_backend":  # spmd_types the default since 5ab3a0fd1 (0.3.0, main)
        return "not modelled", "the SPMD layer's own overheads (spmd_types or DTensor): scored as the collectives alone"
    if (key, value) in (("model.moe_comm_backend", "standard"), ("model.tp_gemm_backend", "default")):
        return "no effect", "torchtitan's default (b5bcd76c): NCCL's all-to-all, matmul and collective apart"
    if key == "model.norm_type":  # 9dec370 norms.py build_norm; the blocks' norms run compiled
        return ("modelled", "torchtitan's RMSNorm: the final norm's eager fp32 tensors where the version's record reads "
                            "them (9dec370: planner/cost/eager_norm.py)") if value == "rmsnorm" else (
            "not modelled", f"{value}: scored as torchtitan's RMSNorm (at 9dec370 the final norm's eager fp32 tensors; "
                            "fused_rmsnorm's Triton kernel saves the bf16 input, the weight and 1/rms instead)")
    if key == "model.attn_backend":
        return "not modelled", ("the attention kernel (FlexAttention, varlen): timed as SDPA's flash kernel; "
                                "0.3.0 and main run flex unless told")
    if section == "fault_tolerance" and key != "fault_tolerance.enable" and not key.endswith("timeout_ms") \
            and value not in (False, None):
        # torchft (0.3.0 experiments/torchft/manager.py 196-223): the semi-sync methods' outer SGD (momentum 0.9,
        # nesterov: a buffer the size of the parameters) and torchft's copy of the parameters, its replica groups
        return "not modelled", ("torchft's fault tolerance: DiLoCo's or LocalSGD's outer optimizer and parameter "
                                "backup, and its replica groups, are not charged")
    if key == "fault_tolerance.enable":
        return ("no effect", "off") if value is False else (
            "not modelled", "torchft's fault tolerance (replica groups managed by its lighthouse): scored as the "
                            "job's own data parallelism")
    if section == "python":
        return "unknown", "a statement this reader does not follow: if it changes the job, the prediction leaves it out"
    if key in NOT_MODELLED:
        return "not modelled", NOT_MODELLED[key]
    if key in NO_EFFECT or key.startswith("training.dataloader."):
        return "no effect", NO_EFFECT.get(key, "data loading")
    if section in NO_EFFECT_SECTIONS:
        return "no effect", NO_EFFECT_SECTIONS[section]
    return "unknown", "not a key this reader knows: if it changes memory or time, the prediction leaves it out"
