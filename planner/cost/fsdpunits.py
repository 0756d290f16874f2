"""FSDP2's units: which of a model's layers a runtime shards as one unit (one all-gather, one
reduce-scatter), which units it keeps gathered from their forward to the end of their backward,
and so what FSDP2 holds beyond the sharded state at each moment of a one-stage step under ZeRO 3
resharded after every forward (torchtitan without a pipeline, ckplan's runtime) or ZeRO 2 kept
gathered to each unit's post-backward (ckplan's runtime), and a 1F1B or GPipe stage of ckplan's runtime over
its own layers (beside_pipeline; gathered.stage_unit_moments, §399-§401); where a pipeline keeps its units whole
every unit stays gathered and is charged whole in static (dataparallel.kept_whole).

A runtime's record says how (RuntimeFacts.fsdp_units, fsdp_gathered_from_forward). "largest-layer"
keeps a buffer term, a constant per stage of the model's largest layer (dataparallel.unsharded_bytes).
Otherwise the units are charged per moment, for one microbatch, with i an index into the model's
layers and each unit a set of them (the layers sharing a parameter one unit: unit_of_layers).
Read at torch 2.13.0 (torch/distributed/fsdp/_fully_shard/; docs/framework-facts.md §329-§334):
  the loss (the end of the forward, on the last stage): the gathered weights of the units kept
      gathered from their forward on; no gradient exists yet
  a unit's copy-out, as its first layer's forward begins: its all-gather output, the previous unit's
      (still referenced until the copy-out ends), its unsharded weights and the units gathered then;
      the last layer's forward: the last all-gather output, kept to the root's post-forward
      (forward_bytes)
  layer i's backward (its forward and recompute hold a subset): gathered, each unit once, the
      unit of i, the unit of i - 1 (FSDP2's backward prefetch of the unit before it in forward
      order), every unit kept gathered from its forward whose backward has not ended (its first
      layer at or before i), and every unit of several layers whose backward is under way (a group's
      pre-backward at its last layer, its post-backward after its first); the unsharded gradients,
      in the weights' dtype, of the layers of those units whose backward is done (reduced in the
      unit's post-backward, after its first layer's backward) and, by the end of i's backward, i's
      own (autograd makes each as the backward reaches it: none at its start); the reduce-scatter
      input (reduce dtype) of the unit reduced before, kept until the next post-backward
  layer i's unit's post-backward, where i is its first layer, after the layer's own backward scratch
      is freed: the unit resharded (_fsdp_param_group.py 637-638: reshard before the reduce), the
      others as above, the gradients, and its own reduce-scatter input alone (FSDP2 waits on the
      previous reduce-scatter and drops its input before the next copy-in: 647-658, foreach_reduce
      at 688; reduce_scatter_max_input_buffers = 1 at 112).
Under ZeRO 2 nothing is gathered in the backward (the weights stay whole from the forward, in static):
the all-gather outputs, the gradients and the reduce-scatter inputs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from planner.cost import dataparallel, runtimes
from planner.schema import TrainSetup


def unit_of_layers(num_layers: int, grouping: str, tied: Sequence[Sequence[int]] = ()) -> list[int]:
    """Each layer's unit (an index per unit, in forward order of first use): "per-layer" every layer
    its own; "root-ends" the first and the last layer one unit (torchtitan's root `fully_shard(model)`
    holding tok_embeddings, norm and output), every other layer its own. The layers of each `tied` set
    (indices of layers sharing a parameter) are one unit with the first of them: FSDP2 refuses a parameter
    two groups manage (torch 2.13 _fsdp_state.py 217-229: "use fully_shard([module_a, module_b])"), so a
    runtime shards them together (ckplan's planner/runtime/mesh.py _units; torchtitan b5bcd76c
    distributed/fsdp.py 238-249, tok_embeddings in the [norm, lm_head] unit)."""
    if grouping == "per-layer" or num_layers < 3:
        units = list(range(num_layers))
    elif grouping == "root-ends":
        units = [0, *range(1, num_layers - 1), 0]
    else:
        raise ValueError(f"unknown FSDP2 unit grouping {grouping!r}")
    for holders in tied:
        joined = {units[j] for j in holders}
        units = [units[min(holders)] if u in joined else u for u in units]
    order = list(dict.fromkeys(units))  # renumbered in forward order of first use
    return [order.index(u) for u in units]


def gathered_from_forward(units: Sequence[int], held: Sequence[str]) -> set[int]:
    """The units kept gathered from their forward to the end of their backward, named in the
    record by the layer they hold: "first" (the model's first layer), "last", "before-last"."""
    at = {"first": 0, "last": len(units) - 1, "before-last": len(units) - 2}
    return {units[at[name]] for name in held}


def charged_per_moment(setup: TrainSetup, grouping: str) -> bool:
    """Whether the units are charged per moment: ZeRO 2 or 3 sharded per microbatch over a shard group of 2
    or more, under a record whose units were read (not "largest-layer", nor "submodules": DeepSpeed's
    coordinator, planner/cost/deepspeed_terms.py; nor "megatron-fsdp": planner/cost/megatron_fsdp.py), on one
    stage or beside a pipeline (beside_pipeline)."""
    return (grouping not in ("largest-layer", "submodules", "megatron-fsdp") and setup.data_parallel.zero >= 2
            and (setup.pipeline.stages == 1 or beside_pipeline(setup, grouping)) and dataparallel.shard_size(setup) > 1
            and not dataparallel.kept_whole(setup))


def beside_pipeline(setup: TrainSetup, grouping: str) -> bool:
    """Whether a pipeline's stages are charged per moment: units of one layer each ("per-layer": a stage's units
    are its own layers', the stage's root holding none, so they follow the split), reduced every microbatch
    (not kept whole), under 1F1B or GPipe (one stage per rank and a full backward: §399-§401). Elsewhere beside a
    pipeline the largest layer's term (a root unit spans the model's ends; a chunked or split backward not read)."""
    return (setup.pipeline.stages > 1 and grouping == "per-layer" and setup.pipeline.chunks == 1
            and setup.pipeline.schedule in ("1F1B", "GPipe") and not dataparallel.kept_whole(setup))


def warm_up(setup: TrainSetup, stage: int) -> int:
    """The forwards stage `stage` runs before its first backward: 1F1B's min(P - s, M), GPipe's M."""
    from planner.cost.schedules import one_chunk_in_flight

    return one_chunk_in_flight(setup.pipeline.schedule, num_ranks=setup.pipeline.stages,
                               num_microbatches=setup.pipeline.microbatches, rank=stage)


def stray_prefetch(setup: TrainSetup, stage: int) -> bool:
    """Whether stage `stage`'s first backward finds its last unit's all-gather output prefetched by its first
    unit and held to the backward's end (§400): two or more forwards before it (warm_up), whose units FSDP2's
    post-forward order lists twice; the backward prefetches the unit before in that order, for the first unit
    the last unit of the forward before, which never waits on it."""
    return warm_up(setup, stage) >= 2


def regathered_per_moment(setup: TrainSetup, grouping: str) -> bool:
    """Whether each unit is gathered again for every forward and backward and its collectives are timed in
    FSDP2's stream order (planner/cost/fsdp2work.py, nccl_sms.py, reserve_fsdp2.py): charged per moment under
    ZeRO 3, where the record's FSDP2 streams were read (fsdp2_step_replayed: torchtitan's; ckplan's runtime
    keeps dataparallel.exposed_comm_ms alone, its units' timing not read; ZeRO 2 gathers a unit once a
    microbatch, in its forward)."""
    return (charged_per_moment(setup, grouping) and setup.data_parallel.zero >= 3
            and runtimes.of(setup.training).fsdp2_step_replayed)


class Moments(NamedTuple):
    """What FSDP2 holds beyond the sharded state at three moments of layer i's backward (the module's
    docstring): `start` with none of the layer's own gradients made yet, `end` with all of them (the layer's
    saved tensors freed by then), `after` its unit's post-backward where i is the unit's first layer (else 0)."""

    start: float
    end: float
    after: float


def _units(params: Sequence[float], grouping: str, tied: Sequence[Sequence[int]]):
    units = unit_of_layers(len(params), grouping, tied)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    unit_params: dict[int, float] = {}
    for j, (u, p) in enumerate(zip(units, params)):
        first.setdefault(u, j)
        last[u] = j
        unit_params[u] = unit_params.get(u, 0.0) + p
    return units, first, last, unit_params


def own_unit(params: Sequence[float], fp8: Sequence[float], i: int, *, grouping: str,
             tied: Sequence[Sequence[int]] = (), **_) -> tuple[float, float]:
    """Layer i's unit's parameters on the rank and its Float8 weights among them (the units' arguments as
    layer_moment_bytes takes them)."""
    units = unit_of_layers(len(params), grouping, tied)
    return (sum(p for p, u in zip(params, units) if u == units[i]),
            sum(f for f, u in zip(fp8, units) if u == units[i]))


def _gathered(params, fp8, units, chosen: set[int], setup: TrainSetup) -> float:
    """The units `chosen` gathered: 0 under ZeRO 2, whose weights stay gathered from their forward to their
    post-backward and are charged whole in static (dataparallel.bytes_per_param)."""
    if setup.data_parallel.zero < 3:
        return 0.0
    return sum(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f, u in zip(params, fp8, units) if u in chosen)


def loss_moment_bytes(params: Sequence[float], fp8: Sequence[float], setup: TrainSetup, *,
                      grouping: str, held: Sequence[str], tied: Sequence[Sequence[int]] = ()) -> float:
    """What FSDP2 holds gathered at the loss: the units kept gathered from their forward on. `params`
    and `fp8` are each layer's parameters held on the rank (a parameter its unit shares with an earlier
    layer counted there only) and its Float8 weights among them."""
    units = unit_of_layers(len(params), grouping, tied)
    return _gathered(params, fp8, units, gathered_from_forward(units, held), setup)


def forward_bytes(params: Sequence[float], fp8: Sequence[float], i: int, setup: TrainSetup, *,
                  grouping: str, held: Sequence[str], tied: Sequence[Sequence[int]] = (),
                  every_end: bool = False) -> tuple[float, float]:
    """(copy-out, end): what FSDP2 holds as layer i's forward begins, where i is its unit's first layer (else 0),
    and as the model's last layer ends its forward (else 0). The copy-out into the unit's unsharded parameters
    runs with its own all-gather output and the previous unit's, which FSDP2 drops only once the copy-out is
    done (torch 2.13 _fsdp_param_group.py 429-432: the dropped state still referenced by `prev_all_gather_state`
    until wait_for_unshard returns; 463 the copy-out; 480-489 its own output kept), beside the units gathered
    then; the last layer's forward keeps the last all-gather output until the root's post-forward
    (_fsdp_state.py 334-342). Under ZeRO 2 the outputs alone (the weights are in static). `every_end`: every
    layer's end (beside a pipeline, where a layer may be its stage's last and the split is not known: each layer's
    all-gather output lives through its forward to the next copy-out, a moment every layer has, §400)."""
    units, first, last, unit_params = _units(params, grouping, tied)
    kept = gathered_from_forward(units, held)

    def output(u: int) -> float:
        return dataparallel.gathered_bytes(unit_params[u], setup, fp8_count=sum(f for f, v in zip(fp8, units) if v == u))

    copy_out, end = 0.0, 0.0
    own = units[i]
    if first[own] == i:
        previous = [u for u in first if first[u] < i]
        under_way = {u for u in previous if i <= last[u]} | (kept & set(previous))
        copy_out = _gathered(params, fp8, units, under_way | {own}, setup) + output(own) \
            + (output(max(previous, key=first.get)) if previous else 0.0)
    if every_end:
        end = _gathered(params, fp8, units, {own} | kept, setup) + output(own)
    elif i == len(params) - 1:
        latest = max(first, key=first.get)  # the unit whose all-gather came last in the forward
        end = _gathered(params, fp8, units, {own} | kept, setup) + output(latest)
    return copy_out, end


def layer_moment_bytes(params: Sequence[float], fp8: Sequence[float], i: int, setup: TrainSetup, *,
                       grouping: str, held: Sequence[str], tied: Sequence[Sequence[int]] = ()) -> Moments:
    """Layer i's backward moments (Moments; the module's docstring)."""
    units, first, last, unit_params = _units(params, grouping, tied)
    kept = gathered_from_forward(units, held)
    own = units[i]
    running = {u for u in first if first[u] <= i <= last[u]}  # pre-backward at their last layer, post at their first
    others = ({units[i - 1]} if i > 0 else set()) | {u for u in kept if first[u] <= i} | (running - {own})
    held_bytes = dataparallel.param_bytes(setup)
    later_grads = sum(params[j] for j in range(i + 1, len(params)) if units[j] in running) * held_bytes.weights
    own_grads = params[i] * held_bytes.weights
    before = next((units[j] for j in range(i + 1, len(params)) if first[units[j]] > i), None)  # reduced last
    scattered = unit_params[before] * held_bytes.grads if before is not None else 0.0
    # HSDP: every reduced unit's reduce-scatter output, the all-reduce's input, kept to the backward's end
    # (_fsdp_param_group.py 760-762, cleared in finalize_backward 763-768)
    shards = dataparallel.reduced_bytes_per_param(setup)
    reduced = sum(unit_params[u] for u in first if first[u] > i) * shards
    computing = _gathered(params, fp8, units, others | {own}, setup) + later_grads + scattered + reduced
    after = 0.0
    if first[own] == i:
        # post-backward: the unit resharded, then its reduce-scatter input made once the previous one is dropped
        after = _gathered(params, fp8, units, others - {own}, setup) + later_grads + own_grads \
            + unit_params[own] * (held_bytes.grads + shards) + reduced
    return Moments(computing, computing + own_grads, after)
