"""The memory settings Megatron-Bridge 25.11's LLaMA recipes run under Megatron-LM (issue 33), each a fact of
the runtime record (planner/cost/runtime_facts.py), read where the setup asks for it:

- bf16 gradient reduction (TrainingSetup.grad_reduce_bf16, Megatron-LM's --grad-reduce-in-bf16): the DDP
  gradient buffer (main_grad) in bf16, `bf16_grad_bytes` a parameter where fp32 is 4; the reduce-scatter moves
  those bytes (dataparallel reads the record's grad_bytes, which `with_settings` replaces); the distributed
  optimizer's step then sets each fp32 main parameter's .grad to an fp32 copy of its shard
  (`bf16_grad_step_copy_bytes` / K a parameter, the step's scratch: step_grad_copy_bytes), freed at the next
  step's zero_grad. The fp32 main parameters and the two fp32 moments are as without it.
- FP8 primary weights (TrainingSetup.fp8_all_gather under Transformer Engine, Megatron-LM's --fp8-param-gather):
  each Float8 linear's weight a TE Float8Tensor, 1 B (`fp8_param_bytes`) in a uint8 parameter buffer, gathered so
  (dataparallel.gathered_bytes at 1 B), beside it on Hopper its transpose (`fp8_param_transpose_bytes`), made by
  the first forward for the backward's GEMMs and kept on the parameter; Blackwell's FP8 GEMMs take the one copy
  in either layout. The fp32 main parameter of the shard stays. What a rank holds whole (ZeRO 0/1) is charged
  here against the bf16 weight bytes_per_param charges (fp8_param_saving_bytes).
- Transformer Engine's fused cross-entropy (TrainingSetup.te_cross_entropy, Megatron-LM's
  --cross-entropy-loss-fusion --cross-entropy-fusion-impl te): the loss region the record's `te_cross_entropy`
  says (the gradient written in place into the logits: kept and peak 1x the logits, the logits the loss's own
  saved tensor, held to the end of the output layer's backward: rules.loss_holds_logits).

Each is refused in one sentence under a runtime whose record does not read it (refused).
"""

from __future__ import annotations

from dataclasses import replace

_MCORE_BRIDGE = "megatron-core 92c8482e"
_TE_BRIDGE = "TransformerEngine v2.9"
BRIDGE_SETTINGS_SOURCES = {
    "bf16_grad_bytes": f"megatron/core/distributed/distributed_data_parallel.py 168 (grad_dtype = torch.float if "
                       f"grad_reduce_in_fp32 else param.dtype: bf16, a Float8Tensor's nominal dtype too), "
                       f"param_and_grad_buffer.py 753-757 (grad_data in grad_dtype, main_grad views of it), "
                       f"{_MCORE_BRIDGE}; --grad-reduce-in-bf16 sets grad_reduce_in_fp32 False",
    "bf16_grad_step_copy_bytes": f"megatron/core/optimizer/distrib_optimizer.py 2399 (ZeRO 1; without the distributed optimizer optimizer.py 755, the whole gradients) (_copy_model_grads_to_main_grads: "
                                 f"shard_main_param.grad = shard_model_grad.float(), a new fp32 tensor where the "
                                 f"buffer is bf16, a view where it is fp32), freed by zero_grad(set_to_none) at the "
                                 f"next train_step's start (megatron/training/training.py 1362-1364), {_MCORE_BRIDGE}",
    "fp8_param_bytes": f"megatron/core/distributed/distributed_data_parallel.py 159-167 (a Float8Tensor parameter's "
                       f"buffer is torch.uint8), param_and_grad_buffer.py 745-750, 772-774 (param_data of that dtype, "
                       f"the parameter's storage moved into it); the fp32 main parameter of its shard as for bf16 "
                       f"(distrib_optimizer.py 381-396), {_MCORE_BRIDGE}",
    "fp8_param_transpose_bytes": f"transformer_engine/pytorch/module/linear.py 240-263, 392-395 (the weight's "
                                 f"columnwise usage for the dgrad GEMM), module/base.py 1370-1380 (a quantized "
                                 f"parameter is used as it is, no workspace), tensor/storage/float8_tensor_storage.py "
                                 f"191-229 (update_usage: columnwise creates _transpose, kept on the tensor, unless "
                                 f"is_non_tn_fp8_gemm_supported), utils.py 490-496 (non-TN FP8 GEMMs on sm 10.x, "
                                 f"11.x, 13+: Blackwell, not Hopper), {_TE_BRIDGE}; megatron/core/fp8_utils.py 499-510 "
                                 f"(no post_all_gather_processing in TE 2.9: the transpose made in the next forward), "
                                 f"{_MCORE_BRIDGE}",
    "te_weight_workspace_bytes": f"transformer_engine/pytorch/module/linear.py 240-263 (get_weight_workspace with "
                                 f"cache_name \"weight\" where is_first_microbatch is given), module/base.py "
                                 f"1333-1430 (the workspace kept in the module's _fp8_workspaces), csrc/quantizer.cpp "
                                 f"120-137 (delayed scaling), 325-340 (current: data 1 B where row-wise or non-TN, a "
                                 f"transpose 1 B where column-wise on Hopper), {_TE_BRIDGE}; megatron/core/extensions/transformer_engine.py "
                                 f"429-432 (is_first_microbatch passed), {_MCORE_BRIDGE}",
    "te_float8_saved_inputs": f"transformer_engine/pytorch/module/layernorm_linear.py 186-190 (the norm's output "
                              f"quantized, column-wise usage for the wgrad), 398-458 (saved: inputmat, the FP8 "
                              f"ln_out, row-wise kept where sequence parallelism gathers it again in the backward, "
                              f"mu, rsigma), module/linear.py 360-429 (the FP8 input saved column-wise only, a "
                              f"row-parallel linear's), csrc/quantizer.cpp 120-137 (delayed scaling), 325-340 "
                              f"(current; the column-wise copy a transpose on Hopper, the data itself on "
                              f"Blackwell), {_TE_BRIDGE}; the attention's output stays "
                              f"saved in bf16 by the attention beside linear_proj's FP8 copy",
    "fused_swiglu_saves_input_only": f"megatron/core/transformer/mlp.py 156-196 (bias_activation_fusion: "
                                     f"bias_swiglu_impl), fusions/fused_bias_swiglu.py 150-169 (SwiGLUFunction saves "
                                     f"its input alone, swiglu_back recomputes SiLU), megatron/training/arguments.py "
                                     f"1337, 2297-2300 (on unless --no-bias-swiglu-fusion), {_MCORE_BRIDGE}; "
                                     f"Megatron-Bridge 00b7660b src/megatron/bridge/models/llama/llama_provider.py 52 "
                                     f"(bias_activation_fusion True)",
    "te_cross_entropy": f"megatron/core/models/common/language_module/language_module.py 141-161 "
                        f"(te_parallel_cross_entropy on the vocab-parallel logits as they are), extensions/"
                        f"transformer_engine.py 2093-2106, {_MCORE_BRIDGE}; transformer_engine/pytorch/"
                        f"cross_entropy.py 50-59 (saves its input), 76 (backward returns it), triton/"
                        f"cross_entropy.py 266-342 (fp32 loss and three fp32 statistics a token; the kernel stores "
                        f"the gradient into the logits, 187), 345-372 (scaled in place), {_TE_BRIDGE}: kept and peak "
                        f"the logits, 1x and 1x, by the code; the logits are the loss's saved tensor and the output "
                        f"layer's received gradient (gpt_model.py 637, 666; tensor_parallel/layers.py 497-630, "
                        f"{_MCORE_BRIDGE}: ColumnParallelLinear's backward reads grad_output, makes grad_input), freed "
                        f"when that backward ends (grad_in_logits)",
}
BRIDGE_SETTINGS_NOT_READ = {name: "not read for this runtime: the setting is refused" for name in BRIDGE_SETTINGS_SOURCES}



# Hopper (compute capability 9.0), whose FP8 GEMMs take only the TN layout: TE's is_non_tn_fp8_gemm_supported
# (transformer_engine/pytorch/utils.py 490-496, TE v2.9) is true on sm 10.x, 11.x and 13+ (Blackwell) only.
# ckplan's GPU records (planner/models/gpus.py) of that architecture:
TN_ONLY_GPUS = ("h100-sxm", "h100-pcie", "h100-96g", "h200", "gh200", "gh200-144g")


def with_settings(record, *, grad_reduce_bf16: bool):
    """The record as the setup's settings change what it holds: under grad_reduce_bf16 its gradient buffer
    at bf16_grad_bytes (read by dataparallel.param_bytes, so by the static bytes and the reduce-scatter)."""
    if grad_reduce_bf16 and record.bf16_grad_bytes:
        return replace(record, grad_bytes=record.bf16_grad_bytes)
    return record


def refused(training, record) -> list[str]:
    """One sentence for each of these settings the runtime's record does not read."""
    found = []
    if getattr(training, "grad_reduce_bf16", False) and not record.bf16_grad_bytes:
        found.append(f"gradients reduced in bf16 (Megatron-LM's --grad-reduce-in-bf16) are read for --runtime megatron "
                     f"only; {record.name}'s gradient dtype is its record's: drop it or choose --runtime megatron")
    if getattr(training, "te_cross_entropy", False) and record.te_cross_entropy is None:
        found.append(f"Transformer Engine's fused cross-entropy is read for --runtime megatron only; "
                     f"{record.name}'s loss is its record's: drop it or choose --runtime megatron")
    if getattr(training, "fused_cross_entropy", False):
        if record.fused_cross_entropy is None:
            found.append(f"Megatron-LM's own fused cross-entropy is read for --runtime megatron only; {record.name}'s "
                         f"loss is its record's: drop it or choose --runtime megatron")
        elif getattr(training, "te_cross_entropy", False):
            found.append("the loss is either Megatron-LM's own fused cross-entropy or Transformer Engine's "
                         "(--cross-entropy-fusion-impl native or te): give one")
    if getattr(training, "te_grouped_gemm", False) and not record.te_grouped_gemm_workspaces:
        found.append(f"Transformer Engine's grouped GEMM over the experts is read for --runtime megatron only; "
                     f"{record.name}'s experts run its own code: drop it or choose --runtime megatron")
    elif getattr(training, "te_grouped_gemm", False) and getattr(training, "local_layers", False):
        found.append("--te-grouped-gemm is Transformer Engine's grouped GEMM and --local-layers runs Megatron-core's "
                     "own layers, which have none (their experts' GEMMs make no TE workspace): give one")
    return found
