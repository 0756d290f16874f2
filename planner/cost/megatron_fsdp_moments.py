"""Megatron-FSDP's bytes at their own moments of the stage's backward, as each layer's extra (what the transient nets
against the layers after it), under --fsdp-double-buffer: what megatron_fsdp.buffer_bytes no longer charges as a
stage constant. Read at megatron-core 92c8482e (F = megatron/core/distributed/fsdp/src/megatron_fsdp/
megatron_fsdp.py, B = its param_and_grad_buffer.py) and TransformerEngine v2.9 (docs/framework-facts.md §125, §143,
§146); the caching allocator's replay (reserve_megatron_fsdp.py) plays the same moments event by event:

- the output layer (the last stage's layers after the model's last unit, on a stage that holds no unit too): its
  backward makes each weight's bf16 `.grad`
  under --no-gradient-accumulation-fusion beside its own scratch (the replay makes them at its record's last
  allocation), and its post-backward requests its gradient bucket (a TemporaryBucketAllocator tensor, F 506-548)
  and copies the gradient in before dropping it (F 526-532): extra = max(its extra + its bf16 gradients, its
  bucket + its bf16 gradients + its input's gradient);
- the stage's last unit (the first the backward runs): the output layer's bucket still queued through its
  backward (reduce_gradients frees it at this unit's post-backward at the earliest: B 2771-2848), the unit's bucket
  in the double buffer's slot (held: buffer_bytes); Transformer Engine's nodes free what they saved node by node
  and make each bf16 weight gradient in its node (te_block_backward.program, where the record is the FP8 dense
  block; else the record's own order with the gradients made at its last allocation, as the replay): its extra
  moves by that program's peak less its record's own-order peak; on Hopper the computing unit's FP8 transpose
  (megatron_fsdp.transpose_bytes) beside it;
- every other unit: the same node-by-node program and transpose, nothing queued from the output layer.

The solvers (planner/solve/dpsegments.py, milp_moments.py) place the same functions at the same layers: each unit's
extra everywhere (unit_extra), the queued bucket at the last stage's last unit and output_extra at its last layer.
Not here: the non-double-buffer path (buffer_bytes keeps its stage constant: the units its prefetch gathers, their
bucket per unit), several pipeline stages' first stage (the embedding's bucket comes after the peak).
Pure functions; nothing here reads a file or prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from planner.cost import dataparallel, megatron_fsdp, te_block_backward
from planner.cost.fsdp2_layers import parameter_parts, tensor_split
from planner.cost.te_kept import te_saved_inputs
from planner.schema import OPTION_NONE, OPTION_OFFLOAD, AllocRecord


def applies(setup) -> bool:
    """Megatron-FSDP runs under its double buffer (the moments here replace buffer_bytes's stage constant)."""
    return megatron_fsdp.runs(setup) and setup.data_parallel.fsdp_double_buffer


def backward_peak(record: AllocRecord, program: Sequence | None, wgrads: Sequence[int]) -> int:
    """The layer's backward peak over what its forward left alive: `program`'s (te_block_backward.program: each
    ("wgrad", n) makes the n-th of `wgrads`), else the record's own backward with every gradient made at its
    last allocation (the replay's order, reserve_megatron_fsdp)."""
    if program is None:
        codes = list(record.backward)
        cut = max((n + 1 for n, code in enumerate(codes) if code > 0), default=0)
        program = [*codes[:cut], *(("wgrad", n) for n in range(len(wgrads))), *codes[cut:]]
    sizes = dict(enumerate((code for code in record.forward if code > 0), start=1))
    count, live, peak = len(sizes), 0, 0
    for item in program:
        if isinstance(item, tuple):
            live += wgrads[item[1]] if item[1] < len(wgrads) else 0
        elif item > 0:
            count += 1
            sizes[count] = item
            live += item
        else:
            live -= sizes.pop(-item, 0)
        peak = max(peak, live)
    return peak


def unit_shift(layer, option: str, count: int, profile, setup) -> float:
    """How far a unit's backward peak moves from its record's own order (what its profiled extra holds) when its
    nodes free what they saved and make its bf16 weight gradients (unfused) in their nodes; 0 where the layer has
    no record for the option. `count`: the parameters the rank holds of it (megatron_fsdp.held)."""
    record = layer.alloc_records.get(OPTION_NONE if option == OPTION_OFFLOAD else option)
    if record is None:
        return 0.0
    wgrads: tuple[int, ...] = ()
    if setup.training.unfused_grad_accumulation:
        wgrads = tensor_split(count * dataparallel.param_bytes(setup).weights,
                              te_block_backward.megatron_parts(parameter_parts(layer, profile.assumptions)))
    program = te_block_backward.program(record, te_saved_inputs(profile)) if layer.kind == "decoder_block" else None
    return float(backward_peak(record, program, wgrads) - backward_peak(record, None, ()))


class Held(NamedTuple):
    """A layer as Megatron-FSDP holds it (megatron_fsdp.held): its profile layer, the parameters a rank holds of it,
    the Float8 weights among them, whether it is a unit."""

    layer: object
    count: int
    fp8: int
    unit: bool


def held_layers(ctx) -> dict[str, Held]:
    """Every profile layer by name, as Megatron-FSDP holds it; {} where the moments do not apply. The solvers read
    it once (planner/solve/dpsegments.Chain, milp_rows) and pass it to the functions below."""
    profile, setup = ctx.profile, ctx.setup
    if not applies(setup):
        return {}
    rows = megatron_fsdp.held(profile, setup)
    return {layer.name: Held(layer, *row) for layer, row in zip(profile.layers, rows)}


def last_unit(held: dict[str, Held]) -> str | None:
    """The model's last unit (the first the backward runs): the profile's order is the dict's."""
    return next((name for name, row in reversed(held.items()) if row.unit), None)


def after_last_unit(held: dict[str, Held], names: Sequence[str]) -> list[str]:
    """Those of `names` (a stage's layers) that come after the model's last unit: the output layers."""
    position = {name: at for at, name in enumerate(held)}
    first = position[last_unit(held)] + 1
    return [name for name in names if position[name] >= first]


def output_params(held: dict[str, Held], names: Sequence[str]) -> int:
    """The parameters a rank holds of the output layers among `names`."""
    return sum(held[name].count for name in after_last_unit(held, names))


def unit_extra(layer, option: int, extra: float, kept: float, held: dict[str, Held], ctx, *,
               queued: float = 0.0) -> float:
    """A unit's extra under the moments: its profiled extra moved by unit_shift and the FP8 transpose, or its
    post-backward (its bf16 gradients unfused and its input's gradient, less its kept) where larger, each with
    `queued` beside it (the output layers' bucket, at the model's last unit on the last stage: queued_bytes);
    any other layer's extra as given."""
    row = held[layer.name]
    if not row.unit:
        return extra
    setup = ctx.setup
    option_name = layer.options[int(option)].name
    shift = unit_shift(row.layer, option_name, row.count, ctx.profile, setup)
    shift += megatron_fsdp.transpose_bytes(row.fp8, ctx.profile, setup)
    grads = row.count * dataparallel.param_bytes(setup).weights if setup.training.unfused_grad_accumulation else 0.0
    return max(extra + shift + queued, queued + grads + layer.input_bytes - kept)


def output_arms(layer, extra: float, kept: float, out_params: int, ctx) -> tuple[float, float]:
    """The last stage's last layer where it comes after the model's last unit (the output layer): its backward
    makes the output layers' bf16 gradients (unfused) beside its own scratch, and its post-backward requests
    their bucket beside them and its input's gradient, less its kept. Each arm is affine in `out_params` (the
    MILP reads them so: planner/solve/milp_rows.py _tail_rows)."""
    params = dataparallel.param_bytes(ctx.setup)
    grads = out_params * params.weights if ctx.setup.training.unfused_grad_accumulation else 0.0
    return extra + grads, out_params * params.grads + grads + layer.input_bytes - kept


def output_extra(layer, extra: float, kept: float, out_params: int, ctx) -> float:
    """The output layer's extra under the moments: the larger of output_arms."""
    return max(output_arms(layer, extra, kept, out_params, ctx))


def queued_bytes(out_params: int, ctx) -> float:
    """The output layers' gradient bucket, queued through the last unit's backward."""
    return out_params * dataparallel.param_bytes(ctx.setup).grads


def stage_moments(layers: Sequence, options: Sequence[int], per_layer: list[dict[str, float]], *, stage: int,
                  ctx) -> list[dict[str, float]]:
    """The stage's per-layer values with Megatron-FSDP's moments in their layers' extras (the module's docstring);
    as given where it does not apply. The DP and the MILP (planner/solve/) place the same functions per layer:
    unit_extra everywhere, with queued_bytes at the last stage's last unit, output_extra at its last layer."""
    held = held_layers(ctx)
    if not held:
        return per_layer
    last = stage == ctx.setup.pipeline.stages - 1
    after = after_last_unit(held, [layer.name for layer in layers]) if last else []
    out_params = output_params(held, after)
    final = last_unit(held)
    out = [dict(values) for values in per_layer]
    for i, layer in enumerate(layers):
        queued = queued_bytes(out_params, ctx) if layer.name == final else 0.0
        out[i]["extra"] = unit_extra(layer, options[i], out[i]["extra"], out[i]["kept"], held, ctx, queued=queued)
    if after:
        out[-1]["extra"] = output_extra(layers[-1], out[-1]["extra"], out[-1]["kept"], out_params, ctx)
    return out
