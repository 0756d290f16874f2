"""ZeRO 1 where the runtime's record says it partitions whole tensors (ckplan's runtime: torch's
ZeroRedundancyOptimizer; Megatron-LM's, DeepSpeed's and ColossalAI's flat buffers split evenly and hold no excess).

ZeroRedundancyOptimizer._partition_parameters (torch 2.13.0 torch/distributed/optim/zero_redundancy_optimizer.py
680-703, docs/framework-facts.md §859) walks each parameter group's tensors sorted by numel, largest first (Python's
stable sort), and gives each to the rank with the fewest elements so far (_get_min_index: the first such rank); the
loads carry across groups (the runtime passes one: planner/runtime/mesh.py zero_one). Each rank's local optimizer
keeps state for its tensors only: Adam's two moments per element and, on the CPU, one step count per tensor
(stepcounts.py). The rest of the cost model charges o x params / K and every tensor's step count on each rank; the
fullest rank holds `excess_bytes` beyond that, exact where the profile records each trained tensor's size
(LayerProfile.trained_param_numels), else o x max(0, largest - params / K), the bound profiles made before it
keep (the partition's result where the other tensors are small beside the largest).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.cost import dataparallel
from planner.schema import TrainSetup


def greedy_loads(numels: Iterable[int], ranks: int) -> list[list[int]]:
    """Each rank's tensors (their numels) as ZeroRedundancyOptimizer partitions them: largest first, each to the
    first rank with the fewest elements so far."""
    loads, held = [0] * ranks, [[] for _ in range(ranks)]
    for numel in sorted(numels, reverse=True):
        rank = loads.index(min(loads))
        loads[rank] += numel
        held[rank].append(numel)
    return held


def excess_bytes(numels: Sequence[int] | None, *, param_count: float, largest: int, setup: TrainSetup,
                 step_bytes: int = 0) -> float:
    """The fullest rank's optimizer state beyond what static charges every rank: the stage's trained tensors
    `numels` partitioned, its most loaded rank's o x elements + step counts (`step_bytes` each,
    stepcounts.per_tensor_bytes) less o x their elements / K and all their step counts; where the sizes are not
    known (None), o x max(0, `largest` - `param_count` / K). 0 where no rank holds whole tensors
    (dataparallel.whole_tensor_optim_bytes)."""
    optim = dataparallel.whole_tensor_optim_bytes(setup)
    if not optim or numels is None:
        return dataparallel.zero_one_excess_bytes(param_count, largest, setup)
    ranks = dataparallel.shard_size(setup)
    fullest = max(optim * sum(held) + step_bytes * len(held) for held in greedy_loads(numels, ranks))
    return fullest - optim * sum(numels) / ranks - step_bytes * len(numels)


def stage_numels(per_layer: Iterable[tuple[int, ...] | None]) -> list[int] | None:
    """The stage's trained tensors from its layers' (LayerCost.zero_one_numels); None where a layer's are not known."""
    numels = []
    for layer in per_layer:
        if layer is None:
            return None
        numels += layer
    return numels
