"""A plan as ColossalAI's HybridParallelPlugin: per-stage decoder layer counts
(`num_layers_per_stage`) and per-stage checkpoint counts
(`PipelineGradientCheckpointConfig(num_ckpt_layers_per_stage=...)`).

Facts from ColossalAI 0.5.0: PipelineStageManager.distribute_layers returns
num_layers_per_stage as given (decoder layers; the embedding runs on the first stage,
the final norm and head on the last); shardformer/modeling/llama.py checkpoints a decoder
layer when `idx - start_idx < num_ckpt_layers`, the FIRST k of the stage; pp_style is
1f1b, interleaved or zbv (no GPipe).

Chunks (pipeline/stage_manager.py): with num_model_chunks V, distribute_layers returns the
layers of the P·V pipeline stages in order, and get_stage_index gives rank r chunk c the
stage c·P + r (interleaved) or, with zbv, stages r and 2P-1-r (a V). But the plugin asserts
len(num_layers_per_stage) == P, so P·V counts are set on its stage manager after it is built.
PipelineGradientCheckpointConfig.get_num_ckpt_layers reads entry stage + chunk·P: the
checkpoint counts are listed per (rank, chunk) in that order, whatever the placement. zbv runs
the order ColossalAI's own v_schedule.PipelineGraph builds (ZB-V), scored as torch's ZBV.
"""

from __future__ import annotations

from planner.cost import costmodel
from planner.emit import dp_support, facts, rounding, scored_as
from planner.schema import Plan, Profile

TARGET = "ColossalAI"
CANNOT_EXPRESS = [
    "which layers of a stage are checkpointed: always its first k decoder layers.",
    "checkpointing the embedding or the head (decoder layers only).",
    "selective recompute (part of a layer): its checkpointing is whole decoder layers.",
    "interleaved zero-bubble (ZB) and DualPipeV schedules: its pipeline styles are 1f1b, interleaved and "
    "zbv.",
]
# The plan's schedule -> what ColossalAI runs instead: ZB's stages interleaved (the same loop
# placement), DualPipeV's as ZB-V (the same V)
RUNS_AS = {**rounding.ONLY_1F1B, "ZB": "interleaved-1F1B", "DualPipeV": "ZBV"}
_STYLES = {"1F1B": "1f1b", "interleaved-1F1B": "interleaved", "ZBV": "zbv"}
_PRECISION = {"bf16-mixed": "bf16", "fp32": "fp32"}


def export(plan: Plan, profile: Profile, *, plan_file: str) -> rounding.Export:
    scored_as.refuse_uncompiled_target(plan.setup, TARGET)
    roles, rounded = rounding.decoder_start(plan, profile, TARGET, runs_as=RUNS_AS,
                                            round_zero=lambda r: dp_support.round_zero(r, TARGET))
    changed = rounding.first_k(rounded, roles)
    if changed:
        rounded.changes.append(f"{TARGET} checkpoints the first k decoder layers of a stage: stage "
                               f"{', '.join(map(str, changed))} now checkpoints its first k instead of the "
                               "layers the plan chose")
    scored = rounding.rescore(plan, profile, rounded)
    header = rounding.header_lines(plan_file, TARGET, CANNOT_EXPRESS, rounded, scored, plan_setup=plan.setup)
    text = rounding.comment(header) + facts.sequence_note(profile) + "\n" + _plugin(rounded, roles, profile)
    return rounding.Export(TARGET, text, ".colossalai.py", rounded, scored, CANNOT_EXPRESS)


def checkpoint_counts(rounded: rounding.Rounded, ks: list[int]) -> list[int]:
    """Checkpointed layers per (rank, chunk), entry chunk·P + rank, as get_num_ckpt_layers
    reads them, from the counts per pipeline stage."""
    pipeline = rounded.setup.pipeline
    if pipeline.chunks == 1:
        return ks
    order = costmodel.schedule_of(rounded.setup)
    return [ks[order.stages_of(rank)[chunk]] for chunk in range(pipeline.chunks) for rank in range(pipeline.stages)]


def _plugin(rounded: rounding.Rounded, roles: rounding.Roles, profile: Profile) -> str:
    setup = rounded.setup
    counts, ks = rounding.decoder_counts(rounded.stages, roles)
    known = facts.read(profile)
    tp, sp = known.tp, known.sp
    chunks = setup.pipeline.chunks
    parallel = f"    tp_size={tp},\n" + ("    enable_sequence_parallelism=True,\n"
                                         "    sequence_parallelism_mode=\"split_gather\",\n" if sp else "")
    zero = f"    zero_stage={setup.data_parallel.zero},\n" if setup.data_parallel.zero else ""
    style = _STYLES[setup.pipeline.schedule]
    imports = "from colossalai.booster.plugin import HybridParallelPlugin\n"
    if style == "zbv":
        imports += "from colossalai.pipeline.schedule.v_schedule import PipelineGraph\n"
    pipeline = f"    pp_style=\"{style}\",\n"
    if chunks > 1:
        pipeline += f"    num_model_chunks={chunks},\n"
    if style == "zbv":  # ColossalAI's ZB-V order for unit costs (its zbv tests' way of building it)
        pipeline += ("    scheduler_nodes=PipelineGraph(\n"
                     f"        n_stage={setup.pipeline.stages}, n_micro={setup.pipeline.microbatches}, f_cost=1, b_cost=1, "
                     "w_cost=1, c_cost=0, f_mem=2, b_mem=-1, w_mem=-1,\n"
                     "    ).get_v_schedule(),\n")
    if chunks == 1:
        layers = ("    # decoder layers per stage; the embedding runs on stage 0, the final norm and head on the last\n"
                  f"    num_layers_per_stage={counts},\n")
        after = ""
    else:  # the plugin asserts one count per rank: P·V counts go to its stage manager
        layers = ""
        after = ("# decoder layers of the pipeline's stages in order (rank r, chunk c runs stage "
                 + ("c*P + r" if style == "interleaved" else "r, then 2P-1-r") + "); the embedding runs on the first,\n"
                 "# the final norm and head on the last. HybridParallelPlugin asserts one count per rank, so\n"
                 "# they are set on its stage manager, which its layer split reads (before booster.boost).\n"
                 f"plugin.stage_manager.num_layers_per_stage = {counts}\n")
    where = "of each stage" if chunks == 1 else "of each (rank, chunk), listed chunk * P + rank"
    return (
        f"{imports}"
        "from colossalai.shardformer import PipelineGradientCheckpointConfig\n\n"
        "plugin = HybridParallelPlugin(\n"
        f"{parallel}"
        f"    pp_size={setup.pipeline.stages},\n"
        f"{pipeline}"
        f"    num_microbatches={setup.pipeline.microbatches},\n"
        f"    microbatch_size={setup.pipeline.micro_batch_size},\n"
        f"    precision=\"{_PRECISION[setup.training.precision]}\",\n"
        f"{zero}"
        f"{layers}"
        "    gradient_checkpoint_config=PipelineGradientCheckpointConfig(\n"
        f"        # the first k decoder layers {where} are checkpointed\n"
        f"        num_ckpt_layers_per_stage={checkpoint_counts(rounded, ks)},\n"
        "    ),\n"
        ")\n"
        f"{after}"
        + ("# ColossalAI reads gradient_checkpoint_config only when the model's checkpointing is on:\n"
           "# call model.gradient_checkpointing_enable() before booster.boost(model, ...)"
           + (" with\n# gradient_checkpointing_kwargs={'use_reentrant': False} (zbv needs it).\n" if style == "zbv" else ".\n")
           if any(ks) else
           "# No layer is checkpointed: leave the model's gradient checkpointing off.\n")
    )
