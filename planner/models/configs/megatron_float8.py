"""Megatron-LM's FP8 flags (--fp8-format, --fp8-recipe and delayed scaling's settings), read into Job.modelled.float8.

--fp8-format e4m3|hybrid with --fp8-recipe delayed (the default) or tensorwise
(megatron/core/transformer/transformer_config.py 587-600 at d98e8a64ddf3): Transformer Engine's layers run their
GEMMs in FP8, timed as Float8 (--float8; the runtime record's Transformer Engine facts say what they keep:
planner/cost/te_kept.py). mxfp8, blockwise and custom recipes stay listed; --fp8-param-gather is read after
(megatron_memflags.py).

The casts are charged as tensorwise current scaling's (planner/profiler/float8.py, te_moe_float8.py): an amax pass
over each bf16 input, then the cast (TE v2.9 quantizer.cpp 497-536, Float8CurrentScalingQuantizer). Delayed
scaling is not modelled, and said so (docs/framework-facts.md §196): TE v2.9's Float8Quantizer::quantize
(quantizer.cpp 276-288) casts with the scale its amax history gave and writes the amax from the same kernel
(nvte_quantize_v2, no amax pass: 3 B an element from bf16, not 5 B), and at the outermost fp8_autocast's exit
(quantization.py 590-600) and the first module's backward end (layernorm_linear.py 1002, grouped_linear.py 484)
reduce_and_update_fp8_tensors concatenates the amaxes, all-reduces them (MAX over the amax group, recipe.reduce_amax)
and runs fused_amax_and_scale_update_after_reduction (quantization.py 487-537): none of which is charged."""

from __future__ import annotations

from planner.models.configs import Job
from planner.models.configs.megatron_args import Flags

DELAYED = ("delayed scaling (TE v2.9 Float8Quantizer) is not modelled: its casts are charged as tensorwise current "
           "scaling's (an amax pass, then the cast: 5 B an element, where delayed's cast writes its amax as it "
           "casts, 3 B), and its amax all-reduces and history and scale updates at each autocast exit and backward "
           "are not charged (docs/framework-facts.md §196)")


def read_float8(flags: Flags, job: Job) -> None:
    """The FP8 flags (the module docstring): float8 modelled for the two recipes read; delayed said as not
    modelled, where given and where it is the default."""
    recipe = flags.given.get("--fp8-recipe", ["delayed"])
    if flags.given.get("--fp8-format") not in (["hybrid"], ["e4m3"]) or recipe not in (["delayed"], ["tensorwise"]):
        return
    flags.take("--fp8-format", "FP8 GEMMs through Transformer Engine: the blocks' linears timed in FP8 (--float8); "
               "their inputs kept as TE saves them, their weights' FP8 copies charged (planner/cost/te_kept.py)")
    if "--fp8-recipe" not in flags.given:
        job.notes.append(f"--fp8-recipe not given: Megatron-LM's default, delayed; {DELAYED}")
    elif recipe == ["delayed"]:
        flags.take("--fp8-recipe", "")
        flags.sink[-1] = (*flags.sink[-1][:2], "not modelled", DELAYED)
    else:
        flags.take("--fp8-recipe", "tensorwise current scaling: each cast's amax and scale charged with the cast, and "
                   "the amaxes' all-reduce over the TP group under sequence parallelism (--fp8-current-scaling)")
    for flag in ("--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin"):
        flags.take(flag, "delayed scaling's amax history and margin: numerics, no bytes or time of their own")
    job.modelled.float8, job.modelled.fp8_current_scaling = True, recipe == ["tensorwise"]
