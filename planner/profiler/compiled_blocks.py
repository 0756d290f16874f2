"""The compiled block records read so far (planner/profiler/compiled_blocks/*.json, written by
scripts/compiled_block_record.py from two readings of a block's inductor wrappers: compiled_record.py), attached to an
analytic profile's decoder blocks where the profile's block is the one read at a whole multiple of its widths.

A reading states the block's widths at its first scale (hidden, heads, kv heads, head dim, FFN, tokens of one
microbatch), the tensor-parallel degree it ran at, the settings it compiled under (`float8`: torchao's Float8
linears; `async-tp`: inductor's micro-pipeline TP), the record at that scale and each allocation's power of the
scale. A profile's block matches where the heads, the kv heads and the TP degree are the reading's and its
hidden size, head dim, FFN width and tokens are the reading's times one factor s; its record is the reading's
scaled by s (compiled_record.scaled). LayerProfile.compiled_records holds it by its settings' key.

A reading under context parallelism (`cp` > 1; 1 where the file names none) is the block with torch's ring traced into
its graph (scripts/compiled_block_cp.py: the ring's buffers are the wrappers' own), on the ring's busiest rank, its
tokens those of one CP rank: it matches only a profile at that CP degree, whose tokens are one rank's too, under the
key `cp<N>` beside its settings (settings_key)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

from planner.models.flash_workspace import flash2_backward_workspace
from planner.profiler.compiled_record import scaled, with_workspaces
from planner.schema import AllocRecord, LayerProfile

FOLDER = Path(__file__).with_name("compiled_blocks")


def settings_key(settings, cp: int = 1) -> str:
    """The key of a set of settings: their names sorted, joined by commas ("" for none), with `cp<N>` under context
    parallelism (N > 1)."""
    return ",".join(sorted([*settings, *([f"cp{cp}"] if cp > 1 else [])]))


def readings(folder: Path = FOLDER) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def matching(reading: dict, *, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, tokens: int,
             tp: int, cp: int = 1) -> Fraction | None:
    """The factor s from the reading's widths to these, or None where the block is another (or at another CP)."""
    dims = reading["dims"]
    if (dims["heads"], dims["kv_heads"], reading["tp"], reading.get("cp", 1)) != (heads, kv_heads, tp, cp):
        return None
    factors = {Fraction(mine, dims[name]) for name, mine in
               (("hidden", hidden), ("head_dim", head_dim), ("ffn", ffn), ("tokens", tokens))}
    return factors.pop() if len(factors) == 1 else None


def flash_workspaces(reading: dict, factor: Fraction, micro_batch: int) -> list[tuple[int, list[int]]]:
    """Each flash attention backward call of the reading's backward (its "flash_backward": where, and its query at the
    reading's widths) with the bytes its kernel makes inside the call at `factor` times those widths: a query's
    tokens and head dim grow with the factor, its heads do not; the reading runs a microbatch's tokens as one
    sequence, the job as `micro_batch` sequences (FlashAttention-2 rounds each sequence's length to 128)."""
    out = []
    for at, (batch, heads, length, dim) in reading.get("flash_backward", []):
        tokens, head_dim = batch * length * factor, dim * factor
        sequences = micro_batch if tokens % micro_batch == 0 else batch
        out.append((at, list(flash2_backward_workspace(sequences, heads, int(tokens // sequences), int(head_dim)))))
    return out


def records_for(*, micro_batch: int = 1, **block) -> dict[str, AllocRecord]:
    """Each matching reading's record at these widths, by its settings' key (compiled_blocks' FOLDER), with its flash
    backward calls' own workspaces where they run (flash_workspaces: no wrapper names them)."""
    found = {}
    for reading in readings():
        factor = matching(reading, **block)
        if factor is None:
            continue
        record = scaled(AllocRecord.model_validate(reading["record"]), 1 / factor, reading["powers"])
        record = with_workspaces(record, flash_workspaces(reading, factor, micro_batch))
        found[settings_key(reading["settings"], reading.get("cp", 1))] = record
    return found


def with_records(layers: list[LayerProfile], arch, shape) -> list[LayerProfile]:
    """The analytic profile's layers with each dense LLaMA-style decoder block's compiled records: the readings ran
    the block under sequence parallelism (TP > 1), each at its CP degree, so only such profiles match."""
    if arch.style != "llama" or (shape.tp > 1 and not shape.sp):
        return layers
    found = records_for(hidden=arch.hidden_size, heads=arch.num_heads, kv_heads=arch.num_kv_heads,
                        head_dim=arch.head_dim or arch.hidden_size // arch.num_heads, ffn=arch.intermediate_size,
                        tokens=shape.tokens, tp=shape.tp, cp=shape.cp, micro_batch=shape.micro_batch_size)
    if not found:
        return layers
    return [layer.model_copy(update={"compiled_records": found}) if layer.kind == "decoder_block" else layer
            for layer in layers]
