"""Two helpers every MILP row module shares (milp_rows, milp_ranks, milp_moments), below them all: a layer's
quantities under an option, and a binary for "a count is positive"."""

from __future__ import annotations

import pulp

from planner.cost import costmodel
from planner.cost.costmodel import LayerCost


def _layer(problem, quantities, layer: LayerCost, option: int = 0) -> float:
    return sum(costmodel.layer_value(q, layer, option, problem.ctx) for q in quantities)


def _presence(problem, name: str, count, size: int):
    """A binary that is 1 when `count` (0..size) is positive; the count itself when size is 1."""
    if size == 1:
        return count
    flag = pulp.LpVariable(name, cat="Binary")
    problem.lp += size * flag >= count, f"{name}_link"
    return flag
