"""Every request of at least BIG_MIB (default 256) MiB that the caching allocator's replay of a rank plays: its
bytes, its stream, and which of the replay's keys make it with how many a step (the static events and the second
step: the first makes the optimizer's state). A diagnostic for docs/published-runs.md §35.c7sizes, where each is set
against the bytes torch's code gives the tensor it stands for; not a cost term.

Keys (planner/cost/fsdp2_events.py, fsdp2_chunks.py): ag_out / staging / unsharded (FSDP2's all-gather output, its
copy-in input, a parameter's copy-out), rs_in (the reduce-scatter input, fp32), grad / acc (a weight's gradient,
its fp32 accumulation beside a pipeline), kept (a layer's kept block), forward (a checkpointed forward's request,
by its program's id), extra (a backward's, by its program's id), output / merged (a last stage's outputs and their
concatenation), loss_forward / loss_extra (the loss's fp32 tensors), buffers (what static holds beyond the shards).

usage: [RANKS=1,7] [BIG_MIB=256] PYTHONPATH=<checkout> python scripts/large_requests.py <ckplan evaluate arguments>"""

import collections
import os
import sys

OUT = sys.__stdout__  # the CLI runner captures sys.stdout

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import allocator  # noqa: E402
from planner.cost.allocator import Alloc  # noqa: E402

MIB = 2**20
RANKS = {int(r) for r in os.environ.get("RANKS", "").split(",") if r}
BIG = int(float(os.environ.get("BIG_MIB", "256")) * MIB)
original = allocator.settled_replay
seen: list[int] = []


def kind(key) -> str:
    """The key's name with its chunk, layer and microbatch dropped; a program's request keeps its id."""
    inner = key[2] if isinstance(key, tuple) and key[:1] == ("chunk",) else key
    if not isinstance(inner, tuple):
        return repr(inner)
    if inner[0] in ("forward", "extra"):
        return f"{inner[0]} #{inner[-1]}"
    return str(inner[0])


def listing(rank: int, events) -> None:
    found: dict[tuple[int, int], collections.Counter] = collections.defaultdict(collections.Counter)
    for event in events:
        if type(event) is Alloc and event.nbytes >= BIG:
            found[(event.nbytes, event.stream)][kind(event.key)] += 1
    print(f"rank {rank}: requests of {BIG // MIB} MiB or more (static and one step)", file=OUT)
    for (nbytes, stream), kinds in sorted(found.items()):
        named = ", ".join(f"{name} x{count}" for name, count in sorted(kinds.items()))
        print(f"  {nbytes:>14,d} B {nbytes / MIB:10.3f} MiB  stream {stream}  {named}", file=OUT)


def settled(static, step, **kwargs):
    if kwargs.get("perturb") is None:  # the rank's own replay, not evaluate's range
        rank = len(seen)
        seen.append(rank)
        static = list(static)
        if not RANKS or rank in RANKS:
            listing(rank, static + list(step(1)))
    return original(static, step, **kwargs)


allocator.settled_replay = settled

if __name__ == "__main__":
    sys.exit(stage_terms.main(sys.argv[1:]))
