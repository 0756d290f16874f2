"""Trace the caching allocator's replay of one rank: every new segment it reserves (the event, its key, the
request, and the largest free blocks of that stream's pool at that moment, none of which fits), and the
reserved / allocated figures, with the analytic head's backward extra as recorded and, where HEAD_LESS_MIB is
set, with that many MiB taken off the extra of the rank's last layer (the head), as before §18.laststage
(since §19.bwdblocks the head's extra is its tensors: HEAD_LESS_MIB and HEAD_PIECES act on its first, the received
logits' gradient).
A diagnostic (docs/published-runs.md §18.replay17), not a cost term; a settled replay (allocator.settled_replay)
is traced as the one sequence it plays.
LIVE=1 lists every tensor alive at the rank's allocated peak and at its reserved peak (the moment the last new
segment took the reserve to its peak), grouped by what made it (the key's name, its chunk and the step's
microbatch dropped), with their bytes, and each segment alive then with what holds it (docs/published-runs.md
§27.c8last).
SMALL=1 lists the small pool's 2 MiB segments too, one line each (their total is in the reserve either way:
docs/published-runs.md §42.bestfit26 found M16's step 1 ending 0.52 GiB of them above its last gradient).
MIN_STEPS=n plays at least n steps on the traced rank (does a later step take a segment the settled replay's last
step did not? docs/published-runs.md §27.order405).
usage: RANK=7 [LIVE=1] [SMALL=1] [MIN_STEPS=8] [HEAD_LESS_MIB=1152] [WATCH="('merged',)"] [HEAD_PIECES=b1,b2,..] PYTHONPATH=<checkout> python scripts/replay_trace.py <ckplan evaluate arguments>"""
import os
import sys

OUT = sys.__stdout__  # the CLI runner captures sys.stdout

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import allocator  # noqa: E402
from planner.cost.allocator import Alloc, CachingAllocator, Free, Ready  # noqa: E402

MIB = 2**20
RANK = int(os.environ.get("RANK", "-1"))
WATCH = os.environ.get("WATCH", "")  # a key's repr, e.g. "('merged',)"
PIECES = [int(b) for b in os.environ.get("HEAD_PIECES", "").split(",") if b]  # bytes, summing to the extra
LESS = int(float(os.environ.get("HEAD_LESS_MIB", "0")) * MIB)
LIVE = os.environ.get("LIVE", "") not in ("", "0")
SMALL = os.environ.get("SMALL", "") not in ("", "0")  # list the small pool's segments too
MIN_STEPS = int(os.environ.get("MIN_STEPS", "0"))  # play at least this many steps on the traced rank (§27.order405)
calls: list[list] = []
original = allocator.replay


def head_index(events) -> object:
    """The key of the rank's head extra: the extra Alloc of the highest layer index (the last chunk's), its first
    tensor (the received logits' gradient) where the replay plays it as its tensors (fsdp2_layers.backward_program)."""
    extras = [e.key for e in events if isinstance(e, Alloc) and _inner(e.key)[0] == "extra"]
    if not extras:  # a replay without FSDP2's layer extras (Megatron-LM's): no head to name
        return None
    return max(extras, key=lambda k: (k[1] if k[0] == "chunk" else 0, _inner(k)[1], -_inner(k)[2]))


def head_pieces(events, head) -> list[float]:
    """The MiB of each tensor of the head's extra, in the order made (the first backward's)."""
    layer = lambda k: (k[1] if k[0] == "chunk" else 0, _inner(k)[1])  # noqa: E731
    made = {}
    for e in events:
        if isinstance(e, Alloc) and _inner(e.key)[0] == "extra" and layer(e.key) == layer(head):
            made.setdefault(_inner(e.key)[2], round(e.nbytes / MIB, 1))
    return list(made.values())


def _inner(key):
    return key[2] if isinstance(key, tuple) and key and key[0] == "chunk" else key


def traced(events, **kwargs):
    events = list(events)
    if LESS and len(calls) == RANK:
        head = head_index(events)
        events = [Alloc(e.key, e.nbytes - LESS, e.stream) if isinstance(e, Alloc) and e.key == head else e
                  for e in events]
    if PIECES and len(calls) == RANK:  # the head's extra as these tensors, made in order, freed together
        head = head_index(events)
        cut = []
        for e in events:
            if isinstance(e, Alloc) and e.key == head:
                assert sum(PIECES) == e.nbytes, (sum(PIECES), e.nbytes)
                cut += [Alloc((*head, n), size, e.stream) for n, size in enumerate(PIECES)]
            elif isinstance(e, Free) and e.key == head:
                cut += [Free((*head, n)) for n in range(len(PIECES))]
            else:
                cut.append(e)
        events = cut
    if len(calls) == RANK:
        head = head_index(events)
        if head is not None:
            print(f"rank {RANK}: the head's extra {head}: {head_pieces(events, head)} MiB", file=OUT)
        trace(events, **kwargs)
    calls.append(events)
    return original(events, **kwargs)


def trace(events, **kwargs) -> None:
    state = CachingAllocator(**kwargs)
    new_segment = state._new_segment
    at = {"i": 0, "key": None}

    def logged(size, stream, small):
        if small and SMALL:
            print(f"  #{at['i']:6d} small segment {size / MIB:9.1f} MiB stream {stream} for {at['key']}; "
                  f"reserved {(state.reserved + size) / MIB / 1024:6.2f} GiB", file=OUT)
        if not small:
            free = sorted((b.size for k, b in state.pools[False].blocks.items() if k[0] == stream), reverse=True)
            print(f"  #{at['i']:6d} new segment {size / MIB:9.1f} MiB stream {stream} for {at['key']}; "
                  f"reserved {(state.reserved + size) / MIB / 1024:6.2f} GiB, allocated {state.allocated / MIB / 1024:6.2f}; "
                  f"free here: {len(free)} blocks {sum(free) / MIB:8.1f} MiB, largest {[round(f / MIB, 1) for f in free[:4]]}", file=OUT)
        return new_segment(size, stream, small)

    state._new_segment = logged
    peaks = {"allocated": (-1, None, None), "reserved": (-1, None, None)}  # (bytes, event, live snapshot)
    watched: list[int] = []  # WATCH: the segment a key's block first lies in, [start, end)
    for i, event in enumerate(events):
        at["i"], at["key"] = i, getattr(event, "key", None)
        if isinstance(event, Alloc):
            state.malloc(*event)
            block = state.live.get(event.key)
            if watched and block is not None and watched[0] <= block.address < watched[1]:
                print(f"  #{i:6d} {event.key} takes {block.size / MIB:.1f} MiB at +{(block.address - watched[0]) / MIB:.1f} "
                      f"of the watched segment (request {event.nbytes / MIB:.1f})", file=OUT)
            if WATCH and not watched and block is not None and repr(event.key) == WATCH:
                first = block
                while first.prev is not None:
                    first = first.prev
                last = block
                while last.next is not None:
                    last = last.next
                watched += [first.address, last.address + last.size]
                print(f"  #{i:6d} watching {event.key}'s segment, {(watched[1] - watched[0]) / MIB:.1f} MiB", file=OUT)
        elif isinstance(event, Free):
            block = state.live.get(event.key)
            if watched and block is not None and watched[0] <= block.address < watched[1]:
                print(f"  #{i:6d} {event.key} frees {block.size / MIB:.1f} MiB at +{(block.address - watched[0]) / MIB:.1f}",
                      file=OUT)
            state.free(event.key, deferred=event.deferred)
        elif isinstance(event, Ready):
            state.ready(event.key)
        else:
            state.sync()
        if LIVE:
            for kind, now in (("allocated", state.allocated), ("reserved", state.reserved)):
                if now > peaks[kind][0]:
                    peaks[kind] = (now, i, snapshot(state))
    if LIVE:
        for kind, (now, i, live) in peaks.items():
            print_live(kind, now, i, live)
    print(f"rank {RANK}: {len(events)} events, reserved peak {state.reserved_peak / 2**30:.3f} GiB, allocated peak "
          f"{state.allocated_peak / 2**30:.3f} GiB, {state.segments} segments", file=OUT)


def group(key) -> str:
    """A live tensor's group: its key's name and, for the layers' tensors, the layer's index (the last layers:
    the head and the final norm), the chunk, microbatch and program ids dropped."""
    inner = _inner(key)
    if not isinstance(inner, tuple):
        return repr(inner)
    name = inner[0]
    if name in ("kept", "extra", "grad", "acc", "scratch", "state", "shard") and len(inner) >= 3:
        layer = inner[2] if name == "kept" else inner[1]
        return f"{name} layer {layer}"
    return str(name)


def snapshot(state) -> dict:
    """The live tensors (block bytes by group and count) and each segment's live and free bytes."""
    live: dict[str, list[int]] = {}
    for key, block in state.live.items():
        entry = live.setdefault(group(key), [0, 0])
        entry[0] += block.size
        entry[1] += 1
    segments, owner = {}, {id(block): key for key, block in state.live.items()}
    for block in state.live.values():
        first = block
        while first.prev is not None:
            first = first.prev
        if first.address in segments:
            continue
        held, free, b = [], 0, first
        while b is not None:
            if b.allocated:
                held.append(group(owner[id(b)]))
            else:
                free += b.size
            end, b = b.address + b.size, b.next
        segments[first.address] = (end - first.address, free, sorted(set(held)))
    return {"live": live, "segments": segments}


def print_live(kind: str, now: int, i: int, live: dict) -> None:
    print(f"rank {RANK}: at the {kind} peak (event {i}): {now / 2**30:.3f} GiB {kind}; live tensors by group "
          f"(MiB, count):", file=OUT)
    for name, (size, count) in sorted(live["live"].items(), key=lambda kv: -kv[1][0]):
        print(f"    {size / MIB:10.1f} MiB  x{count:<4d} {name}", file=OUT)
    total = sum(s for s, _ in live["live"].values())
    print(f"    {total / MIB:10.1f} MiB  in all", file=OUT)
    segs = sorted(live["segments"].values(), key=lambda s: -s[0])
    print(f"  segments holding a live tensor: {len(segs)}, {sum(s[0] for s in segs) / MIB:.1f} MiB, of them free "
          f"{sum(s[1] for s in segs) / MIB:.1f} MiB; the largest (MiB size, free, held by):", file=OUT)
    for size, free, held in segs[:12]:
        print(f"    {size / MIB:9.1f} {free / MIB:9.1f}  {', '.join(held[:6])}{' ...' if len(held) > 6 else ''}",
              file=OUT)


def traced_settled(static, step, *, min_steps, max_steps, expandable=False, cap_bytes=None, perturb=None):
    """allocator.settled_replay as one sequence: the static events and every step it plays (the same rule, played
    here to find the steps), handed to `traced` so a settled replay (FSDP2's, Megatron-LM's) is traced as one.
    A replay under a cap or changed by `perturb` (evaluate's range, planner/cost/reserve_range.py) is not a rank's own:
    played as it is, untraced."""
    if cap_bytes is not None or perturb is not None:
        return settled(static, step, min_steps=min_steps, max_steps=max_steps, expandable=expandable,
                       cap_bytes=cap_bytes, perturb=perturb)
    if len(calls) == RANK and MIN_STEPS:  # at least MIN_STEPS steps on the traced rank, whatever the settling
        min_steps, max_steps = MIN_STEPS, max(max_steps, MIN_STEPS)
    events = list(static)
    state = CachingAllocator(expandable=expandable)
    allocator.play(state, events)
    for index in range(max_steps):
        peaks = (state.allocated_peak, state.reserved_peak)
        played = list(step(index))
        allocator.play(state, played)
        events += played
        if index >= min_steps - 1 and (state.allocated_peak, state.reserved_peak) == peaks:
            break
    return traced(events, expandable=expandable)


settled = allocator.settled_replay
allocator.replay = traced
allocator.settled_replay = traced_settled

if __name__ == "__main__":
    sys.exit(stage_terms.main(sys.argv[1:]))
