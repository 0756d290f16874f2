"""What every exporter shares: which profile layers a framework calls its embedding, its
decoder layers and its head, and the roundings of a plan to what a framework can say.

Each rounding takes stage plans and returns new ones plus one sentence per change, so
an exporter is a short chain of them and `rescore` tells what the chain cost under
THE cost model (costmodel.evaluate), exact plan beside rounded plan.

A plan of a chunked schedule (interleaved-1F1B, ZB, ZBV, DualPipeV) is rounded as its P·V
pipeline stages in pipeline order, the way every framework's configuration lists them
(Megatron-LM's layout, torchtitan's module FQNs, ColossalAI's layers per stage); the
schedule's placement puts them on ranks again (costmodel.ranks_of) to be scored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from planner.cost import costmodel
from planner.cost.costmodel import PlanCost
from planner.cost.float8 import float8_profile
from planner.errors import UserError
from planner.schema import OPTION_FULL, OPTION_OFFLOAD, Plan, Profile, StagePlan, TrainSetup


@dataclass(frozen=True)
class Roles:
    """An LLM's layers as the frameworks split them: embedding side, N identical decoder
    layers, norm + head side."""

    pre: list[str]  # before the first decoder layer: always on the first stage
    decoder: list[str]  # the repeated kind, in order: framework layer i is decoder[i]
    post: list[str]  # after the last decoder layer: always on the last stage

    def decoder_index(self, name: str) -> int:
        return self.decoder.index(name)


# Layer kinds the frameworks build as one decoder stack: a mixture-of-experts block is a decoder
# layer whose MLP is the experts (Megatron-LM's --moe-layer-freq, torchtitan's MoE models mix them)
_DECODER_KINDS = {"moe_block": "decoder_block"}


def llm_roles(profile: Profile) -> Roles | None:
    """The most frequent layer kind (dense and MoE decoder blocks counted as one), if its
    layers are contiguous and at least two, is the decoder stack; None when the profile is
    not shaped like that."""
    kinds = [_DECODER_KINDS.get(layer.kind, layer.kind) for layer in profile.layers]
    kind, count = Counter(kinds).most_common(1)[0]
    first = kinds.index(kind)
    if count < 2 or kinds[first:first + count] != [kind] * count:
        return None
    names = [layer.name for layer in profile.layers]
    return Roles(pre=names[:first], decoder=names[first:first + count], post=names[first + count:])


def require_roles(profile: Profile, target: str) -> Roles:
    roles = llm_roles(profile)
    if roles is None:
        raise UserError(f"{target} describes a model as an embedding, a stack of identical decoder layers and a "
                        f"head, and this profile's layers are not one such stack; export to deepspeed instead")
    return roles


@dataclass
class Rounded:
    """A plan as a framework can say it, and what saying it so changed."""

    stages: list[StagePlan]  # the pipeline's stages in order: P·V of them for a chunked schedule
    setup: TrainSetup
    changes: list[str] = field(default_factory=list)

    def ranks(self) -> list[StagePlan]:
        """One StagePlan per rank, as the cost model scores the plan (a chunked schedule's
        stages on the ranks its placement gives them, chunk 0 first)."""
        if self.setup.pipeline.chunks == 1:
            return self.stages
        return costmodel.ranks_of(self.stages, self.setup)


@dataclass(frozen=True)
class Scored:
    exact: PlanCost
    rounded: PlanCost

    @property
    def slowdown(self) -> float:
        return self.rounded.iteration_ms / self.exact.iteration_ms - 1.0


RUNTIMES = {"Megatron-LM": "megatron", "torchtitan": "torchtitan", "ColossalAI": "colossalai",
            "DeepSpeed": "deepspeed"}


def start(plan: Plan, target: str | None = None, *, selective: bool = False, keep_offload: bool = False) -> Rounded:
    """The plan as it stands (its pipeline stages in order), scored for `target`'s runtime (its
    own way of overlapping the data-parallel reductions) where the plan was scored for another.
    Without `selective` (the exporter writes whole layers only), a selective option becomes
    the whole layer: it frees at least as much and recomputes more, re-scored like every other
    rounding. With `keep_offload` (the target writes the plan's offloaded layers as they are: Megatron-LM's
    window) they stay."""
    stages = [stage.model_copy(update={"predicted": None}) for stage in costmodel.pipeline_stages(plan.stages, plan.setup)]
    rounded = Rounded(stages=stages, setup=plan.setup)
    if not keep_offload:
        offloaded_as_full(rounded, target)
    if not selective:
        rounded.stages = whole_layers(rounded.stages)
        partial = {name: option for s in stages for name, option in s.recompute.items() if option != "full"}
        if partial and target:
            kinds = sorted(set(partial.values()))
            rounded.changes.append(f"{target} is exported with whole-layer recompute: the {len(partial)} layers the "
                                   f"plan recomputes selectively ({', '.join(kinds)}) recompute whole layers")
    runtime = RUNTIMES.get(target or "")
    if runtime is not None and runtime != plan.setup.training.runtime:
        rounded.setup = rounded.setup.model_copy(update=as_runtime(runtime))
    return rounded


def as_runtime(runtime: str) -> dict:
    """The setup's fields that make it scored as `runtime`'s newest record: the version the plan
    named was its own runtime's, not the target's."""
    return {"runtime": runtime, "runtime_version": None}


def offloaded_as_full(rounded: Rounded, target: str | None) -> None:
    """No framework offloads a chosen layer's activations as ckplan's offload option does
    (Megatron-LM's CANNOT_EXPRESS says why for it): those layers recompute whole instead, the
    same bytes on the device, their recompute in place of the copies."""
    offloaded = [name for s in rounded.stages for name in s.layers if s.option(name) == OPTION_OFFLOAD]
    if not offloaded:
        return
    rounded.stages = [s.with_recompute({n: OPTION_FULL if s.option(n) == OPTION_OFFLOAD else s.option(n)
                                        for n in s.layers}) for s in rounded.stages]
    if target:
        rounded.changes.append(f"{target} offloads no chosen layer's activations: the {len(offloaded)} layers the plan "
                               "offloads to the host recompute whole layers (the same bytes on the device)")


def unwritable_as_full(rounded: Rounded, target: str, writable: frozenset[str]) -> None:
    """A selective option with a part the target's file cannot write (`writable`: the parts it can;
    save-matmuls and full always) recomputes the whole layer instead: it frees at least as much and
    recomputes more, re-scored like every other rounding."""
    def written(option: str) -> bool:
        return option in (OPTION_FULL, OPTION_OFFLOAD, "save-matmuls") or set(option.split(",")) <= writable
    odd = {name: option for s in rounded.stages for name, option in s.recompute.items() if not written(option)}
    if not odd:
        return
    rounded.stages = [s.with_recompute({n: OPTION_FULL if n in odd else s.option(n) for n in s.layers})
                      for s in rounded.stages]
    rounded.changes.append(f"{target}'s file recomputes {', '.join(sorted(writable))} and save-matmuls: the {len(odd)} "
                           f"layers the plan recomputes with {', '.join(sorted(set(odd.values())))} recompute whole layers")


def whole_layers(stages: Sequence[StagePlan]) -> list[StagePlan]:
    """Every layer that recomputes anything recomputes its whole forward."""
    return [s.with_checkpointed([n for n in s.layers if s.option(n) != "none"]) for s in stages]


def rescore(plan: Plan, profile: Profile, rounded: Rounded) -> Scored:
    """The plan as solved and as the framework runs it; where the framework's runtime alone
    changes the figures (its pipeline's buffers, its overlapped reductions), that is said."""
    exact = evaluate(plan.stages, profile, plan.setup)
    if rounded.setup.training.runtime != plan.setup.training.runtime:
        same_plan = evaluate(plan.stages, profile, plan.setup.model_copy(
            update=as_runtime(rounded.setup.training.runtime)))
        if same_plan != exact:
            rounded.changes.insert(0, f"scored for {rounded.setup.training.runtime}'s runtime, not "
                                      f"{plan.setup.training.runtime}'s: its pipeline buffers and data-parallel "
                                      f"overlap (iteration {same_plan.iteration_ms / 1e3:.3g} s for the plan as "
                                      f"solved, peaks {_peaks(same_plan)})")
    return Scored(exact=exact, rounded=evaluate(rounded.ranks(), profile, rounded.setup))


def evaluate(stages: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """THE cost model on `profile` as `setup`'s runtime runs it: its fused kernels, what its fused SwiGLU
    keeps and, under --float8, the Float8 records (planner/cost/float8.py float8_profile). An exporter holds
    the profile as recorded, since the framework it writes for may run another runtime than the plan was
    solved for (a torchtitan plan exported to Megatron-LM runs Transformer Engine's kernels)."""
    return costmodel.evaluate(stages, float8_profile(profile, setup), setup)


def _peaks(cost: PlanCost) -> str:
    from planner.units import format_bytes

    return "/".join(format_bytes(stage.peak_bytes) for stage in cost.stages)


# ---------------------------------------------------------------- roundings


def one_f_one_b(rounded: Rounded, target: str) -> Rounded:
    """Frameworks whose pipeline runs 1F1B only (a chunked plan's stages merged per rank)."""
    return run_as(rounded, "1F1B", target)


def pin_ends(rounded: Rounded, roles: Roles, target: str) -> Rounded:
    """The embedding side joins the first stage, the head side the last."""
    pre, post = set(roles.pre), set(roles.post)
    last = len(rounded.stages) - 1
    moved = [name for s, stage in enumerate(rounded.stages) for name in stage.layers
             if (name in pre and s != 0) or (name in post and s != last)]
    if not moved:
        return rounded
    stages = []
    for s, stage in enumerate(rounded.stages):
        keep = [n for n in stage.layers if not ((n in pre and s != 0) or (n in post and s != last))]
        if s == 0:
            keep = roles.pre + [n for n in keep if n not in pre]
        if s == last:
            keep = [n for n in keep if n not in post] + roles.post
        if not keep:
            raise UserError(f"{target} puts {', '.join(moved)} on the first or last stage, which leaves stage {s} "
                            "without layers; solve with fewer stages")
        stages.append(StagePlan(index=s, layers=keep, checkpointed=[n for n in stage.checkpointed if n in keep],
                                recompute={n: o for n, o in stage.recompute.items() if n in keep}))
    rounded.stages = stages
    rounded.changes.append(f"{target} keeps the embedding on the first stage and the head on the last: "
                           f"moved {', '.join(moved)}")
    return rounded


def decoder_checkpoints_only(rounded: Rounded, roles: Roles, target: str) -> Rounded:
    """Drop checkpointing of layers outside the decoder stack."""
    decoder = set(roles.decoder)
    dropped = [n for stage in rounded.stages for n in stage.recompute if n not in decoder]
    if dropped:
        rounded.stages = [s.with_recompute({n: o for n, o in s.recompute.items() if n in decoder})
                          for s in rounded.stages]
        rounded.changes.append(f"{target} checkpoints decoder layers only: {', '.join(dropped)} run "
                               "without checkpointing")
    return rounded


def decoder_start(plan: Plan, profile: Profile, target: str, *, round_zero: Callable[[Rounded], None],
                  runs_as: dict[str, str] | None = None, selective: bool = False,
                  keep_offload: bool = False) -> tuple[Roles, Rounded]:
    """Where every LLM framework's export starts: the profile's roles (embedding, decoder
    stack, head), the schedule it runs (`runs_as`: the plan's schedule -> the one the target
    runs instead, see `run_as`), the ZeRO stage it runs (`round_zero`), the embedding and
    head on the end stages, decoder layers the only ones recomputed (selective options kept
    where `selective`: the exporter rounds them itself; offloaded layers where `keep_offload`)."""
    roles = require_roles(profile, target)
    rounded = start(plan, target, selective=selective, keep_offload=keep_offload)
    instead = (runs_as or {}).get(plan.setup.pipeline.schedule)
    if instead is not None:
        run_as(rounded, instead, target)
    round_zero(rounded)
    pin_ends(rounded, roles, target)
    decoder_checkpoints_only(rounded, roles, target)
    return roles, rounded


# What the frameworks' pipelines run in place of a schedule they do not have (the exporters'
# `runs_as` tables): GPipe as 1F1B (every framework here runs 1F1B); a chunked schedule as one
# with the same pipeline stages where the framework has one.
ONLY_1F1B = {"GPipe": "1F1B"}


def run_as(rounded: Rounded, schedule: str, target: str) -> Rounded:
    """Score the plan as `target` runs it, with `schedule` instead of the plan's. The pipeline
    stages stay as they are where the chunk count stays (the new schedule's placement puts
    them on ranks: a V becomes a loop, for one); to 1F1B, each rank's chunks become one stage
    of the consecutive pipeline stages it gets, P·V stages merged V at a time."""
    old = rounded.setup.pipeline
    if schedule == old.schedule:
        return rounded
    chunks = 1 if schedule in ("1F1B", "GPipe") else old.chunks
    if chunks == 1 and old.chunks > 1:
        rounded.stages = _merged(rounded.stages, old.chunks)
    rounded.setup = rounded.setup.model_copy(update={"schedule": schedule, "chunks": chunks})
    try:
        costmodel.schedule_of(rounded.setup)
    except UserError as exc:
        raise UserError(f"{target} has no {old.schedule} schedule and runs this plan as {schedule}, "
                        f"which cannot run it: {exc}") from exc
    if old.chunks == 1:
        rounded.changes.append(f"{target} runs a {schedule} schedule, not {old.schedule}: "
                               f"scored as {schedule} (fewer microbatches in flight)")
    elif chunks == 1:
        rounded.changes.append(f"{target} runs one stage per rank ({schedule}), not {old.schedule} with {old.chunks} "
                               f"chunks: rank r takes the {old.chunks} consecutive pipeline stages "
                               f"{old.chunks}r..{old.chunks}r+{old.chunks - 1} as one stage (each layer keeps its "
                               f"recompute choice); solve with --schedule {schedule} for a plan made for it")
    else:
        placed = "" if _placement(old.schedule) == _placement(schedule) else \
            f"; its stages re-placed from a V (rank r: stages r and {2 * old.stages - 1}-r) to a loop (r and {old.stages}+r)"
        rounded.changes.append(f"{target} has no {old.schedule} schedule: runs the same {old.stages * old.chunks} "
                               f"pipeline stages as {schedule}{placed}")
    return rounded


def _placement(schedule: str) -> str:
    return "v" if schedule in ("ZBV", "DualPipeV") else "loop"


def _merged(stages: Sequence[StagePlan], chunks: int) -> list[StagePlan]:
    """P·V pipeline stages as P, each the next `chunks` consecutive ones."""
    merged = []
    for rank in range(len(stages) // chunks):
        mine = stages[rank * chunks:(rank + 1) * chunks]
        merged.append(StagePlan(index=rank, layers=[n for s in mine for n in s.layers],
                                recompute={n: o for s in mine for n, o in s.recompute.items()},
                                checkpointed=[n for s in mine for n in s.checkpointed]))
    return merged


def decoder_counts(stages: Sequence[StagePlan], roles: Roles) -> tuple[list[int], list[int]]:
    """(decoder layers, checkpointed decoder layers) per stage."""
    decoder = set(roles.decoder)
    return ([sum(n in decoder for n in s.layers) for s in stages],
            [sum(n in decoder for n in s.checkpointed) for s in stages])


def decoder_layers(stage: StagePlan, roles: Roles) -> list[str]:
    decoder = set(roles.decoder)
    return [n for n in stage.layers if n in decoder]


def first_k(rounded: Rounded, roles: Roles, ks: Sequence[int] | None = None) -> list[int]:
    """Checkpoint the first k decoder layers of each stage: k per stage from `ks`, or as many
    as the plan checkpoints there. Returns the stages whose checkpointed set changed."""
    ks = list(ks) if ks is not None else decoder_counts(rounded.stages, roles)[1]
    stages, changed = [], []
    for stage, k in zip(rounded.stages, ks):
        chosen = decoder_layers(stage, roles)[:k]
        if set(chosen) != set(stage.checkpointed):
            changed.append(stage.index)
        stages.append(stage.with_checkpointed(chosen))
    rounded.stages = stages
    return changed


def scored_choice(candidates: Sequence[Rounded], profile: Profile) -> tuple[Rounded, bool]:
    """The fastest candidate that fits, else the one needing the least memory beyond its caps;
    True when it fits."""
    scored = [(candidate, evaluate(candidate.ranks(), profile, candidate.setup)) for candidate in candidates]
    fitting = [(c, cost) for c, cost in scored if cost.feasible]
    if fitting:
        return min(fitting, key=lambda item: item[1].iteration_ms)[0], True
    return min(scored, key=lambda item: max(s.pressure for s in item[1].stages))[0], False


# ---------------------------------------------------------------- the export and its header


@dataclass
class Export:
    """What an exporter returns: the text to write, the rounded plan and its score."""

    target: str
    text: str
    suffix: str  # default file name ending, e.g. ".megatron.sh"
    rounded: Rounded
    scored: Scored
    cannot_express: list[str]  # what the framework cannot say, whatever the plan


def header_lines(plan_file: str, target: str, cannot_express: Sequence[str], rounded: Rounded,
                 scored: Scored, *, plan_setup=None) -> list[str]:
    """The comment block every export opens with: the runtime record the plan was scored as
    (`plan_setup`'s; the rounded setup's where not given), what the target loses, what the
    rounding changed, and the cost model's score of the exact plan beside the rounded one."""
    from planner.emit.scored_as import record_line
    from planner.units import format_bytes, format_ms

    lines = [f"ckplan plan {plan_file} for {target}.", record_line(plan_setup or rounded.setup, rounded.setup)]
    lines += [f"{target} cannot express: {item}" for item in cannot_express]
    lines += [f"Rounded: {item}" for item in rounded.changes] or ["Rounded: nothing; this is the plan exactly."]
    exact, approx = scored.exact, scored.rounded
    lines.append(f"Predicted iteration (ckplan cost model): plan {format_ms(exact.iteration_ms)}, "
                 f"this export {format_ms(approx.iteration_ms)} ({scored.slowdown * 100:+.1f}%).")
    unit = "rank" if rounded.setup.pipeline.chunks > 1 else "stage"  # a rank holds several stages
    for s, (e, r) in enumerate(zip(exact.stages, approx.stages)):
        verdict = "fits" if r.fits else "DOES NOT FIT"
        reserved = "" if r.reserved_bytes is None else \
            f" (reserved {format_bytes(r.reserved_bytes)} + NCCL {format_bytes(r.workspace_bytes)})"
        lines.append(f"  {unit} {s}: peak {format_bytes(r.peak_bytes)}{reserved} of {format_bytes(r.cap_bytes)} cap, "
                     f"{verdict} (plan: {format_bytes(e.peak_bytes)})")
    if not approx.feasible:
        over = ", ".join(str(s) for s, c in enumerate(approx.stages) if not c.fits)
        lines.append(f"WARNING: rounded for {target}, {unit} {over} no longer fits its memory cap.")
    return lines


def one_line(text: str) -> str:
    """Text copied from a model, a profile or a path, as it may stand inside one line of a
    generated file: every character that is not printable (newlines, carriage returns, the
    Unicode line and paragraph separators, control characters) written as its escape, so a
    name can never end a comment and start a statement."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text))


def comment(lines: Sequence[str], mark: str = "#") -> str:
    return "\n".join(f"{mark} {one_line(line)}".rstrip() for line in lines) + "\n"
