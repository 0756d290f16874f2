"""Megatron-LM's pipeline split: the decoder layers each (virtual) stage builds, from
--pipeline-model-parallel-layout, --decoder-first/last-pipeline-num-layers, or
--account-for-embedding/loss-in-pipeline-split, as megatron/core/transformer/transformer_block.py
get_num_layers_to_build reads them (planner/models/configs/megatron.py's Job takes the result)."""

from __future__ import annotations

import re

from planner.errors import UserError
from planner.models.configs import Job
from planner.models.configs.megatron_args import Flags


def stage_layers(flags: Flags, job: Job) -> list[int]:
    """Decoder layers of each of the pp x chunks stages, in pipeline order."""
    stages, layers = job.pp * job.chunks, job.arch.num_layers
    layout = flags.take("--pipeline-model-parallel-layout", "the pipeline split", str)
    if layout is not None:
        job.notes.extend(check_layout(layout, job.mtp_layers))
        counts = layout_counts(layout)
        if len(counts) != stages or sum(counts) != layers:
            raise UserError(f"--pipeline-model-parallel-layout lists {len(counts)} stages of {sum(counts)} decoder "
                            f"layers; the flags give {stages} stages of {layers}")
        return counts
    first = flags.take("--decoder-first-pipeline-num-layers", "layers of the first stage", int)
    last = flags.take("--decoder-last-pipeline-num-layers", "layers of the last stage", int)
    if flags.has("--account-for-embedding-in-pipeline-split") or flags.has("--account-for-loss-in-pipeline-split"):
        if first is not None or last is not None:  # transformer_block.py 110-114 at 92c8482e asserts it
            raise UserError("--account-for-embedding/loss-in-pipeline-split with --decoder-first/last-pipeline-num-"
                            "layers: Megatron-LM refuses uneven stages with them; give one or the other")
        return split_accounting(flags, layers, stages)
    if first is None and last is None:
        if layers % stages:
            raise UserError(f"--num-layers {layers} is not a multiple of the {stages} pipeline stages; give "
                            "--decoder-first/last-pipeline-num-layers or --pipeline-model-parallel-layout")
        return [layers // stages] * stages
    middle_stages = stages - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle_stages <= 0 and rest or middle_stages > 0 and rest % middle_stages:
        raise UserError(f"--decoder-first/last-pipeline-num-layers leave {rest} layers for {middle_stages} stages; "
                        "give counts that split evenly")
    middle = [rest // middle_stages] * middle_stages if middle_stages > 0 else []
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


def split_accounting(flags: Flags, layers: int, stages: int) -> list[int]:
    """--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the embedding
    and the loss each counted as one layer, the sum split evenly over the (virtual) stages, and the
    first stage builds one decoder layer fewer for the embedding, the last one fewer for the loss
    (megatron/core/transformer/transformer_block.py get_num_layers_to_build 147-205 at 92c8482e, the
    megatron-core of Megatron-Bridge 00b7660b; uneven first/last stages are refused with them there)."""
    embedding = flags.take("--account-for-embedding-in-pipeline-split", "the embedding counted as a layer in the "
                           "pipeline split (the first stage builds one decoder layer fewer)", bool, False)
    loss = flags.take("--account-for-loss-in-pipeline-split", "the loss counted as a layer in the pipeline split "
                      "(the last stage builds one decoder layer fewer)", bool, False)
    counted = layers + bool(embedding) + bool(loss)
    if counted % stages or counted // stages < 1:
        raise UserError(f"--num-layers {layers} with the embedding and loss counted ({counted}) is not a multiple of "
                        f"the {stages} pipeline stages; Megatron-LM refuses it")
    counts = [counted // stages] * stages
    counts[0] -= bool(embedding)
    counts[-1] -= bool(loss)
    return counts


def layout_stages(layout: str) -> list[str]:
    """A --pipeline-model-parallel-layout ('Et*3|(t|)*4,tmL') as one string per stage, every repeat expanded:
    stages split by '|' (and ','), 'x*n' and '(...)*n' repeats (pipeline_parallel_layer_layout.py
    parse_str_to_list at Megatron-LM d98e8a64); E the embedding, t a decoder layer, m an MTP layer, L the loss."""
    text = layout.strip().strip("\"'").replace(",", "|")
    for _ in range(8):  # expand (...)*n, innermost first
        expanded = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        if expanded == text:
            break
        text = expanded
    if not re.fullmatch(r"[EtmL|*0-9]*", text):
        raise UserError(f"--pipeline-model-parallel-layout {layout!r}: give stages of E, t, m and L split by '|'")
    return ["".join(kind * int(n or 1) for kind, n in re.findall(r"([EtmL])(?:\*(\d+))?", stage))
            for stage in text.split("|")]


def layout_counts(layout: str) -> list[int]:
    """Decoder layers per stage of a --pipeline-model-parallel-layout (layout_stages)."""
    return [stage.count("t") for stage in layout_stages(layout)]


def check_layout(layout: str, mtp_layers: int) -> list[str]:
    """What Megatron-core's PipelineParallelLayerLayout.validate_layer_layout asserts (d98e8a64, 86-151), and
    what ckplan's stages cannot say: the embedding first on the first stage, the loss last on the last, the MTP
    layers after every decoder layer, all in the last stage (Megatron also runs them as a stage of their own
    on another rank, "MTP standalone": ckplan places them with the head, on the last stage, only)."""
    stages = layout_stages(layout)
    flat = "".join(stages)
    where = f"--pipeline-model-parallel-layout {layout!r}"
    if flat[:1] != "E" or flat.count("E") != 1:
        raise UserError(f"{where}: the embedding (E) must come once, first in the first stage, as Megatron-LM asserts")
    if flat[-1:] != "L" or flat.count("L") != 1:
        raise UserError(f"{where}: the loss (L) must come once, last in the last stage, as Megatron-LM asserts")
    if flat.count("m") != mtp_layers:
        raise UserError(f"{where} places {flat.count('m')} MTP layer(s) (m) and --mtp-num-layers is {mtp_layers}; "
                        "Megatron-LM asserts they match")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise UserError(f"{where}: a decoder layer (t) after an MTP layer (m); Megatron-LM places MTP layers last")
    if "m" in "".join(stages[:-1]):
        raise UserError(f"{where}: MTP layers in a stage before the last (Megatron-LM's standalone MTP stage) are not "
                        "expressible: ckplan runs them on the last stage, with the head")
    if stages[-1].startswith("m"):  # the stage's first layer's input_bytes are what its send charges
        return [f"{where}: the last stage begins with its MTP layer, whose input ckplan counts as its checkpoint's "
                "inputs (the ids, the hidden states and the rolled embedding): the stage's received activation is "
                "charged that, where Megatron-LM sends the hidden states alone"]
    return []
