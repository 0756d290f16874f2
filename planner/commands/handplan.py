"""A hand configuration's stages from per-stage counts (`--layers-per-stage`, `--ckpt-per-stage`),
shared by evaluate, the configs read from a framework's files, and search's comparisons."""

from __future__ import annotations

from planner.errors import UserError


def parse_counts(text: str, option: str) -> list[int]:
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isascii() and part.isdigit() for part in parts):  # "²".isdigit() is True; int("²") fails
        raise UserError(f"{option} {text!r}: give whole numbers separated by commas, e.g. 19,20,20,21")
    return [int(part) for part in parts]


def hand_stages(profile, layers_per_stage: list[int], ckpt_per_stage: list[int], rule: str):
    """Stage plans from per-stage counts. Counts that sum to the profile's layers count every
    layer; counts that sum to its decoder layers count those only (the embedding joins the
    first stage and the head the last, as ColossalAI and Megatron count). Checkpointed: the
    first (or last) k counted layers of each stage."""
    from planner.emit.rounding import llm_roles
    from planner.schema import StagePlan

    if len(ckpt_per_stage) != len(layers_per_stage):
        raise UserError(f"--ckpt-per-stage has {len(ckpt_per_stage)} entries for {len(layers_per_stage)} stages; "
                        "give one per stage")
    for s, (k, n) in enumerate(zip(ckpt_per_stage, layers_per_stage)):
        if k > n:
            raise UserError(f"--ckpt-per-stage checkpoints {k} layers in stage {s}, which has {n}; "
                            f"use at most {n}")
    names = [layer.name for layer in profile.layers]
    roles = llm_roles(profile)
    total = sum(layers_per_stage)
    if total == len(names):
        pre, counted, post = [], names, []
    elif roles is not None and total == len(roles.decoder):
        pre, counted, post = roles.pre, roles.decoder, roles.post
    else:
        decoder = f" ({len(roles.decoder)} decoder layers)" if roles else ""
        also = (f", or to {len(roles.decoder)} to count decoder layers only (the embedding then joins the first "
                "stage and the head the last)") if roles else ""
        raise UserError(f"--layers-per-stage sums to {total} but the profile has {len(names)} layers{decoder}; "
                        f"give counts that sum to {len(names)}{also}")
    stages, begin = [], 0
    for s, (n, k) in enumerate(zip(layers_per_stage, ckpt_per_stage)):
        own = counted[begin:begin + n]
        begin += n
        ckpt = own[:k] if rule == "first" else own[len(own) - k:]
        layers = (pre if s == 0 else []) + own + (post if s == len(layers_per_stage) - 1 else [])
        if not layers:
            raise UserError(f"--layers-per-stage gives stage {s} no layers; every stage needs at least one")
        stages.append(StagePlan(index=s, layers=layers, checkpointed=ckpt))
    return stages
