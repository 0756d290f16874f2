"""The quantities every cost term adds to, and how each combines into a stage's cost: the stage accumulator
(assembly.stage_sums), the DP's chain and the MILP's rows read these declarations (planner/cost/terms.py holds
the rows that add to them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Quantity:
    """One quantity a term adds to, and how a stage's values of it combine (one of COMBINE):
    the stage accumulator (stage_cost), the DP's chain and the MILP's rows all read `combine`,
    so a quantity that combines as an existing one does is one declaration here, no solver edit."""

    name: str
    combine: str
    meaning: str


# How each kind of quantity enters a stage's cost, and what the solvers may prune by (every kind grows with each
# layer a stage takes, none falls: the DP's Pareto fronts and the MILP's windows rest on that):
COMBINE = {
    "held": "bytes held all iteration: added up, into the peak as they are",
    "kept": "bytes per microbatch until its backward: added up, times the in-flight microbatches",
    "extra": "a layer's peak beyond what it keeps: the largest, net of what the layers after it keep",
    "scratch": "the optimizer step's temporaries: cuda added up, cpu twice the largest",
    "host": "host bytes of the rank: added up, against its share of its node's host memory",
    "offloaded": "host bytes per microbatch: added up, times the in-flight microbatches, into host",
    "busy": "ms per microbatch on the critical path: added up",
    "step": "ms once per iteration: added up",
    "split": "a split backward's bytes per pass (chunked zero-bubble schedules): see schedules.ChunkBytes",
}


QUANTITY_DECLARATIONS: tuple[Quantity, ...] = (
    Quantity("static", "held", "weights, gradients, optimizer state"),
    Quantity("buffers", "held", "receive buffers, the batch, FSDP2's gathered tensors"),
    Quantity("kept", "kept", "activations kept for backward"),
    Quantity("extra", "extra", "a layer's scratch and what its option recomputes at once"),
    Quantity("scratch", "scratch", "the optimizer step's temporaries"),
    Quantity("host", "host", "the offloaded optimizer on the host"),
    Quantity("offloaded", "offloaded", "activations offloaded to the host"),
    Quantity("time", "busy", "compute per microbatch"),
    Quantity("comm", "busy", "sends and schedule actions per microbatch"),
    Quantity("step", "step", "optimizer step, gradient reduction, weight gathers"),
    Quantity("wgrad", "split", "what a split backward's input pass leaves for its weight pass"),
    Quantity("ipeak", "split", "a split backward's input pass over what is live before it"),
    Quantity("wpeak", "split", "a split backward's weight pass over what is live before it"),
    Quantity("wfirst", "split", "a split backward's weight pass's first parameter group over what is live before it"),
    Quantity("wcarry", "split", "what a split backward's weight pass leaves of a layer while the next layer's runs"),
    Quantity("wleft", "split", "what a split backward's weight pass leaves of a layer to the stage's pass's end"),
)


QUANTITIES = tuple(q.name for q in QUANTITY_DECLARATIONS)


def declared() -> list[str]:
    """Every declared quantity's name (read when asked, like quantities())."""
    return [q.name for q in QUANTITY_DECLARATIONS]


def quantities(combine: str) -> tuple[str, ...]:
    """The declared quantities that combine as `combine` (read when asked: a declaration added
    later is seen by every solver)."""
    return tuple(q.name for q in QUANTITY_DECLARATIONS if q.combine == combine)
