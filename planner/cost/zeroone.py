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

A rank of several chunks (interleaved 1F1B, ZB, ZBV, DualPipeV) builds one module over all its chunks' layers and one
ZeroRedundancyOptimizer over its parameters() (planner/runtime/worker.py _build; a tied tensor its chunks share once:
§904), so the partition is of the union, not of each chunk apart (§905): stage_sums charges each chunk's own
(`layers_excess_bytes`) and the rank's cost swaps their sum for the union's (`rank_excess_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.cost import dataparallel, stepcounts
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup


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


def layers_excess_bytes(layers: Sequence[LayerCost], *, profile: Profile, setup: TrainSetup,
                        tied: Sequence[int] = ()) -> float:
    """`excess_bytes` of one optimizer over `layers`' trained tensors (`setup` counts the pipeline's stages, which says
    whether a tied head's tensor is its own: LayerCost.zero_one_numels), less `tied`: tensors (their numels) another
    of the layers holds, partitioned once."""
    numels = stage_numels(layer.zero_one_numels(setup.pipeline.stages) for layer in layers)
    once = [numel for numel in tied if numels is None or numel in numels]  # an untrained tied tensor is not among them
    for numel in once if numels is not None else ():
        numels.remove(numel)
    return excess_bytes(numels, param_count=sum(layer.trained_count for layer in layers) - sum(once),
                        largest=max(layer.largest_trained_count for layer in layers), setup=setup,
                        step_bytes=stepcounts.per_tensor_bytes(profile, setup))


def tied_copies(profile: Profile, chunks: Sequence[set[str]]) -> list[int]:
    """The numels of the tied tensors a rank's chunks (their layer names) hold beyond the first holder's: one module
    over the chunks holds each once (as rules.rank_tied_once_bytes)."""
    return [item.param_count for item in profile.tied
            for _ in range(item.extra_holders(chunks))]


def rank_excess_bytes(chunks: Sequence[Sequence[LayerCost]], *, profile: Profile, setup: TrainSetup) -> float:
    """What a rank of several chunks holds beyond its chunks' `layers_excess_bytes` (each charged with its stage):
    its one optimizer's partition of all their tensors (a tied one once) less theirs apart; 0 for one chunk."""
    if len(chunks) < 2 or not dataparallel.whole_tensor_optim_bytes(setup):
        return 0.0
    tied = tied_copies(profile, [{layer.name for layer in chunk} for chunk in chunks])
    union = layers_excess_bytes([layer for chunk in chunks for layer in chunk], profile=profile, setup=setup, tied=tied)
    return union - sum(layers_excess_bytes(chunk, profile=profile, setup=setup) for chunk in chunks)
