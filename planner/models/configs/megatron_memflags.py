"""Megatron-LM's memory settings the Megatron-Bridge 25.11 recipes set, for the reader in megatron.py: each
flag read as megatron/training/arguments.py defines it at megatron-core 92c8482e (Megatron-Bridge 00b7660b's
3rdparty/Megatron-LM) and modelled through the runtime record's facts (planner/cost/bridgesettings.py):

- --grad-reduce-in-bf16 (2671; with --bf16 it sets accumulate_allreduce_grads_in_fp32 False, 768-769): the
  gradient buffer and its reduction in bf16 (Job.modelled.grad_reduce_bf16);
- --fp8-param-gather (1424; kw_args fp8_param, 1333) with Transformer Engine's Float8 (--fp8-format): the Float8
  linears' weights kept and gathered in FP8 (Job.modelled.fp8_all_gather, the setup's fp8_all_gather);
- --cross-entropy-loss-fusion (2314) with --cross-entropy-fusion-impl te (2317; default native): Transformer
  Engine's fused cross-entropy (Job.modelled.te_cross_entropy). The native fusion stays listed as not modelled.
"""

from __future__ import annotations

from planner.models.configs.megatron_args import Flags


def read_memory_settings(flags: Flags, job) -> None:
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
