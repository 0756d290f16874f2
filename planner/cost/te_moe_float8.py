"""A Megatron-core MoE block under Transformer Engine's FP8 (current scaling), as the cost model charges it: its
Float8 record (planner/profiler/te_moe_float8.py, carried on the block's TE record, LayerProfile.te_time) and
what its FP8 linears save for the backward in place of the bf16 tensors te_moe_kept.py counts
(RuntimeFacts.te_float8_saved_inputs; TE v2.9, megatron-core 92c8482e; docs/framework-facts.md §99):

- linear_qkv (TE LayerNormLinear, no SP): the input norm's output saved in FP8, column-wise only, 1 B an element
  where bf16 keeps 2 (as te_kept.te_saved_inputs_delta charges a dense block: framework-facts §46);
- linear_proj (TE Linear): its FP8 input, 1 B, beside the attention output the attention keeps in bf16;
- the experts' linear_fc1 (TE GroupedLinear): `split_quantize` of the permuted tokens, then
  `inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)` and `save_for_backward(*inputmats,
  *weights_fp8, *weights, ...)` (transformer_engine/pytorch/module/grouped_linear.py 127, 199-230 at v2.9):
  S x h at 1 B (the column-wise copy: on Hopper the transpose, the row-wise data freed; on Blackwell the data)
  in place of the bf16 permuted tokens, which nothing else keeps (the dispatcher's permute, all-to-all and sort
  save maps only: §95);
- linear_fc2 the same on the weighted GLU's output: S x f at 1 B; the bf16 output freed once quantized;
- Megatron keeps no bf16 copy beside them: `save_original_input` is set only under `--recompute-modules moe_act`
  (linear_fc2) and fine-grained offloading without FP8 (linear_fc1) (experts.py 806-815 at 92c8482e), and the
  weighted GLU saves linear_fc1's bf16 output as without FP8 (`activation_func_fp8_input_store` off: the
  Megatron-Bridge 25.11 recipes do not set it). The weights saved are the FP8 weights the step holds anyway.
The router (bf16 gating linear, its fp32 scores and bool map) and the pre-MLP TENorm are unchanged under FP8.
Charged here for the option that recomputes nothing, as a dense block's FP8 inputs are; the selective options'
from the same tensors in planner/cost/te_float8_kept.py; the per-tensor scales (4 B a tensor) are not.
"""

from __future__ import annotations

from planner.cost import te_kept, te_moe_kept
from planner.schema import LayerProfile, Profile


def with_records(profile: Profile, record) -> Profile:
    """The profile with each MoE block's Float8 record taken from its TE record where the runtime's layers run
    Transformer Engine's kernels (RuntimeFacts.fused_kernels): the record fusedkernels.fused_profile then puts in
    place (it replaces a layer's Float8 record with its TE record's)."""
    if record.fused_kernels != "transformer-engine":
        return profile
    layers = [layer.model_copy(update={"float8": layer.te_time.float8})
              if layer.kind == "moe_block" and layer.float8 is None and layer.te_time is not None
              and layer.te_time.float8 is not None else layer for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def records_float8(profile: Profile, record) -> bool:
    """Whether any layer of the profile carries a Float8 record under this runtime (its own, or a MoE block's TE
    record's where the runtime runs TE's kernels)."""
    return any(layer.float8 is not None for layer in with_records(profile, record).layers)


def saved_inputs(profile: Profile) -> dict | None:
    """The tensors TE's FP8 linears of a MoE block save in place of the bf16 ones (the module's docstring), by
    name: `norm_bf16` / `norm` (linear_qkv's norm output), `attn_out` / `proj` (linear_proj's FP8 input beside the
    bf16 attention output), `fc1_bf16` / `fc1` (the permuted tokens), `fc2_bf16` / `fc2` (the GLU's output); None
    where te_moe_kept finds no Megatron MoE mixture (te_moe_kept.mixtures) or sequence parallelism splits the norm
    (not read for MoE blocks here)."""
    found = te_moe_kept.mixtures(profile)
    dense = te_kept.te_saved_inputs(profile)
    if found is None or dense is None or dense["norm_out"] != 1:
        return None
    shape = profile.assumptions
    if shape.get("tp", 1) > 1 and shape.get("sp", False):
        return None
    # S x h x 2 (linear_fc1's input, after the router's tensors), S x f x 2
    fc1_bf16, fc2_bf16 = found["mcore"][found["router"]], found["mcore"][-1]
    return {"norm_bf16": dense["norm_bf16"], "norm": dense["norm_rows"], "attn_out": dense["attn_out"],
            "proj": dense["proj"], "fc1_bf16": fc1_bf16, "fc1": fc1_bf16 // 2, "fc2_bf16": fc2_bf16,
            "fc2": fc2_bf16 // 2, "router": found["router"]}


def saved_inputs_delta(tensors: dict) -> int:
    """Bytes a MoE block keeps a microbatch under FP8 beyond its bf16 count (negative: fewer)."""
    return (tensors["norm"] - tensors["norm_bf16"] + tensors["proj"] + tensors["fc1"] - tensors["fc1_bf16"]
            + tensors["fc2"] - tensors["fc2_bf16"])


def with_saved_inputs(layer: LayerProfile, tensors: dict) -> LayerProfile:
    """none's kept bytes, the layer's act_bytes and none's allocation record with the FP8 tensors (the caller's
    float8._layer adds the rest of the Float8 record)."""
    delta = saved_inputs_delta(tensors)
    options = [option.model_copy(update={"kept_bytes": option.kept_bytes + delta}) if option.name == "none"
               else option for option in layer.recompute_options]
    records = {name: moe_record(record, tensors) if name == "none" else record
               for name, record in layer.alloc_records.items()}
    return layer.model_copy(update={"act_bytes": layer.act_bytes + delta, "recompute_options": options,
                                    "alloc_records": records})


def moe_record(record, tensors: dict):
    """none's record (te_moe_kept's: Megatron-core's run of tensors) with the FP8 saved inputs: the input norm's
    output (the second allocation, as te_kept.te_record finds a dense block's) at 1 B, linear_proj's FP8 input
    after the attention output, linear_fc1's input at 1 B, linear_fc2's made in FP8 from its bf16 one, freed once
    quantized. As it is where the record does not hold that run."""
    sizes = [code for code in record.forward if code > 0]
    fc1, fc2 = tensors["fc1_bf16"], tensors["fc2_bf16"]
    # linear_fc1's input, then its 2f-wide output (and, clamped, the cat), then linear_fc2's input
    at = next((i for i in range(len(sizes) - 2) if sizes[i] == fc1 and sizes[i + 1] == 2 * fc2), None)
    fc2_at = None if at is None else next((j for j in (at + 2, at + 3) if j < len(sizes) and sizes[j] == fc2), None)
    # before the mixture's router tensors (3, or 4 with the aux loss's): the MLP norm's output, statistics and input,
    # the attention's output
    router = tensors.get("router", 3)
    attn_out = None if fc2_at is None else at - router - 4
    if attn_out is None or attn_out < 2 or sizes[1] != tensors["norm_bf16"] or sizes[at - router - 1] != tensors["norm_bf16"] \
            or sizes[attn_out] != tensors["attn_out"]:
        return record
    edits = {2: ([tensors["norm"]], 0), attn_out + 1: ([tensors["attn_out"], tensors["proj"]], 0),
             at + 1: ([tensors["fc1"]], 0), fc2_at + 1: ([tensors["fc2"]], fc2)}
    return te_kept._rewritten(record, edits)
