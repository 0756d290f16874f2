"""FSDP2's replayed reserve under other lifetimes of a checkpointed analytic block's forward requests than
fsdp2_layers.forward_program's (each of the record's terms freed at its last use in the block's code,
analytic_kept.forward_last_uses; what the extra counts beyond the record, one tensor, alive to the forward's end).
A diagnostic of those lifetimes (docs/published-runs.md §29.reserve405, §29.fwdlife), not a cost term: the
requests, their sizes and their order are forward_program's; only when each is freed changes.
FORWARD=read (default): forward_program's own;
FORWARD=alive: each alive to the forward's end (branch reserve405's upper bound);
FORWARD=chain: each freed once the next one is made (an op consumes the tensor before it: at most two alive);
FORWARD=once: each freed as soon as it is made (one alive at a time);
FORWARD=off: no forward requests beyond the kept block (main before §29.fwdlife).
RESIDUAL=off leaves out the one tensor of what the extra counts beyond the record (its lower side), unsplit;
SPLIT=off plays that tensor unsplit, alive to the forward's end (branch fwdlife, before fsdp2_split).
ORDER=loss_first puts each microbatch's output after the loss's forward (the order before §29.reserve405).
F8=charge plays Float8's casts as the record's charge at w2 (before §31.f8cast; F8_SCALE=x scales that charge);
F8=nopre leaves out the sequence shards' float8 copies made before TP's gathers; F8=made plays w2's casts at the
charge's point (beside SiLU's and w3's outputs) instead of once `*` has released them.
GATHERED=beyond plays each TP + SP gathered input at tpgathered's figure beyond the caller's shard (before §31.f8cast's
second round), not whole beside the shard.
ROWPARTIAL=off leaves out TP + SP's row-parallel partial sums and their reduce-scattered shards (before §31.f8cast's
third round); ROWPARTIAL=wo (=w2) plays that linear's alone.
usage: FORWARD=chain [RESIDUAL=off] [SPLIT=off] [F8=charge] [F8_SCALE=x] [GATHERED=beyond] [ROWPARTIAL=off|wo|w2]
       [ORDER=loss_first]
       PYTHONPATH=<checkout> python
       scripts/forward_lifetime_sensitivity.py <ckplan evaluate arguments>"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import fsdp2_chunks, fsdp2_layers, fsdp2_split  # noqa: E402
from planner.cost.allocator import Alloc  # noqa: E402
from planner.cost.fsdp2_events import DEFAULT  # noqa: E402

MODE = os.environ.get("FORWARD", "read")
RESIDUAL = os.environ.get("RESIDUAL", "")
ORDER = os.environ.get("ORDER", "")
original = fsdp2_layers.forward_program


SPLIT = os.environ.get("SPLIT", "")
# F8_SCALE=x: the Float8 casts played at w2 scaled by x (the forward casts w2's input alone, tokens x f/t at 1 B, where
# the record's casts are its backward's two: x = (f/t) / (f/t + h), 0.289 at the 405B at TP 8)
F8_SCALE = os.environ.get("F8_SCALE", "")
original_split = fsdp2_layers.split_forward


# F8=charge: Float8's casts played as the record's charge at w2 (before §31.f8cast), not each linear's at its matmul
F8 = os.environ.get("F8", "")
GATHERED = os.environ.get("GATHERED", "")
ROWPARTIAL = os.environ.get("ROWPARTIAL", "")
if ROWPARTIAL in ("wo", "w2"):  # that linear's partial sum and shard alone
    fsdp2_split._ROW_PARALLEL = {name: place for name, place in fsdp2_split._ROW_PARALLEL.items()
                                 if name.startswith(ROWPARTIAL)}


def split_forward(codes, points, residual, parts):
    if GATHERED == "beyond":
        parts = {**parts, "shard": 0}
    if ROWPARTIAL == "off":
        parts = {**parts, "row_partial": 0}
    if F8 == "charge":
        parts = {**parts, "float8_casts": ()}
    if F8 == "made":  # w2's casts beside SiLU's and w3's outputs (the charge's point), not after `*` released them
        parts = {**parts, "float8_casts": tuple((name, "w2" if start == "w2_input" else start, end, program)
                                                for name, start, end, program in parts.get("float8_casts", ()))}
    if F8 == "nopre":  # the sequence shards' copies before TP's gathers left out
        parts = {**parts, "float8_casts": tuple(place for place in parts.get("float8_casts", ())
                                                if not place[0].startswith("pre:"))}
    if F8_SCALE and parts.get("float8"):
        cast = parts["float8"]
        parts = {**parts, "float8": int(cast * float(F8_SCALE))}
        residual -= cast - parts["float8"]
    return original_split(codes, points, residual, parts)


fsdp2_layers.split_forward = split_forward


def forward_program(known, option, extra, parts=None):
    unsplit = RESIDUAL == "off" or SPLIT == "off"
    program = original(known, option, extra, None if unsplit else parts)
    record = known.alloc_records.get(option)
    if MODE == "off":
        return ()
    if not program or record is None or not record.rerun_forward:
        return program  # a measured or fake record's own lifetimes are never changed
    sizes = [code for code in program if code > 0]
    if RESIDUAL == "off" and len(sizes) > sum(1 for code in record.rerun_forward if code > 0):
        program = tuple(code if code > 0 else code + 1 for code in program[1:])
        sizes = sizes[1:]
    if MODE == "read":
        return program
    if MODE == "alive":
        return tuple(sizes)
    if MODE == "once":
        return tuple(code for n, size in enumerate(sizes, 1) for code in (size, -n))
    chained = [sizes[0]]  # chain: each freed once the next is made
    for n, size in enumerate(sizes[1:], 2):
        chained += [size, -(n - 1)]
    return tuple(chained)


def run(self):
    """fsdp2_chunks._ChunkedStep.run with each output made after the loss's forward (ORDER=loss_first)."""
    rank = self.rank
    original_play, outputs = self.play, rank.output_bytes

    def play(chunk, pass_, *args):
        if pass_ == self.parts[chunk].forward_layers:
            original_play(chunk, pass_, *args)
            original_play(chunk, self.parts[chunk].forward_loss, *args)
            if outputs and outputs[chunk]:
                self.events.append(Alloc(("output", chunk, args[0]), outputs[chunk], DEFAULT))
            return
        if pass_ == self.parts[chunk].forward_loss:
            return
        if pass_ == self.parts[chunk].forward_mb:
            raise AssertionError("fsdp2_chunks plays forward_layers and forward_loss apart")
        original_play(chunk, pass_, *args)

    self.play = play
    # the output's own Alloc in run() is then skipped: output_bytes read as zero there
    object.__setattr__(rank, "output_bytes", ())
    try:
        original_run(self)
    finally:
        object.__setattr__(rank, "output_bytes", outputs)


fsdp2_layers.forward_program = forward_program
original_run = fsdp2_chunks._ChunkedStep.run
if ORDER == "loss_first":
    fsdp2_chunks._ChunkedStep.run = run

if __name__ == "__main__":
    sys.exit(stage_terms.main(sys.argv[1:]))
