"""`ckplan search`'s training settings: the options `evaluate` and `solve` take (training_settings.
SETTING_OPTIONS and setup_options' --tp-overlap, the same definitions), checked as they check them
and carried to every configuration the search scores (jobsearch.JobOptions.training), to the
configurations scored beside it and to the plan it writes (its setup's training part)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

from planner.commands.setup_options import shared_option
from planner.commands.training_settings import (
    SETTING_OPTIONS,
    TrainingSettings,
    op_sac_layers,
    profile_cp,
    setting_notes,
)
from planner.errors import UserError

TP_OVERLAP_OPTION = shared_option("tp_overlap")


def settings_options(func):
    """Decorate `ckplan search` with the settings options; the command gets them as one
    `settings: TrainingSettings`, `tp_overlap` and `deepspeed` (DeepSpeed's ds_config knobs given, as
    DataParallelSetup's fields: deepspeed_options.deepspeed_given)."""
    from planner.commands.deepspeed_options import DEEPSPEED_OPTIONS, deepspeed_given

    @functools.wraps(func)
    def grouped(**kwargs):
        settings = TrainingSettings.from_options(kwargs)
        deepspeed = deepspeed_given(kwargs)
        return func(settings=settings, tp_overlap=kwargs.pop("tp_overlap"), deepspeed=deepspeed, **kwargs)

    for option in reversed(SETTING_OPTIONS + [TP_OVERLAP_OPTION] + DEEPSPEED_OPTIONS):
        grouped = option(grouped)
    return grouped


def cp_degrees(settings: TrainingSettings, found: tuple[int, ...], *, runtime: str, seq_len: int,
               gpus: int, heads: tuple[int, int]) -> tuple[int, ...]:
    """The context-parallel degrees searched: --cp N alone where given (refused in one sentence where
    the runtime, the sequence or the GPUs do not take it), else every degree the job allows; under
    --cp-comm a2a only those that divide the (Q, K/V) `heads` (at TP 1: jobsearch drops the
    configurations whose TP leaves a rank heads they do not divide)."""
    cp = settings.context_parallel
    if found == (1,) and cp is not None and cp > 1:
        raise UserError(f"--cp {cp}: {runtime}'s runtime runs no context parallelism (it is modelled as Megatron-LM and "
                        "torchtitan run it); search with --runtime megatron or torchtitan")
    if settings.cp_comm == "a2a":
        kept = tuple(cp for cp in found if heads[0] % cp == 0 and heads[1] % cp == 0)
        if settings.context_parallel not in (None, *kept) or kept == (1,) and found != (1,):
            cp = settings.context_parallel or max(found)
            raise UserError(f"--cp-comm a2a splits the model's {heads[0]} Q and {heads[1]} K/V heads over the "
                            f"context-parallel ranks, and --cp {cp} does not divide them (Transformer Engine "
                            "refuses it); use --cp-comm p2p or allgather, or another --cp")
        found = kept
    if cp is None or cp == 1:
        return found if cp is None else (1,)
    if cp not in found:
        raise UserError(f"--cp {cp} does not divide --gpus {gpus}, or its 2 x {cp} load-balanced chunks do not divide "
                        f"--seq-len {seq_len}; give another --cp or drop it")
    return (cp,)


def tp_degrees(settings: TrainingSettings, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """--expert-tp N: the experts split as TP splits them is what the cost model models, so the
    search keeps to TP N."""
    if settings.expert_tp is None:
        return allowed
    if settings.expert_tp not in allowed:
        raise UserError(f"--expert-tp {settings.expert_tp}: expert tensor parallelism is modelled equal to TP, and "
                        f"TP {settings.expert_tp} is not one the model and a node allow ({', '.join(map(str, allowed))})")
    return (settings.expert_tp,)


def checked(settings: TrainingSettings, *, tp_overlap: str, runtime: str, job, sample, arch_given: bool,
            say) -> dict:
    """TrainingSetup's fields every configuration gets (context_parallel left to each), after the
    checks `evaluate` and `solve` make: an unknown --runtime-version, a setting the cost model does
    not model (runtimes.refused_settings), --tp-overlap another runtime's, --op-level-sac on blocks
    that offer no op-level policy, each refused in one sentence; `sample` is one profile the search
    scores (at the least TP it tries). What --compile and --float8 change is said."""
    from planner.cost import runtimes

    record = runtimes.facts(runtime, settings.runtime_version)  # an unknown version refused
    fields = settings.fields()
    searched_cp = max(job.cp_ok)
    tp = job.fixed_tp[0] if job.fixed_tp else min(job.tp_ok)
    refused = runtimes.refused_settings(SimpleNamespace(runtime=runtime, **(fields | {"context_parallel": searched_cp})),
                                        tp=tp)
    if refused:
        raise UserError(refused[0])
    if tp_overlap != "none":
        if record.tp_overlap != tp_overlap:
            owners = ", ".join(r for r in runtimes.VERSIONS if runtimes.facts(r).tp_overlap == tp_overlap)
            raise UserError(f"--tp-overlap {tp_overlap} is a setting of {owners}'s runtime, and the search scores "
                            f"{runtime}'s; drop --tp-overlap or search with --runtime {owners}")
        if max(job.tp_ok) == 1 or (job.fixed_tp and job.fixed_tp[0] == 1):
            raise UserError(f"--tp-overlap {tp_overlap} overlaps tensor-parallel collectives, and every configuration "
                            "searched runs TP 1; drop it")
    if settings.op_level_sac:
        op_sac_layers(sample)  # refused where no block offers torchtitan's op-level policy
    if settings.compile_model and arch_given and max(job.tp_ok) > 1:
        say("--compile model: the blocks' compiled kept bytes are recorded at TP 1 only (planner/profiler/"
            "compiled_kept.py checks its formula there): configurations at TP > 1 keep their eager bytes")
    setting_notes(sample, runtime=runtime, settings=fields | {"context_parallel": profile_cp(sample)}, say=say)
    fields.pop("context_parallel")
    return fields


def deepspeed_fields(given: dict, *, runtime: str, sample) -> dict:
    """DeepSpeed's ds_config knobs given to the search (every configuration gets them; its ZeRO 3 ones act where
    a configuration runs ZeRO 3, the rest score DeepSpeed's defaults), checked as evaluate checks them: another
    runtime's search, the checkpointing settings' own rules, and a submodule knob on blocks ckplan cannot split
    (deepspeed_terms.profile_block: at the least TP searched, `sample`) each refused in one sentence."""
    if not given:
        return {}
    from planner.commands.deepspeed_options import SUBMODULE_KNOBS, check_checkpointing
    from planner.cost import deepspeed_terms

    flag = "--" + next(iter(given)).replace("_", "-")
    if runtime != "deepspeed":
        raise UserError(f"{flag} is DeepSpeed's setting, and the search scores {runtime}'s runtime; drop it or give "
                        "--runtime deepspeed")
    check_checkpointing(given, sample)
    knobs = [name for name in given if name in SUBMODULE_KNOBS]
    blocks = [layer for layer in sample.layers if layer.kind == "decoder_block"]
    if knobs and not (blocks and all(deepspeed_terms.profile_block(sample, layer) is not None for layer in blocks)):
        raise UserError(f"--{knobs[0].replace('_', '-')} needs the block's submodules, which ckplan knows only for an "
                        "analytic profile's dense GPT or LLaMA-style block at tensor parallelism 1; drop it")
    return dict(given)


def offload_choices(*, runtime: str, sample, optimizer: str) -> tuple[bool, ...]:
    """Optimizer offload searched beside no offload under DeepSpeed's runtime (its ZeRO-Offload, modelled:
    planner/cost/deepspeed_terms.py, dataparallel's host step), where the profile times the host's step."""
    if runtime != "deepspeed" or optimizer not in sample.host_step_ns_per_param:
        return (False,)
    return (False, True)


def check_hand(settings: TrainingSettings, *, tp: int) -> None:
    """The hand configuration (--tp, --pp, ...) is scored with the settings too; those it cannot take
    are refused in one sentence: it has no context-parallel degree, and its experts split as its TP."""
    if settings.context_parallel not in (None, 1):
        raise UserError(f"--cp {settings.context_parallel} restricts the configurations searched; a hand configuration "
                        "(--tp, --pp, ...) runs without context parallelism: drop --cp or the hand flags")
    if settings.expert_tp is not None and settings.expert_tp != tp:
        raise UserError(f"--expert-tp {settings.expert_tp} with a hand configuration at --tp {tp}: expert tensor "
                        "parallelism is modelled equal to TP; make them agree or drop --expert-tp")


DEFAULTS = {"runtime_version": None, "compile": False, "compile_loss": None, "op_level_sac": False, "float8": False,
            "fp8_all_gather": False, "cp_comm": None, "optimizer_state_dtype": "fp32", "chunked_cross_entropy": 0,
            "mtp_layers": 0, "expert_tp": None, "tp_overlap": "none", "expandable_segments": None}


# the options whose flag is not the setting's name spelled with dashes
FLAGS = {"grad_reduce_bf16": "--grad-reduce-in-bf16", "unfused_grad_accumulation": "--no-gradient-accumulation-fusion",
         "deterministic": "--deterministic-mode", "fp8_amax_tp_only": "--fp8-tp-only-amax-red",
         "context_parallel": "--cp"}


def stated(training: dict, tp_overlap: str) -> dict:
    """The settings given otherwise than their defaults (what the search's output says it scored): every
    TrainingSetup field's default where DEFAULTS has none, so Megatron-LM's flags (--grad-reduce-in-bf16,
    --te-cross-entropy, --nccl-nvls-off, --fp8-current-scaling ...) are said as --float8 is."""
    from planner.schema.setup import TrainingSetup

    defaults = {name: field.default for name, field in TrainingSetup.model_fields.items()} | DEFAULTS
    given = training | {"tp_overlap": tp_overlap}
    return {name: value for name, value in given.items() if defaults.get(name, value) != value}


def spelled(settings: dict) -> str:
    """`stated` settings as the options spell them."""
    from planner.commands.training_settings import compile_said

    words = []
    if "compile" in settings or "compile_loss" in settings:
        model = settings.get("compile", False)
        loss = settings.get("compile_loss", model) if settings.get("compile_loss") is not None else model
        words.append(f"--compile {compile_said(model, loss)}")
    for name, value in settings.items():
        if name in ("compile", "compile_loss"):
            continue
        if name == "expandable_segments":
            words.append("--expandable-segments" if value else "--no-expandable-segments")
            continue
        flag = FLAGS.get(name, "--" + name.replace("_", "-"))
        words.append(flag if value is True else f"{flag} {value}")
    return " ".join(words)
