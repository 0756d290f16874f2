"""The options for the settings real jobs use (--runtime-version, --compile, --op-level-sac,
--float8, --fp8-all-gather, --cp, --optimizer-state-dtype, --chunked-cross-entropy,
--mtp-layers, --expert-tp): TrainingSetup's fields of the same names. planner/cost/runtimes.py
models each or refuses it in one sentence; none is ignored."""

from __future__ import annotations

from dataclasses import dataclass

import click

from planner.errors import UserError

# The settings real jobs use (TrainingSetup's fields of the same names; planner/cost/runtimes.py
# models each or refuses it in one sentence).
SETTING_OPTIONS = [
    click.option("--runtime-version", default=None, metavar="VERSION",
                 help="The runtime's version whose facts apply (torchtitan: bbb1b616 compiles the loss under "
                      "--compile, 9dec370 does not; colossalai: hf-4.46 or hf-4.3x, the transformers loss it runs) "
                      "[default: the newest read]."),
    click.option("--compile", "compile_model", is_flag=True,
                 help="torch.compile (torchtitan's training.compile): the loss as the runtime's version compiles it; "
                      "the layers are charged as eager."),
    click.option("--op-level-sac", is_flag=True,
                 help="torchtitan's op-level selective AC: a checkpointed block (evaluate) runs its op-sac policy, "
                      "every second mm and the attention saved, and solve may choose it for a block (analytic "
                      "LLaMA profiles)."),
    click.option("--float8", is_flag=True,
                 help="Float8 linears (torchtitan's torchao tensorwise; Megatron-LM's Transformer Engine, time only): "
                      "the blocks' linears in FP8, from the profile's Float8 records (analytic dense blocks)."),
    click.option("--fp8-all-gather", is_flag=True,
                 help="FSDP2's float8 all-gather of the Float8 linears' weights (torchtitan; with --float8)."),
    click.option("--cp", "context_parallel", type=click.IntRange(min=1), default=1, show_default=True,
                 help="Context-parallel degree (refused above 1: not modelled)."),
    click.option("--optimizer-state-dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
                 help="Adam's moments in fp32 or bf16 (Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype)."),
    click.option("--chunked-cross-entropy", is_flag=True, help="Chunked cross-entropy (refused: not modelled)."),
    click.option("--mtp-layers", type=click.IntRange(min=0, max=64), default=0, show_default=True,
                 help="Multi-token-prediction modules (refused above 0: not modelled)."),
    click.option("--expert-tp", type=click.IntRange(min=1), default=None,
                 help="Expert tensor-parallel degree (refused where it differs from the profile's TP) [default: TP]."),
]
SETTING_OPTION_NAMES = ("runtime_version", "compile_model", "op_level_sac", "float8", "fp8_all_gather",
                        "context_parallel", "optimizer_state_dtype", "chunked_cross_entropy", "mtp_layers", "expert_tp")


@dataclass(frozen=True)
class TrainingSettings:
    """The settings real jobs use, as given (TrainingSetup's fields; `compile_model` is its `compile`)."""

    runtime_version: str | None = None
    compile_model: bool = False
    op_level_sac: bool = False
    float8: bool = False
    fp8_all_gather: bool = False
    context_parallel: int = 1
    optimizer_state_dtype: str = "fp32"
    chunked_cross_entropy: bool = False
    mtp_layers: int = 0
    expert_tp: int | None = None

    def fields(self) -> dict:
        """TrainingSetup's fields."""
        found = {name: getattr(self, name) for name in SETTING_OPTION_NAMES if name != "compile_model"}
        return found | {"compile": self.compile_model}


def check_settings(profile, *, runtime: str, settings: dict, say=None) -> None:
    """Refuse, in one sentence, a runtime version not read or a setting the cost model does not
    model (planner/cost/runtimes.py); say what --compile changes."""
    from types import SimpleNamespace

    from planner.cost import runtimes
    from planner.cost.rules import profile_tp

    record = runtimes.facts(runtime, settings["runtime_version"])
    refused = runtimes.refused_settings(SimpleNamespace(**settings, runtime=runtime), tp=profile_tp(profile))
    if refused:
        raise UserError(refused[0])
    if settings["float8"] and say is not None and not record.float8_memory:
        say(f"--float8: {runtime}'s Float8 ({record.float8}) is timed (its GEMMs in FP8, its casts); its memory "
            "is charged as the bf16 layers' (its float8 weight workspaces and saved inputs are not modelled)")
    if settings["compile"] and say is not None:
        compiled = record.loss_compiled is not None
        say(f"--compile: {runtime} {record.version} " + ("compiles the loss (charged as measured compiled)"
                                                         if compiled else "does not compile the loss")
            + "; the layers' memory and time are charged as eager (compile's effect on them is not modelled)")


def op_sac_stages(stages, profile):
    """--op-level-sac: a hand plan's checkpointed layers run torchtitan's op-level policy where the
    profile offers it (`op-sac`, planner/profiler/opsac.py), whole-layer checkpointing elsewhere.
    A profile whose layers offer none of it is refused in one sentence."""
    from planner.profiler.opsac import OPTION_OP_SAC
    from planner.schema import OPTION_FULL, StagePlan

    offered = {layer.name for layer in profile.layers
               if any(option.name == OPTION_OP_SAC for option in layer.recompute_options)}
    if not offered:
        raise UserError("--op-level-sac needs a profile whose blocks offer torchtitan's op-level policy (op-sac): "
                        "an analytic LLaMA-style profile with flash attention, made by `ckplan profile --arch`")
    out = []
    for stage in stages:
        recompute = {name: OPTION_OP_SAC if name in offered else OPTION_FULL for name in stage.checkpointed}
        out.append(StagePlan(index=stage.index, layers=list(stage.layers), recompute=recompute,
                             checkpointed=[name for name, option in recompute.items() if option == OPTION_FULL]))
    return out
