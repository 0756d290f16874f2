"""The caching allocator's modes on each rank of a replayed row: the same requests replayed under orders and sizes
that differ where the sequence is not fixed, and the reserve each variant lands in (docs/published-runs.md §33.modes).

A diagnostic, not a cost term. Each rank's settled replay (allocator.settled_replay, or allocator.replay) is played
again with one perturbation applied to its static events and to every step it plays (settled the same way):

  read        the sequence as the cost model plays it (must equal the harness's figure)
  frees       every run of consecutive frees reversed: which of two tensors freed at the same instant goes first
              (the allocator's free_block / try_merge_blocks coalesce a block with its free neighbours, so the
              free blocks after a run are the same in either order: this variant checks that)
  free_first  every allocation that directly precedes a run of frees moved after them: the request served after the
              frees of the same point rather than before (an op's output is allocated before its inputs' last
              reference drops, so this is NOT torch's order where the frees are the op's inputs: it bounds ckplan's
              grouping of a point's frees, not the code)
  alloc_first every allocation that directly follows a run of frees moved before them (the other side)
  grow, shrink every request of at least BIG_MIB (default 512) MiB one kRoundLarge (2 MiB) larger / smaller: how far
              a large transient's size decides the mode (ckplan's byte counts, not the code's order)

usage: [RANKS=7] [VARIANTS=read,frees,...] [BIG_MIB=512] PYTHONPATH=<checkout> python scripts/reserve_modes.py
       <ckplan evaluate arguments>
prints one line per rank and variant (reserved GiB), then per rank the range [low, high] over the variants.

       PYTHONPATH=<checkout> python scripts/reserve_modes.py rows M17,M18 [--work DIR]
the harness's rows (scripts/published_rows.toml, their profiles made by `published_rows.py profiles`): each rank's
reserve and its range as evaluate --json gives it (planner/cost/replayed_reserve.py reserved_range: grow and
shrink above), and per row which verdicts the range decides: within 10% of the published reserve (the row's
maximum over ranks at both ends), and where both M17 and M18 are given, their order."""
import os
import sys

OUT = sys.__stdout__  # the CLI runner captures sys.stdout

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import allocator  # noqa: E402
from planner.cost.allocator import Alloc, Free  # noqa: E402

GIB, MIB = 2**30, 2**20
RANKS = {int(r) for r in os.environ.get("RANKS", "").split(",") if r}
BIG = int(float(os.environ.get("BIG_MIB", "512")) * MIB)


def frees_reversed(events):
    out, run = [], []
    for event in events:
        if type(event) is Free:
            run.append(event)
            continue
        out += run[::-1]
        run = []
        out.append(event)
    return out + run[::-1]


def free_first(events):
    """An Alloc followed by a run of Frees (of other keys): the Frees first."""
    out, i, n = [], 0, len(events)
    while i < n:
        event = events[i]
        if type(event) is Alloc:
            j = i + 1
            while j < n and type(events[j]) is Free and events[j].key != event.key:
                j += 1
            out += events[i + 1:j]
            out.append(event)
            i = j
            continue
        out.append(event)
        i += 1
    return out


def alloc_first(events):
    """A run of Frees followed by an Alloc (of another key): the Alloc first."""
    out, run = [], []
    for event in events:
        if type(event) is Free:
            run.append(event)
            continue
        if type(event) is Alloc and run and all(f.key != event.key for f in run):
            out.append(event)
            out += run
        else:
            out += run
            out.append(event)
        run = []
    return out + run


def resized(delta):
    def change(events):
        return [Alloc(e.key, e.nbytes + delta, e.stream) if type(e) is Alloc and e.nbytes >= BIG else e
                for e in events]
    return change


VARIANTS = {"read": list, "frees": frees_reversed, "free_first": free_first, "alloc_first": alloc_first,
            "grow": resized(2 * MIB), "shrink": resized(-2 * MIB)}
CHOSEN = [v for v in os.environ.get("VARIANTS", ",".join(VARIANTS)).split(",") if v]
original_settled, original_replay = allocator.settled_replay, allocator.replay
ranks: list[dict[str, float]] = []


def settled(static, step, *, min_steps, max_steps, expandable=False, cap_bytes=None, perturb=None):
    if perturb is not None:  # evaluate's own range (planner/cost/reserve_range.py), not a rank's replay
        return original_settled(static, step, min_steps=min_steps, max_steps=max_steps, expandable=expandable,
                                cap_bytes=cap_bytes, perturb=perturb)
    rank = len(ranks)
    static = list(static)
    figures = {}
    if not RANKS or rank in RANKS:
        for name in CHOSEN:
            change = VARIANTS[name]
            played = original_settled(change(static), lambda index, change=change: change(list(step(index))),
                                      min_steps=min_steps, max_steps=max_steps, expandable=expandable)
            figures[name] = played.reserved_peak_bytes / GIB
            print(f"rank {rank} {name:11s} reserved {figures[name]:7.2f} GiB", file=OUT, flush=True)
    ranks.append(figures)
    return original_settled(static, step, min_steps=min_steps, max_steps=max_steps, expandable=expandable,
                            cap_bytes=cap_bytes)


def replay(events, *, expandable=False, cap_bytes=None, perturb=None, **kwargs):
    return settled(list(events), lambda index: [], min_steps=1, max_steps=1, expandable=expandable,
                   cap_bytes=cap_bytes) if not kwargs else original_replay(events, expandable=expandable,
                                                                            cap_bytes=cap_bytes, **kwargs)


allocator.settled_replay = settled
allocator.replay = replay


def summary() -> None:
    for rank, figures in enumerate(ranks):
        if figures:
            low, high = min(figures.values()), max(figures.values())
            moved = [name for name, value in figures.items() if abs(value - figures.get("read", value)) >= 0.005]
            print(f"rank {rank}: range [{low:.2f}, {high:.2f}] GiB, read {figures.get('read', float('nan')):.2f}; "
                  f"moved by: {', '.join(moved) or 'none'}", file=OUT)


def rows(only: str, work: str | None) -> int:
    """Each named row's ranks: reserved, low, high (GiB); the row's maximum at each end against the published."""
    import published_rows  # noqa: E402  (the harness beside this file)

    from planner.cost.replayed_reserve import reserved_variants

    allocator.settled_replay, allocator.replay = original_settled, original_replay  # the cost model's own
    table = {row.id: row for row in published_rows.load_table().rows}
    folder = published_rows.Path(work) if work else published_rows.WORK
    ends, same = {}, {}  # same: the row as read, then under each change applied to every rank
    for name in only.split(","):
        row = table[name]
        stages, profile, setup, cost = published_rows.capture(published_rows.evaluate_args(row, folder))
        found, by_variant = [], []
        for rank, (plan, stage) in enumerate(zip(stages, cost.stages)):
            figures = reserved_variants(stage, plan, rank, profile=profile, setup=setup) or []
            by_variant.append(figures or None)
            found.append((min(stage.reserved_bytes, *figures), max(stage.reserved_bytes, *figures)) if figures else None)
            print(f"{name} rank {rank}: reserved {stage.reserved_bytes / GIB:6.2f} GiB; a page larger, smaller: "
                  f"{', '.join(f'{f / GIB:6.2f}' for f in figures) or '-'}", file=OUT, flush=True)
        read = max(stage.reserved_bytes for stage in cost.stages)
        low = max((span or (s.reserved_bytes,) * 2)[0] for span, s in zip(found, cost.stages))
        high = max((span or (s.reserved_bytes,) * 2)[1] for span, s in zip(found, cost.stages))
        ends[name] = (low, read, high)
        if all(by_variant):  # every rank under the same change: the row's reserve a page larger, a page smaller
            rows_of = [max(figures[v] for figures in by_variant) for v in range(len(by_variant[0]))]
            same[name] = [read, *rows_of]
            print(f"{name}: the row (max over ranks) a page larger, smaller: "
                  f"{', '.join(f'{r / GIB:.2f}' for r in rows_of)}", file=OUT, flush=True)
        published = row.memory_bytes
        verdict = ""
        if published and row.memory_kind == "reserved":
            ok = [0.9 <= end / published <= 1.1 for end in (low, high)]
            verdict = (f"; published {published / GIB:.2f}: ratios {low / published:.3f}-{high / published:.3f}, "
                       f"within 10% {'at both ends' if all(ok) else 'at neither end' if not any(ok) else 'at one end only'}")
        print(f"{name}: row {read / GIB:.2f} GiB in [{low / GIB:.2f}, {high / GIB:.2f}]{verdict}", file=OUT, flush=True)
    if "M17" in ends and "M18" in ends:
        (l17, r17, h17), (l18, r18, h18) = ends["M17"], ends["M18"]
        decided = "held at every end" if l17 > h18 else "lost at every end" if h17 < l18 else "not decided by the range"
        print(f"order (1F1B M17 above interleaved M18, as measured): read {'held' if r17 > r18 else 'lost'}; {decided}",
              file=OUT)
        if "M17" in same and "M18" in same:  # the same change of ckplan's sizes in both rows (one profile, one block)
            print("order under each change applied to both rows (read, a page larger, smaller): " + ", ".join(
                f"{'held' if a > b else 'lost'} by {abs(a - b) / GIB:.2f}" for a, b in zip(same["M17"], same["M18"])),
                file=OUT)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["rows"]:
        sys.exit(rows(sys.argv[2], sys.argv[4] if sys.argv[3:4] == ["--work"] else None))
    code = stage_terms.main(sys.argv[1:])
    summary()
    sys.exit(code)
