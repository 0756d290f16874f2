"""Megatron-LM's memory settings the Megatron-Bridge 25.11 recipes set, for the reader in megatron.py: each
flag read as megatron/training/arguments.py defines it at megatron-core 92c8482e (Megatron-Bridge 00b7660b's
3rdparty/Megatron-LM) and modelled through the runtime record's facts (planner/cost/bridgesettings.py):

- --grad-reduce-in-bf16 (2671; with --bf16 it sets accumulate_allreduce_grads_in_fp32 False, 768-769): the
  gradient buffer and its reduction in bf16 (Job.modelled.grad_reduce_bf16);
- --fp8-param-gather (1424; kw_args fp8_param, 1333) with Transformer Engine's Float8 (--fp8-format): the Float8
  linears' weights kept and gathered in FP8 (Job.modelled.fp8_all_gather, the setup's fp8_all_gather);
- --cross-entropy-loss-fusion (2314) with --cross-entropy-fusion-impl te (2317; default native): Transformer
  Engine's fused cross-entropy (Job.modelled.te_cross_entropy). Megatron-LM's own training script refuses it
  since 168cb15d (2026-06-03; arguments.py 1697-1702 at d98e8a64, "stability issues"); megatron-core and the
  Megatron-Bridge recipes still run it (model_parallel_config.py 536-543 warns), so it stays read;
- --cross-entropy-loss-fusion alone (the native implementation): Megatron-LM's own cross-entropy in
  torch.compile'd steps (megatron/core/fusions/fused_cross_entropy.py; Job.modelled.fused_cross_entropy);
- --moe-grouped-gemm with --transformer-impl transformer_engine and experts: TE's grouped GEMM over them
  (TEGroupedMLP, or the op fuser's GroupedLinear), whose four workspaces stay allocated
  (Job.modelled.te_grouped_gemm); on the local layers or without experts it changes nothing ckplan charges.
"""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags


def read_memory_settings(flags: Flags, job, *, te_layers: bool = True) -> None:
    """Take the flags above where the job's other settings let them apply (the rest stay for megatron._rest)."""
    modelled = job.modelled
    if flags.has("--grad-reduce-in-bf16") and job.precision == "bf16-mixed":
        modelled.grad_reduce_bf16 = bool(flags.take(
            "--grad-reduce-in-bf16", "the gradient buffer (main_grad) and its reduce-scatter in bf16: 2 B a parameter, "
            "the step's fp32 copy of the rank's shard (the Megatron record's bf16_grad_bytes, "
            "bf16_grad_step_copy_bytes)", bool, False))
    if flags.has("--fp8-param-gather") and modelled.float8:
        modelled.fp8_all_gather = bool(flags.take(
            "--fp8-param-gather", "the Float8 linears' weights kept as Transformer Engine Float8Tensors, 1 B (and "
            "their transpose on Hopper), and gathered in FP8 (the record's fp8_param_bytes, "
            "fp8_param_transpose_bytes)", bool, False))
    if flags.has("--cross-entropy-loss-fusion") and flags.given.get("--cross-entropy-fusion-impl") == ["te"]:
        flags.take("--cross-entropy-loss-fusion", "the loss fused", bool)
        flags.take("--cross-entropy-fusion-impl", "Transformer Engine's fused cross-entropy: the gradient written "
                   "into the logits, kept and peak 1x the logits (the record's te_cross_entropy)")
        modelled.te_cross_entropy = True
        flags.notes.append("--cross-entropy-fusion-impl te: Megatron-LM's own training script refuses it since 168cb15d "
                           "(arguments.py 1697-1702 at d98e8a64, \"stability issues\"); megatron-core and Megatron-Bridge "
                           "run it, and it is scored as they do")
    elif flags.has("--cross-entropy-loss-fusion"):
        impl = flags.take("--cross-entropy-fusion-impl", "the native fused cross-entropy", str, "native")
        if impl != "native":
            raise UserError(f"--cross-entropy-fusion-impl {impl}: Megatron-LM's choices are native and te")
        flags.take("--cross-entropy-loss-fusion", "Megatron-LM's own cross-entropy in torch.compile'd steps: the fp32 "
                   "softmax kept (2x the logits), at its backward's peak 5x (a second fp32 copy and the bf16 "
                   "gradient; the record's fused_cross_entropy), 40 B a logit moved (fused_ce_bytes)", bool)
        modelled.fused_cross_entropy = True
    else:
        flags.take("--cross-entropy-loss-fusion", "the loss fused", bool)  # given false: recorded off
    if "--cross-entropy-fusion-impl" in flags.given:
        flags.take("--cross-entropy-fusion-impl", "the fused cross-entropy's implementation")
        flags.sink[-1] = (*flags.sink[-1][:2], "no effect", "without --cross-entropy-loss-fusion Megatron-LM runs its "
                          "unfused vocab-parallel cross-entropy (language_module.py 166-167)")
    if flags.has("--moe-grouped-gemm"):
        grouped = te_layers and job.arch.num_experts > 0
        flags.take("--moe-grouped-gemm", "Transformer Engine's grouped GEMM over the experts: four more cuBLAS "
                   "workspaces kept from its first call (the record's te_grouped_gemm_workspaces)" if grouped else
                   "one grouped GEMM over the experts (no experts, or not Transformer Engine's: nothing charged)", bool)
        modelled.te_grouped_gemm = grouped
