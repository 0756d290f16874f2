"""A run's option order in a stage whose backward splits (planner/solve/milp_ranks.py): where the input pass's peak
and the weight pass's carry depend on which of the run's layers comes first, the MILP chooses the order.

problem.order places a run's options largest extra peak first, none last: the order that minimises the B pass's
transient. A split stage past the pipeline's first runs no B where the schedule has none there (ZB, ZBV: I and W
only), and its input pass (layers last to first, each on what the later ones leave for W: rules.input_pass_peak_bytes)
and weight pass (a carry from each layer into the next one's first group: wgroups.weight_pass_peak_bytes) prefer
other orders, and the two passes different ones: a none layer of a run before a full one was 2.0-8.5% faster than
problem.order's plan on 4 of 120 brute-forced ZBV cases (docs/published-runs.md §67.milpexact, §69.milporder). So
there each of the run's positions in the stage takes an option of its own:

    x[k,g,j,o] ∈ {0,1}   position j of stage k's layers of run g is under option o (none, 0, among them)
    Σ_o x[k,g,j,o] ≤ Σ_o x[k,g,j-1,o]        the present positions come first (one option each)
    Σ_j Σ_o x[k,g,j,o] = n[k,g],   Σ_j x[k,g,j,o] = r[k,g,o]   the counts the other rows read

and the passes' rows (milp_ranks._input_pass_bound, _weight_pass_bound) run over the positions in order, each
position's figures Σ_o figure_o·x[k,g,j,o]. Where the run's options carry alike (_first_only) one position, the
run's first layer, suffices, the rest placed in input_order. Nowhere else: a stage with a B (the pipeline's first,
DualPipeV's), whose transient rows read problem.order; a run of one layer; a run whose options' split figures are all
equal (the order changes nothing); a schedule that does not split."""

from __future__ import annotations

import pulp

from planner.solve.milp_parts import _layer

# the split figures a position's rows read (milp_ranks): input pass, what it leaves for W, weight pass, first group,
# carry, what the carry leaves to the pass's end
SPLIT_QUANTITIES = ("ipeak", "wgrad", "wpeak", "wfirst", "wcarry", "wleft")


def positions(problem, k: int, g: int, n) -> list[dict] | None:
    """Stage k's positions of run g, each {option: x} (none, 0, last), made once; None where the order is
    problem.order's (module docstring). Where the run's options carry alike (_first_only), one position, the run's
    first layer, the rest after it in `input_order` (their slots: milp_ranks._slots)."""
    if (k, g) not in problem.positions:
        chosen = _chosen(problem, k, g, n)
        problem.positions[k, g] = None if not chosen else _make(problem, k, g, n, 1 if _first_only(problem, g) else None)
    return problem.positions[k, g]


def _chosen(problem, k: int, g: int, n) -> bool:
    """Whether stage k chooses run g's order: a split stage without a B, the run's options' split figures apart,
    and room for two of its layers."""
    if not _split_without_b(problem, k) or problem.runs[g].size < 2 or _most(n(k, g), problem.runs[g].size) < 2:
        return False
    return len({_figures(problem, g, o) for o in [*problem.order[g], 0]}) > 1


def _figures(problem, g: int, o: int) -> tuple:
    return tuple(_layer(problem, (q,), problem.runs[g].layer, o) for q in SPLIT_QUANTITIES)


def _first_only(problem, g: int) -> bool:
    """Whether every option of run g has a weight pass, carries the same into the next layer and leaves nothing to
    the pass's end. Then the weight pass's rows read the run's order only at its first layer (its first group on
    what the run before carries; every later layer's on the same carry), and the input pass's peak, for a given
    first layer, is least with the rest in input_order: a layer's row is its input peak a_o on what the later ones
    leave (b each), and two neighbours u before v with a_u - b_u > a_v - b_v charge max(a_u + b_v, a_v) ≥
    max(a_v + b_u, a_u) on the same rest, so swapping them lowers no row's maximum (rules.input_pass_peak_bytes).
    So the MILP chooses the first layer's option and places the rest so: exact, with one position."""
    figures = [dict(zip(SPLIT_QUANTITIES, _figures(problem, g, o))) for o in [*problem.order[g], 0]]
    return (all(f["wpeak"] > 0 and min(f["wleft"], f["wcarry"]) <= 0 for f in figures)
            and len({f["wcarry"] for f in figures}) == 1)


def input_order(problem, g: int) -> list[int]:
    """Run g's options (none, 0, among them) by input peak less what the layer leaves for W, least first (ties in
    problem.order's): _first_only's order after a run's first layer."""
    options = [*problem.order[g], 0]
    return sorted(options, key=lambda o: _layer(problem, ("ipeak",), problem.runs[g].layer, o)
                  - _layer(problem, ("wgrad",), problem.runs[g].layer, o))


def _split_without_b(problem, k: int) -> bool:
    """Stage k runs the split passes (past the pipeline's first) and no B (milp_ranks._rank_rows: only a B's
    moments read the transient, whose rows place the options in problem.order)."""
    order = problem.schedule
    if problem.outer is None or not order.splits_backward or k == 0:
        return False
    rank = order.stage_to_rank[k]
    chunk = order.stages_of(rank).index(k)
    return not any(a.kind == "B" and a.chunk == chunk for a in order.actions[rank])


def _most(count, size: int) -> int:
    """The most layers `count` (an int, a variable, or a difference of two prefix counts) can be: its bounds."""
    if isinstance(count, int):
        return count
    expression = pulp.LpAffineExpression(count)
    most = expression.constant
    for var, coef in expression.items():
        bound = var.upBound if coef > 0 else var.lowBound
        if bound is None:
            return size
        most += coef * bound
    return max(0, min(size, int(round(most))))


def _make(problem, k: int, g: int, n, first: int | None) -> list[dict]:
    """The positions' binaries and the rows that tie them to the counts (module docstring); `first`: 1 where only
    the run's first layer is a position (_first_only), its option one of the stage's."""
    lp, options = problem.lp, [*problem.order[g], 0]
    slots = [{o: pulp.LpVariable(f"x_{k}_{g}_{j}_{o}", cat="Binary") for o in options}
             for j in range(first or _most(n(k, g), problem.runs[g].size))]
    for j, slot in enumerate(slots):
        # [Constraint] one option a position, the present ones first
        lp += pulp.lpSum(slot.values()) <= (pulp.lpSum(slots[j - 1].values()) if j else 1), f"order_{k}_{g}_{j}"
    if first:
        # [Constraint] the first layer present where the stage holds the run, under one of its options
        size = problem.runs[g].size
        lp += size * pulp.lpSum(slots[0].values()) >= n(k, g), f"order_first_{k}_{g}"
        for o in problem.order[g]:
            lp += slots[0][o] <= problem.r[k, g, o], f"order_first_{k}_{g}_{o}"
        lp += slots[0][0] <= n(k, g) - pulp.lpSum(problem.r[k, g, o] for o in problem.order[g]), f"order_first_{k}_{g}_0"
        return slots
    lp += pulp.lpSum(x for slot in slots for x in slot.values()) == n(k, g), f"order_count_{k}_{g}"
    for o in problem.order[g]:
        lp += pulp.lpSum(slot[o] for slot in slots) == problem.r[k, g, o], f"order_option_{k}_{g}_{o}"
    return slots


def placed(problem, s: int, g: int, counts: dict[int, int]) -> list[int]:
    """Stage s's layers of run g, their options in order: the positions' where the MILP chose them (the solved
    values), else problem.order's, counts[o] of each, none last."""
    slots = problem.positions.get((s, g))
    if slots is None:
        return [o for o in [*problem.order[g], 0] for _ in range(counts[o])]
    chosen = [o for slot in slots for o, x in slot.items() if round(pulp.value(x) or 0) == 1]
    if len(slots) > 1 or not chosen:
        return chosen
    rest = {**counts, chosen[0]: counts[chosen[0]] - 1}  # _first_only: the rest in input_order
    return chosen + [o for o in input_order(problem, g) for _ in range(rest[o])]


def fixed_values(problem, s: int, g: int, options: list[int]) -> dict:
    """x's values for stage s's layers of run g under `options` in order ({} where problem.order places them)."""
    slots = problem.positions.get((s, g))
    if slots is None:
        return {}
    return {x: int(j < len(options) and options[j] == o) for j, slot in enumerate(slots) for o, x in slot.items()}
