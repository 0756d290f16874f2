"""What a data-parallel rank holds unsharded beside its shards: ZeRO 3's gathered weights and ZeRO 2/3's
unsharded gradient for the largest layer, FSDP2's units per moment (planner/cost/fsdpunits.py), Megatron-FSDP's
buffers (planner/cost/megatron_fsdp.py), and the reduce-scatter input FSDP2 keeps beside a pipeline: the value
functions terms.py's rows call for them. Pure functions; nothing here reads a file or prints."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from planner.cost import chunkedloss, dataparallel, fsdpunits, gloowork, megatron_fsdp, rules
from planner.cost.deepspeed_terms import charged as deepspeed_charged
from planner.cost.layers import LayerCost
from planner.cost.rules import layer_extra_bytes, runtime_facts
from planner.schema import Profile, TrainSetup


def unsharded_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """ZeRO 3's gathered weights in flight and ZeRO 2/3's one unsharded gradient, for the
    model's largest layer (dataparallel.unsharded_bytes): counted with the buffers, a
    constant per stage; 0 where the runtime's FSDP2 units are charged per moment instead
    (fsdp_unit_layer_bytes, fsdp_unit_loss_bytes), or DeepSpeed's submodules' (deepspeed_terms); Megatron-FSDP's
    own buffers where it runs (planner/cost/megatron_fsdp.py)."""
    if megatron_fsdp.runs(setup):
        return int(round(megatron_fsdp.buffer_bytes(profile, stage, setup)))
    if fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units) or deepspeed_charged(profile, setup):
        return 0
    largest, fp8 = max(_held_params(profile, setup))
    return int(round(dataparallel.unsharded_bytes(largest, setup, fp8_count=fp8)))


def kept_reduce_scatter_input_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """The reduce-scatter input FSDP2 keeps beside a pipeline from a stage's last backward to the
    next step's (its record's keeps_last_reduce_scatter_input): the whole gradients, in the reduce
    dtype, of the last FSDP2 group the stage reduces (torchtitan fully_shards each block and the
    root, and reduces them root first: a stage's last block), taken for the model's largest layer
    as unsharded_bytes takes it. 0 without a pipeline (FSDP2's own final callback drops it), without
    sharding, or where gradients are not kept whole through the microbatches."""
    if setup.pipeline.stages == 1 or not dataparallel.kept_whole(setup) or dataparallel.shard_size(setup) == 1:
        return 0.0
    if not runtime_facts(setup).keeps_last_reduce_scatter_input:
        return 0.0
    ep = setup.data_parallel.ep
    largest = max(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep
                  for layer in profile.layers)
    return largest * dataparallel.param_bytes(setup).grads


def _held_params(profile: Profile, setup: TrainSetup, layers=None) -> list[tuple[int, int]]:
    """Each layer's (parameters a rank holds, Float8 weights among them): under expert parallelism
    a layer holds 1/E of its routed experts. `layers`: those of the profile's layers (all by default)."""
    ep = setup.data_parallel.ep
    return [(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep,
             layer.float8.param_count if layer.float8 is not None else 0)
            for layer in (profile.layers if layers is None else layers)]


def _units_args(profile: Profile, setup: TrainSetup, names: Sequence[str] | None = None):
    """Each layer's parameters on the rank, its Float8 weights, and the units' arguments: a parameter several
    layers share (tied weights) is one FSDP2 parameter of their one unit (fsdpunits.unit_of_layers), counted at
    its first holder only. `names`: a pipeline stage's layers (its units alone); beside a pipeline no set is
    tied (each stage holds its own copy, its own unit: the embedding and the head are always split, and
    planner/runtime/tie.py sums the copies' sharded gradients after the step)."""
    layers = [layer for layer in profile.layers if names is None or layer.name in names]
    held = _held_params(profile, setup, layers)
    names = [layer.name for layer in layers]
    piped = setup.pipeline.stages > 1
    tied = [] if piped else [sorted(names.index(name) for name in item.layers) for item in profile.tied]
    shared = [0] * len(names)
    for item, holders in zip(profile.tied if not piped else (), tied):
        for j in holders[1:]:
            shared[j] += item.param_count
    record = runtime_facts(setup)
    return ([p - s for (p, _), s in zip(held, shared)], [f for _, f in held],
            dict(grouping=record.fsdp_units, held=record.fsdp_gathered_from_forward, tied=tied))


def fsdp_unit_layer_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup,
                          kept_bytes: Callable[[], float]) -> int:
    """What FSDP2 holds beyond the sharded state while `layer` (under `option`) runs, by the runtime's units
    (fsdpunits.layer_moment_bytes, forward_bytes), as an extra of the layer: the largest of its moments, each
    beside what the layer itself holds then. The start of its backward: its scratch, none of its gradients
    (autograd makes each as the backward reaches it); its end and its unit's post-backward: all of them, its
    scratch and saved tensors freed, its input's gradient made; its unit's copy-out as its forward begins:
    nothing of its own kept yet; the last layer's forward: its kept bytes. 0 where they are not charged per
    moment (unsharded_bytes holds the largest layer's instead). `kept_bytes`: the layer's kept bytes under `option`
    (terms.layer_value's "kept", asked only where the moments are charged).

    Beside a pipeline (fsdpunits.beside_pipeline) the split is not known here, so the layer is charged as if
    inside its stage (the unit before it prefetched, the previous all-gather output at its copy-out, the unit
    after it reduced last: none of them at a stage's ends), every layer's forward end (it may be its stage's
    last), and, where a stage's first backward follows two forwards or more, the largest layer's all-gather
    output a stage's first unit may prefetch (fsdpunits.stray_prefetch): never under a stage's own moments, which
    evaluate charges in its place (stage_unit_moments), as the DP does (planner/solve/dpmoments.py) and the MILP's
    cuts hold it to (planner/solve/milp_moments.py)."""

    if not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0
    params, fp8, units = _units_args(profile, setup)
    index = next(i for i, known in enumerate(profile.layers) if known.name == layer.name)
    piped = setup.pipeline.stages > 1
    stray = 0.0
    if piped and any(fsdpunits.stray_prefetch(setup, s) for s in range(setup.pipeline.stages)):
        stray = max(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f in zip(params, fp8))
    return _moment_extra(layer, option, profile, setup, kept_bytes(), params, fp8, index, units,
                         model_last=index == len(profile.layers) - 1, every_end=piped, stray=stray,
                         copy_back=piped and setup.data_parallel.zero >= 3, one_unit=True if piped else None)


def stage_unit_moments(layers: Sequence[LayerCost], options: Sequence[int], per_layer: list[dict], *, stage: int,
                       profile: Profile, setup: TrainSetup, microbatch_kept: float) -> list[dict]:
    """Each layer's values (assembly.stage_sums' per_layer) with FSDP2's moments as the stage runs them beside a
    pipeline (fsdpunits.beside_pipeline), in place of fsdp_unit_layer_bytes' bound: the stage's layers its units
    (its first prefetches none in the backward and finds no all-gather output before its copy-out; its last
    reduces first, nothing pending). Where the stage's first backward follows w >= 2 forwards
    (fsdpunits.stray_prefetch; §400-§401): in that backward its last unit's all-gather output from its first
    unit's pre-backward to the end, and no gradient shard of a unit not yet reduced (the step's zero_grad sets
    them to None; the first reduce-scatter makes each); where no forward follows a backward (M = w) the forwards
    beside w - 1 others find no shard either, under ZeRO 2 run no all-gather (the units stay gathered from the
    first), and the later backwards hold one microbatch fewer (`microbatch_kept`: the stage's kept bytes a
    microbatch). Under ZeRO 2 the weights whole in static less the units resharded at their post-backward by
    then. `per_layer` unchanged elsewhere."""
    if setup.pipeline.stages == 1 or not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return per_layer
    names = [layer.name for layer in layers]
    params, fp8, units = _units_args(profile, setup, names)
    warm = fsdpunits.warm_up(setup, stage)
    # one unit: its own pre-backward prefetches itself, already unsharded (unshard's no-op, §435)
    several = len(set(fsdpunits.unit_of_layers(len(params), units["grouping"], units["tied"]))) > 1
    stray = dataparallel.gathered_bytes(params[-1], setup, fp8_count=fp8[-1]) if several else 0.0
    shards = [p * dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup) for p in params]
    microbatch = microbatch_kept
    warm_only = setup.pipeline.microbatches == warm  # no forward after a backward
    zero2 = setup.data_parallel.zero < 3
    last = stage == setup.pipeline.stages - 1
    out = []
    for j, (layer, option, values) in enumerate(zip(layers, options, per_layer)):
        kept = values["kept"]
        backward, forward = _moments(layer, option, profile, setup, kept, params, fp8, j, units,
                                     model_last=last and layer.name == profile.layers[-1].name, every_end=True,
                                     copy_back=j == 0 and not zero2, opens=j == 0)
        if zero2:  # each unit resharded at its post-backward (TimedStage's set_reshard_after_backward, §399)
            resharded = sum(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f in zip(params[j + 1:], fp8[j + 1:]))
            own = dataparallel.gathered_bytes(params[j], setup, fp8_count=fp8[j])
            backward = [backward[0] - resharded, backward[1] - resharded, backward[2] - resharded - own]
        moments = [*backward, *forward]
        if warm >= 2:
            here = stray if j == 0 else 0.0
            absent = sum(shards[:j + 1])  # the shards of j and the units before it, not reduced yet
            # the stray prefetch follows the first unit's copy-out (pre_backward: unshard, wait, then prefetch)
            first = [value + (here if k < 3 else 0.0) - absent + (shards[j] if k == 2 else 0.0)
                     for k, value in enumerate(backward)]
            later = [value - microbatch for value in backward] if warm_only else backward
            if not warm_only:
                ahead = forward
            elif zero2:  # F0's all-gathers beside no other microbatch; the forwards after it gather nothing
                ahead = [*(value - sum(shards) - (warm - 1) * microbatch for value in forward), -sum(shards)]
            else:
                ahead = [value - sum(shards) for value in forward]
            moments = [*first, *later, *ahead]
        exact = int(round(max(moments)))
        bound = fsdp_unit_layer_bytes(layer, option, profile, setup, lambda value=kept: value)
        out.append({**values, "extra": values["extra"] + exact - bound})
    return out


def stage_floor(layers: Sequence[LayerCost], *, stage: int, profile: Profile, setup: TrainSetup) -> float:
    """What static lacks where the stage's microbatches are all whole, nothing else live (assembly.net_extra_bytes'
    floor): beside a pipeline under FSDP2's moments, where no forward follows a backward (M = the stage's warm-up,
    two or more), its gradient shards, which the step's zero_grad set to None and the first backward's
    reduce-scatters make again (§401); else 0."""
    if setup.pipeline.stages == 1 or not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0.0
    warm = fsdpunits.warm_up(setup, stage)
    if warm < 2 or setup.pipeline.microbatches != warm:
        return 0.0
    params, _, _ = _units_args(profile, setup, [layer.name for layer in layers])
    return -sum(params) * dataparallel.param_bytes(setup).grads / dataparallel.shard_size(setup)


def stage_units(profile: Profile, setup: TrainSetup):
    """(params, fp8, units): every layer's parameters on the rank, its Float8 weights, and the units' arguments
    (_units_args over the model), read once by a solver that places FSDP2's moments layer by layer."""
    return _units_args(profile, setup)


def neighbour_moments(layer: LayerCost, option: int, kept: float, *, profile: Profile, setup: TrainSetup, units_of,
                      index: int, opens: bool, closes: bool, model_last: bool,
                      alone: bool = False) -> tuple[list[float], list[float]]:
    """Layer `index`'s backward and forward moments as stage_unit_moments charges them beside a pipeline, before
    its first-backward terms (the stray prefetch, the shards absent): from its neighbours in its stage alone, the
    layer before it where it does not open the stage (prefetched, its all-gather output at the copy-out), the
    layer after where it does not close it (reduced last; ZeRO 2's unit resharded by then; HSDP's shard), and
    its copy-out in its pre-backward where it opens the stage at ZeRO 3. What each further layer after it adds
    to its backward moments is later_backward_bytes'. `units_of`: stage_units' (params, fp8, units). Read only
    with "per-layer" units and none kept gathered from the forward (fsdpunits.beside_pipeline, ckplan's
    record), where a unit's moments see its neighbours and no other layer. `alone`: as if no layer of its
    stage were beside it and it had no copy-out of its own (the least of every place's, but ZeRO 2's resharded
    units: the MILP's relaxation, planner/solve/milp_moments.py)."""
    params, fp8, units = units_of
    if alone:
        opens, closes = False, True
    lo, hi = (index if opens or alone else index - 1), (index + 1 if closes else index + 2)
    near, near_fp8, j = params[lo:hi], fp8[lo:hi], index - lo
    zero2 = setup.data_parallel.zero < 3
    backward, forward = _moments(layer, option, profile, setup, kept, near, near_fp8, j, units, model_last=model_last,
                                 every_end=True, copy_back=opens and not zero2, opens=opens,
                                 one_unit=False if alone else None)
    if zero2:  # as stage_unit_moments: the units after it resharded at their post-backward, its own at its own
        resharded = sum(dataparallel.gathered_bytes(p, setup, fp8_count=f) for p, f in zip(near[j + 1:], near_fp8[j + 1:]))
        own = dataparallel.gathered_bytes(near[j], setup, fp8_count=near_fp8[j])
        backward = [backward[0] - resharded, backward[1] - resharded, backward[2] - resharded - own]
    return backward, forward


def later_backward_bytes(units_of, index: int, setup: TrainSetup) -> float:
    """What layer `index`, two or more layers after another of its stage, adds to that layer's backward moments
    (stage_unit_moments): its HSDP reduce-scatter output kept to the backward's end (fsdpunits.layer_moment_bytes'
    `reduced`), less, under ZeRO 2, its weights resharded at its post-backward."""
    params, fp8, _ = units_of
    reduced = params[index] * dataparallel.reduced_bytes_per_param(setup)
    if setup.data_parallel.zero < 3:
        reduced -= dataparallel.gathered_bytes(params[index], setup, fp8_count=fp8[index])
    return reduced


def _moments(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup, kept: float,
             params: Sequence[float], fp8: Sequence[float], index: int, units: dict, *, model_last: bool,
             every_end: bool = False, stray: float = 0.0, copy_back: bool = False,
             opens: bool = False, one_unit: bool | None = None) -> tuple[list[float], list[float]]:
    """Layer `index`'s moments among `params` (the model's layers, or a stage's) as extras of the layer, each
    beside what the layer itself holds then: its backward's start, end and post-backward with `stray` bytes
    beside them, and its forward's copy-out and end (fsdp_unit_layer_bytes). `copy_back` (ZeRO 3, a stage's
    first layer, which no unit of its stage prefetches for): a fourth backward moment, its own copy-out in its
    pre-backward, its all-gather output beside its unsharded weights, before its backward scratch (§436). `opens`: the
    layer opens its stage beside a pipeline, its saved input the stage's receive buffer or batch slice (counted in
    buffers, not in the stage's kept: rules.first_layer_kept_bytes), not freed by its backward's end. Where the
    collectives are gloo's, what its work holds beside (_gloo_bytes; `one_unit`: whether its stage is one unit, None
    read from `params`: True for a bound over every place, False for the least of every place's)."""
    start, end, after = fsdpunits.layer_moment_bytes(params, fp8, index, setup, **units)
    lingering, beside, earlier = _gloo_bytes(layer, profile, setup, params, fp8, index, units, model_last=model_last,
                                             one_unit=one_unit, piped=every_end)
    after += beside if after else 0.0
    start, end, after = start + stray, end + stray, after + (stray if after else 0.0)
    if model_last:  # the LM head's gradient, reduced in a chunked loss (chunkedloss.py)
        end, after = (a - b for a, b in zip((end, after), chunkedloss.head_grads_reduced_in_loss(profile, setup)))
    copy_out, forward_end = fsdpunits.forward_bytes(params, fp8, index, setup, every_end=every_end, **units)
    scratch = layer_extra_bytes(layer, option)
    # its own unit's all-gather output lives through its forward (FSDP2 keeps it to the next unit's copy-out, and
    # gloo's work may hold it longer, §840) beside its forward's own peak: the profile's where it runs no
    # recompute, else its transient, a bound; where the profile records none (synthetic, analytic and older profiles,
    # whose transients are their backwards') not charged, as before (§897)
    own_forward = layer.forward_transient_bytes if option == 0 else scratch
    during = [] if layer.forward_transient_bytes is None else \
        [fsdpunits.forward_bytes(params, fp8, index, setup, every_end=True, **units)[1] - scratch + own_forward]
    # freed by the end of its backward (its saved input where the stage's kept holds it), its input's gradient made
    # (none where its input needs none, §730)
    freed = kept + (rules.first_layer_kept_bytes(layer, setup) if opens else 0)
    done = scratch + freed - (layer.input_bytes if layer.input_grad else 0)
    backward = [start + lingering + earlier, end - done + lingering + earlier, after - done + (lingering if after else 0.0)]
    if copy_back:
        backward.append(start - stray + dataparallel.gathered_bytes(params[index], setup, fp8_count=fp8[index]) - scratch)
    forward = [copy_out - kept - scratch, forward_end - scratch, *during]
    if not layer.output_grad:
        # it runs no backward (its input and parameters need no gradient, §730): FSDP2 neither gathers it for one nor
        # reduces it (§733; the layer after it prefetching it is that layer's moment); its backward moments are its
        # forward's least, never above a moment it has, so the solvers' classes keep their shape
        backward = [min(forward)] * len(backward)
    return backward, forward


def _gloo_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup, params: Sequence[float], fp8: Sequence[float],
                index: int, units: dict, *, model_last: bool, one_unit: bool | None,
                piped: bool) -> tuple[float, float, float]:
    """(lingering, beside, earlier): what gloo holds beyond fsdpunits' moments where the collectives are gloo's
    (gloowork.py) beside a pipeline (`piped`: the stage's moments, every_end), 0, 0, 0 elsewhere: the unit's all-gather
    output its work may still hold through the layer's backward and post-backward (gloowork.backward_all_gather_bytes),
    beside the post-backward's reduce-scatter its output and the unit's last gradient
    (gloowork.reduce_scatter_beside_bytes), and through the backward a stage's only unit's previous reduce-scatter
    input (gloowork.earlier_reduce_scatter_bytes). One stage's moments are left as they were: measured within 2% without
    them (tests/test_dp_runtime.py), their reduce-scatter moment charged differently (not read here: §841)."""
    if not piped or not gloowork.runs_gloo(profile, setup):
        return 0.0, 0.0, 0.0
    own, own_fp8 = fsdpunits.own_unit(params, fp8, index, **units)
    if one_unit is None:
        one_unit = len(set(fsdpunits.unit_of_layers(len(params), units["grouping"], units["tied"]))) == 1
    lingering = gloowork.backward_all_gather_bytes(dataparallel.gathered_bytes(own, setup, fp8_count=own_fp8), setup,
                                                   model_last=model_last, one_unit=one_unit)
    return (lingering, gloowork.reduce_scatter_beside_bytes(own, layer.last_trained_param_count, setup),
            gloowork.earlier_reduce_scatter_bytes(own, setup, one_unit=one_unit))


def _moment_extra(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup, kept: float,
                  params: Sequence[float], fp8: Sequence[float], index: int, units: dict, *, model_last: bool,
                  every_end: bool = False, stray: float = 0.0, copy_back: bool = False,
                  one_unit: bool | None = None) -> int:
    """The largest of _moments."""
    backward, forward = _moments(layer, option, profile, setup, kept, params, fp8, index, units,
                                 model_last=model_last, every_end=every_end, stray=stray, copy_back=copy_back,
                                 one_unit=one_unit)
    return int(round(max(*backward, *forward)))


def fsdp_unit_loss_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """What FSDP2 holds gathered at the loss, on the last stage, by the runtime's units
    (fsdpunits.loss_moment_bytes): an extra of the stage beside the loss's scratch."""
    if stage != setup.pipeline.stages - 1 or not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units):
        return 0
    params, fp8, units = _units_args(profile, setup)
    return int(round(fsdpunits.loss_moment_bytes(params, fp8, setup, **units)))
