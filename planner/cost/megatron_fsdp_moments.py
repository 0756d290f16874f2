"""Megatron-FSDP's bytes at their own moments of the stage's backward, as each layer's extra (what the transient nets
against the layers after it), under --fsdp-double-buffer: what megatron_fsdp.buffer_bytes no longer charges as a
stage constant. Read at megatron-core 92c8482e (F = megatron/core/distributed/fsdp/src/megatron_fsdp/
megatron_fsdp.py, B = its param_and_grad_buffer.py) and TransformerEngine v2.9 (docs/framework-facts.md §125, §143,
§146); the caching allocator's replay (reserve_megatron_fsdp.py) plays the same moments event by event:

- the output layer (the last stage's layers after its last unit): its backward makes each weight's bf16 `.grad`
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

Not here: the non-double-buffer path (buffer_bytes keeps its stage constant: the units its prefetch gathers, their
bucket per unit), several pipeline stages' first stage (the embedding's bucket comes after the peak).
Pure functions; nothing here reads a file or prints."""

from __future__ import annotations

from collections.abc import Sequence

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


def stage_moments(layers: Sequence, options: Sequence[int], per_layer: list[dict[str, float]], *, stage: int,
                  ctx) -> list[dict[str, float]]:
    """The stage's per-layer values with Megatron-FSDP's moments in their layers' extras (the module's docstring);
    as given where it does not apply."""
    profile, setup = ctx.profile, ctx.setup
    if not applies(setup):
        return per_layer
    by_name = {layer.name: layer for layer in profile.layers}
    rows = megatron_fsdp.held(profile, setup)
    row_of = {layer.name: row for layer, row in zip(profile.layers, rows)}
    units = [i for i, layer in enumerate(layers) if row_of[layer.name][2]]
    if not units:
        return per_layer
    params = dataparallel.param_bytes(setup)
    unfused = setup.training.unfused_grad_accumulation
    after = layers[units[-1] + 1:] if stage == setup.pipeline.stages - 1 else []
    out_params = sum(row_of[layer.name][0] for layer in after)
    out_bucket, out_grads = out_params * params.grads, out_params * params.weights if unfused else 0.0
    out = [dict(values) for values in per_layer]
    for i in units:
        layer = by_name[layers[i].name]
        option = layers[i].options[int(options[i])].name
        count, fp8, _ = row_of[layer.name]
        shift = unit_shift(layer, option, count, profile, setup) + megatron_fsdp.transpose_bytes(fp8, profile, setup)
        queued = out_bucket if i == units[-1] else 0.0
        post = queued + (count * params.weights if unfused else 0.0) + layers[i].input_bytes - out[i]["kept"]
        out[i]["extra"] = max(out[i]["extra"] + shift + queued, post)
    if after:
        j = len(layers) - 1
        post = out_bucket + out_grads + layers[j].input_bytes - out[j]["kept"]
        out[j]["extra"] = max(out[j]["extra"] + out_grads, post)
    return out
