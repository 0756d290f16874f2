"""What Megatron-core's Transformer Engine layers keep for the backward where it differs from the analytic
profile's dense block (planner/profiler/analytic_kept.py, which counts the tensors eager PyTorch saves), each a
fact of the runtime record read here (docs/framework-facts.md §46):

- the fused SwiGLU (RuntimeFacts.fused_swiglu_saves_input_only: megatron-core's bias_swiglu_impl, on by
  default) saves only its input, the first linear's 2f-wide output, and recomputes SiLU in its backward: the
  block keeps no SiLU output, f a token fewer than the eager block's four f-wide tensors;
- under Float8, the linears' inputs as Transformer Engine saves them (te_saved_inputs_delta).

Applied to the profile's dense decoder blocks for the option that recomputes nothing, and, for the SwiGLU,
every option that keeps the MLP (offload: fewer bytes to the host, its input alone kept); an analytic profile's only (a measured profile's kept bytes are its own). The
blocks' allocation records (what the caching allocator's replays play: planner/profiler/allocseq.synthesised's, one
allocation a kept tensor) are rewritten to hold the same tensors (te_record), so the replayed reserve and the
allocated peak count the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schema import OPTION_OFFLOAD, AllocRecord, LayerProfile, Profile

BF16_BYTES = 2
# the FP8 copies of a LayerNormLinear's norm output it saves, 1 B an element each: one, with or without sequence
# parallelism, on Hopper or Blackwell (the column-wise copy without SP, the shard's row-wise data under SP: the
# quantizer's column-wise usage is turned off before the norm where its input is gathered; §303)
NORM_OUT_COPIES = 1


def _dims(profile: Profile) -> tuple[dict, dict] | None:
    shape, model = profile.assumptions, profile.assumptions.get("model")
    if profile.source != "analytic" or not isinstance(model, dict):
        return None
    return shape, model


def swiglu_silu_out_bytes(profile: Profile) -> int:
    """The SiLU output the eager SwiGLU keeps and the fused one does not: tokens x f/t x bf16 (0 for a GPT
    block, or a profile not analytic)."""
    dims = _dims(profile)
    if dims is None or dims[1].get("style") != "llama":
        return 0
    shape, model = dims
    tokens = shape["seq_len"] // shape.get("cp", 1) * shape["micro_batch_size"]  # formulas.Shape.tokens
    return tokens * (model["intermediate_size"] // shape.get("tp", 1)) * BF16_BYTES


def fused_swiglu_profile(profile: Profile, record) -> Profile:
    """The profile with its dense blocks keeping what the record's fused SwiGLU keeps (the module's
    docstring); as it is where the record does not fuse it or the blocks are not SwiGLU ones."""
    less = swiglu_silu_out_bytes(profile) if record.fused_swiglu_saves_input_only else 0
    if not less:
        return profile
    layers = [_less_kept(layer, less) if layer.kind == "decoder_block" else layer for layer in profile.layers]
    return profile.model_copy(update={"layers": layers})


def _less_kept(layer: LayerProfile, less: int) -> LayerProfile:
    def keeps_mlp(name: str) -> bool:
        return name != "full" and "mlp" not in name.split(",")

    def less_of(option):  # offload keeps its input alone: the SiLU output is one it no longer moves to the host
        if option.name == OPTION_OFFLOAD:
            return {"host_bytes": option.host_bytes - less, "recompute_peak_bytes": option.recompute_peak_bytes - less}
        return {"kept_bytes": option.kept_bytes - less}

    options = [option.model_copy(update=less_of(option)) if keeps_mlp(option.name)
               else option for option in layer.recompute_options]
    records = {name: te_record(record, fused_swiglu=less) if keeps_mlp(name) else record
               for name, record in layer.alloc_records.items()}
    return layer.model_copy(update={"act_bytes": layer.act_bytes - less, "recompute_options": options,
                                    "alloc_records": records})


def te_saved_inputs_delta(profile: Profile) -> int:
    """Bytes a dense block keeps per microbatch under Transformer Engine's Float8 beyond the bf16 block the
    analytic profile counts (RuntimeFacts.te_float8_saved_inputs; TE v2.9, docs/framework-facts.md §46), without
    recompute: linear_qkv's and linear_fc1's norm outputs saved in FP8, 1 B an element where bf16 is 2 (under
    sequence parallelism the shard's row-wise copy alone, kept for the backward's all-gather: the norm wrote no
    transpose, TE v2.9 layernorm_linear.py 186-192, docs/framework-facts.md §303); linear_proj's FP8 input, 1 B,
    beside the attention output the attention keeps in bf16; linear_fc2's FP8 input, 1 B, in place of the bf16
    activation output. From the analytic profile's shape (its assumptions); 0 for another profile."""
    dims = _dims(profile)
    if dims is None:
        return 0
    shape, model = dims
    tp, cp = shape.get("tp", 1), shape.get("cp", 1)
    tokens = shape["seq_len"] // cp * shape["micro_batch_size"]  # formulas.Shape.tokens
    hidden = model["hidden_size"]
    q = model["num_heads"] * (model.get("head_dim") or hidden // model["num_heads"]) // tp
    ffn = model["intermediate_size"] // tp
    gathered = tp > 1 and shape.get("sp", False)  # the norm output's row-wise shard kept to gather it again
    norm_rows = tokens // tp if gathered else tokens
    return 2 * norm_rows * hidden * (NORM_OUT_COPIES - 2) + tokens * q - tokens * ffn


# ---------------------------------------------------------------- the records the replays play


def te_saved_inputs(profile: Profile) -> dict | None:
    """What te_saved_inputs_delta charges, as the tensors Transformer Engine's Float8 linears save (the function's
    docstring): the norm outputs' rows and bytes an element (`norm_rows`, `norm_out`: linear_qkv's and
    linear_fc1's), the bf16 norm output they replace (`norm_bf16`), linear_proj's FP8 input (`proj`) beside the
    bf16 attention output (`attn_out`), linear_fc2's FP8 input (`fc2`) in place of the bf16 one (`fc2_bf16`);
    None for a profile not analytic."""
    dims = _dims(profile)
    if dims is None:
        return None
    shape, model = dims
    tp, cp = shape.get("tp", 1), shape.get("cp", 1)
    tokens = shape["seq_len"] // cp * shape["micro_batch_size"]
    hidden = model["hidden_size"]
    q = model["num_heads"] * (model.get("head_dim") or hidden // model["num_heads"]) // tp
    ffn = model["intermediate_size"] // tp
    gathered = tp > 1 and shape.get("sp", False)
    norm_rows = tokens // tp if gathered else tokens
    return {"norm_rows": norm_rows * hidden, "norm_out": NORM_OUT_COPIES, "norm_bf16": norm_rows * hidden * BF16_BYTES, "attn_out": tokens * q * BF16_BYTES,
            "proj": tokens * q, "fc2_bf16": tokens * ffn * BF16_BYTES, "fc2": tokens * ffn}


def te_record(record: AllocRecord, *, fused_swiglu: int = 0, float8: dict | None = None) -> AllocRecord:
    """A dense block's record (allocseq.synthesised's: one allocation a kept tensor, in the block's order) holding
    what Transformer Engine's layers save: `fused_swiglu` (the SiLU output's bytes) makes the MLP's run of four
    f-wide tensors (gate, SiLU output, up, product) linear_fc1's one 2f-wide output (the fused SwiGLU's saved
    input: megatron-core mlp.py 156-196) and the product, no SiLU output; `float8` (te_saved_inputs) writes the two norm outputs (the
    allocation after the first norm's statistics, and the one before the MLP's run) at `norm_out` bytes an element
    (a row-wise copy and, on Hopper under SP, its transpose), adds linear_proj's FP8 input after the attention
    output, and makes linear_fc2's input in FP8 from its bf16 one, freed once quantized. As it is where the record
    has no such run (not a dense block's)."""
    sizes = [code for code in record.forward if code > 0]
    wide = fused_swiglu or (float8 or {}).get("fc2_bf16", 0)
    run = _run(sizes, wide) if wide else None
    if run is None:
        return record
    first, count = run  # ids of the MLP's f-wide tensors: first .. first + count - 1
    edits: dict[int, tuple[list[int], int]] = {}
    if fused_swiglu and count >= 4:  # gate, SiLU, up, product: linear_fc1's one 2f-wide output, the product
        edits[first] = ([2 * wide], 0)
        edits[first + 1] = edits[first + 2] = ([], 0)
    if float8:
        norm = [float8["norm_rows"]] * float8["norm_out"]
        fc1_out = first - 1 if first > 1 and sizes[first - 2] == 2 * wide else first  # a fused SwiGLU's input
        mlp_in, attn_norm_out = fc1_out - 1, 2
        # before linear_fc1's input: the MLP norm's statistics and input, the attention's output
        attn_out = next((ident for ident in range(mlp_in - 3, 0, -1) if sizes[ident - 1] == float8["attn_out"]),
                        None)
        if sizes[mlp_in - 1] != float8["norm_bf16"] or sizes[attn_norm_out - 1] != float8["norm_bf16"] or attn_out is None:
            return record
        edits[attn_norm_out] = edits[mlp_in] = (norm, 0)
        edits[attn_out] = ([float8["attn_out"], float8["proj"]], 0)
        edits[first + count - 1] = ([float8["fc2"]], float8["fc2_bf16"])
    return _rewritten(record, edits)


def _run(sizes: Sequence[int], wide: int) -> tuple[int, int] | None:
    """The first run of allocations of `wide` bytes past the first two (id, length)."""
    for at in range(2, len(sizes)):
        if sizes[at] == wide:
            end = at
            while end < len(sizes) and sizes[end] == wide:
                end += 1
            return at + 1, end - at
    return None


def _rewritten(record: AllocRecord, edits: dict[int, tuple[list[int], int]]) -> AllocRecord:
    """`record` with each forward allocation named in `edits` (id -> (the allocations it becomes, a transient made
    first and freed after them, 0: none)); a free of an edited id frees what it became, last first; ids renumbered."""
    made: dict[int, list[int]] = {}
    count = old = 0

    def rewrite(codes: Sequence[int], *, editable: bool) -> list[int]:
        nonlocal count, old
        out = []
        for code in codes:
            if code <= 0:
                out += [-ident for ident in reversed(made.get(-code, []))]
                continue
            old += 1
            kept, transient = edits.get(old, ([code], 0)) if editable else ([code], 0)
            if transient:
                count += 1
                out.append(transient)
                transient_id = count
            made[old] = []
            for size in kept:
                count += 1
                out.append(size)
                made[old].append(count)
            if transient:
                out.append(-transient_id)
        return out

    forward = rewrite(record.forward, editable=True)
    backward = rewrite(record.backward, editable=False)

    def single(ident: int) -> int:
        return made[ident][0] if ident else 0

    return record.model_copy(update={"forward": forward, "backward": backward, "output": single(record.output),
                                     "input_grad": single(record.input_grad)})
