"""A plan as ColossalAI's HybridParallelPlugin: per-stage decoder layer counts
(`num_layers_per_stage`) and per-stage checkpoint counts
(`PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage=...)`).

Facts from ColossalAI 0.5.0: PipelineStageManager.distribute_layers returns
num_layers_per_stage as given (decoder layers; the embedding runs on the first stage,
the final norm and head on the last); shardformer/modeling/llama.py checkpoints a decoder
layer when `idx - start_idx < num_ckpt_layers`, the FIRST k of the stage; pp_style is
1f1b, interleaved or zbv (no GPipe).
"""

from __future__ import annotations

from planner.emit import dp_support, rounding
from planner.schema import Plan, Profile

TARGET = "ColossalAI"
CANNOT_EXPRESS = [
    "which layers of a stage are checkpointed: always its first k decoder layers.",
    "checkpointing the embedding or the head (decoder layers only).",
]
_PRECISION = {"bf16-mixed": "bf16", "fp32": "fp32"}


def export(plan: Plan, profile: Profile, *, plan_file: str) -> rounding.Export:
    roles, rounded = rounding.decoder_start(plan, profile, TARGET,
                                            round_zero=lambda r: dp_support.round_zero(r, TARGET))
    changed = rounding.first_k(rounded, roles)
    if changed:
        rounded.changes.append(f"{TARGET} checkpoints the first k decoder layers of a stage: stage "
                               f"{', '.join(map(str, changed))} now checkpoints its first k instead of the "
                               "layers the plan chose")
    scored = rounding.rescore(plan, profile, rounded)
    header = rounding.header_lines(plan_file, TARGET, CANNOT_EXPRESS, rounded, scored)
    text = rounding.comment(header) + "\n" + _plugin(rounded, roles, profile)
    return rounding.Export(TARGET, text, ".colossalai.py", rounded, scored, CANNOT_EXPRESS)


def _plugin(rounded: rounding.Rounded, roles: rounding.Roles, profile: Profile) -> str:
    setup = rounded.setup
    counts, ks = rounding.decoder_counts(rounded.stages, roles)
    tp = int(profile.assumptions.get("tp", 1))
    sp = bool(profile.assumptions.get("sp", False))
    parallel = f"    tp_size={tp},\n" + ("    enable_sequence_parallelism=True,\n"
                                         "    sequence_parallelism_mode=\"split_gather\",\n" if sp else "")
    zero = f"    zero_stage={setup.data_parallel.zero},\n" if setup.data_parallel.zero else ""
    return (
        "from colossalai.booster.plugin import HybridParallelPlugin\n"
        "from colossalai.shardformer import PipelineGradientCheckpointConfig\n\n"
        "plugin = HybridParallelPlugin(\n"
        f"{parallel}"
        f"    pp_size={setup.pipeline.stages},\n"
        "    pp_style=\"1f1b\",\n"
        f"    num_microbatches={setup.pipeline.microbatches},\n"
        f"    microbatch_size={setup.pipeline.micro_batch_size},\n"
        f"    precision=\"{_PRECISION[setup.training.precision]}\",\n"
        f"{zero}"
        "    # decoder layers per stage; the embedding runs on stage 0, the final norm and head on the last\n"
        f"    num_layers_per_stage={counts},\n"
        "    gradient_checkpoint_config=PipelineGradientCheckpointConfig(\n"
        "        # the first k decoder layers of each stage are checkpointed\n"
        f"        num_ckpt_layers_per_stage={ks},\n"
        "    ),\n"
        ")\n"
        + ("# ColossalAI reads gradient_checkpoint_config only when the model's checkpointing is on:\n"
           "# call model.gradient_checkpointing_enable() before booster.boost(model, ...).\n" if any(ks) else
           "# No layer is checkpointed: leave the model's gradient checkpointing off.\n")
    )
