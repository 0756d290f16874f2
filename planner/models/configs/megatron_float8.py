"""Megatron-LM's FP8 flags (--fp8-format, --fp8-recipe and delayed scaling's settings), read into Job.modelled.float8.

--fp8-format e4m3|hybrid with --fp8-recipe delayed (the default) or tensorwise
(megatron/core/transformer/transformer_config.py 587-650 at d98e8a64): Transformer Engine's layers run their
GEMMs in FP8, timed as Float8 (--float8; the runtime record's Transformer Engine facts say what they keep:
planner/cost/te_kept.py). mxfp8, blockwise and custom recipes stay listed; --fp8-param-gather is read after
(megatron_memflags.py).

tensorwise is TE's current scaling (--fp8-current-scaling: an amax pass before each cast, the amaxes all-reduced over
TP under sequence parallelism). delayed is TE's DelayedScaling (--fp8-delayed-scaling, planner/cost/te_delayed.py;
docs/framework-facts.md §235-§242): Megatron builds it from --fp8-margin, --fp8-amax-compute-algo and
--fp8-amax-history-len (TEDelayedScaling, extensions/transformer_engine.py 3331-3363; defaults 0, most_recent, 1:
transformer_config.py 613-624) and reduces over get_amax_reduction_group, TP x DP x CP or TP x CP under
--tp-only-amax-red (fp8_utils.py 857-866). The history's length is the meta buffers' rows (memory); the algorithm
and the margin are numerics inside the one update kernel each reduction runs (not charged); --fp8-interval has been
ignored since TE v1.8 (Megatron warns, transformer_engine.py 3352-3355)."""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs import Job
from planner.models.configs.megatron_args import Flags, positive

DELAYED = ("Transformer Engine's delayed scaling (TE v2.9 Float8Quantizer): each cast at its amax history's scale "
           "with no amax pass (3 B an element where tensorwise moves 5), the norm writing FP8 itself; the amaxes "
           "all-reduced at each model chunk's forward end, backward end and recompute; each TE module's scale and "
           "amax history held (--fp8-delayed-scaling, planner/cost/te_delayed.py)")
NUMERICS = "inside the scale update each amax reduction runs: numerics, no bytes or time of their own"
ALGORITHMS = ("max", "most_recent")


def read_float8(flags: Flags, job: Job) -> None:
    """The FP8 flags (the module docstring): float8 modelled for the two recipes read."""
    recipe = flags.given.get("--fp8-recipe", ["delayed"])
    if flags.given.get("--fp8-format") not in (["hybrid"], ["e4m3"]) or recipe not in (["delayed"], ["tensorwise"]):
        return
    flags.take("--fp8-format", "FP8 GEMMs through Transformer Engine: the blocks' linears timed in FP8 (--float8); "
               "their inputs kept as TE saves them, their weights' FP8 copies charged (planner/cost/te_kept.py)")
    delayed = recipe == ["delayed"]
    if "--fp8-recipe" not in flags.given:
        job.notes.append(f"--fp8-recipe not given: Megatron-LM's default, delayed: {DELAYED}")
    elif delayed:
        flags.take("--fp8-recipe", DELAYED)
    else:
        flags.take("--fp8-recipe", "tensorwise current scaling: each cast's amax and scale charged with the cast, and "
                   "the amaxes' all-reduce over the TP group under sequence parallelism (--fp8-current-scaling)")
    job.modelled.float8, job.modelled.fp8_current_scaling = True, not delayed
    job.modelled.fp8_delayed_scaling = delayed
    if delayed:
        _read_delayed(flags, job)


def _read_delayed(flags: Flags, job: Job) -> None:
    """Delayed scaling's settings: the history's rows and the reduction's group modelled, the rest said."""
    history = positive("--fp8-amax-history-len", flags.take(
        "--fp8-amax-history-len", "each TE module's amax history, fp32, a row per step: its meta buffers' bytes "
        "(--fp8-amax-history-len)", int))
    job.modelled.fp8_amax_history_len = history or 1
    algorithm = flags.take("--fp8-amax-compute-algo", f"the history's max or its most recent amax, {NUMERICS}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise UserError(f"--fp8-amax-compute-algo {algorithm!r} is not one of Megatron-LM's choices; give "
                        f"{' or '.join(ALGORITHMS)}")
    flags.take("--fp8-margin", f"the scale's margin, {NUMERICS}", int)
    flags.take("--fp8-interval", "ignored by Transformer Engine since v1.8 (Megatron-core warns, "
               "extensions/transformer_engine.py 3352-3355 at d98e8a64): nothing", int)
    job.modelled.fp8_amax_tp_only = bool(flags.take(
        "--tp-only-amax-red", "the amaxes all-reduced over TP x CP, not TP x DP x CP (--fp8-tp-only-amax-red)", bool))
