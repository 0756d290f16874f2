"""The allocator replay's records (schema.AllocRecord) for an analytic block's selective options and op-level SAC,
built from the same terms their kept bytes are (analytic_kept.selective_options, opsac.op_sac_kept_bytes), as
allocseq.synthesised builds none's and full's.

A selective option keeps none's tensors but those of the parts it recomputes; each part's tensors are the terms
selective_options counts it by (core-attn: the attention core's but its output; attn: the attention's but its
input; mlp: the MLP's own; mlp-act: the activation's outputs; norm-out: each freed norm's output and statistics).
Its record is none's with those tensors left out of the forward; its backward first reruns each part where the
backward reaches it (the MLP's parts before the attention's: the backward runs the block last layer first), each
part's tensors made and freed once its sub-block's backward has used them, then none's backward (scratch, the
input's gradient, the kept tensors freed). Op-level SAC's forward makes the tensors the policy saves (the matmul
outputs it keeps, the attention's output and logsumexp, the router's top-k, SP's reduce-scatter outputs: the
terms of op_sac_kept_bytes); its backward reruns the rest of the forward at once (recompute_peak_bytes, one
request), then none's backward.

An MTP layer (analytic_mtp.py) keeps its transformer layer's tensors one by one among its own (the lookup's ids,
the norms, eh_proj's input, the final norm's): its options are the block's, their parts taken from the block's
tensors alone.

An option whose parts' tensors are not all among none's kept tensors (none of the architectures ckplan knows; a
check in tests/test_analytic_records.py) gets no record: the replay then keeps the divisor for a stage that runs it,
and evaluate says so.
"""

from __future__ import annotations

from planner.models.archs import Arch
from planner.profiler import allocseq, analytic_kept, opsac
from planner.profiler.activations import ACTIVATIONS, freed_by_rerun
from planner.profiler.formulas import INDEX_BYTES, Shape, expert_tokens, q_width
from planner.schema import OPTION_NONE, AllocRecord, LayerProfile

FP32 = 4
MLP_SIDE = ("mlp", "mlp-act", "norm-out:mlp")  # rerun first: the backward reaches the MLP before the attention


def part_tensors(arch: Arch, shape: Shape, *, moe: bool) -> dict[str, list[int]]:
    """Each selective part's tensors (bytes), as analytic_kept.selective_options counts the part's bytes; the
    norms of norm-out by side ("norm-out:attn", "norm-out:mlp")."""
    d, sb = shape.d, shape.tokens
    out_width = arch.num_heads // shape.tp * arch.v_head_dim if arch.mla else q_width(arch, shape)
    parts: dict[str, list[int]] = {}
    core = [term.num_bytes for term in analytic_kept._attention_core_terms(arch, shape, out_width)[:-1]]
    if sum(core):
        parts["core-attn"] = core
    if analytic_kept.offers_whole_attention(arch, shape):
        parts["attn"] = [term.num_bytes for term in analytic_kept.gqa_terms(arch, shape)[1:]]
    if arch.mla:  # the up-projected K and V (and Q from its latent), each latent norm's statistics and output
        heads, qk = arch.num_heads // shape.tp, arch.qk_nope_head_dim + arch.qk_rope_head_dim
        latents = [arch.q_lora_rank, arch.kv_lora_rank] if arch.q_lora_rank else [arch.kv_lora_rank]
        parts["mla-up"] = [*([sb * heads * qk * d] if arch.q_lora_rank else []), sb * heads * qk * d,
                           sb * heads * arch.v_head_dim * d, *(size for rank in latents for size in (FP32 * sb, sb * rank * d))]
    if moe:
        tokens, f = arch.num_experts * expert_tokens(arch, shape), arch.moe_intermediate_size // shape.tp
    else:
        tokens, f = sb, arch.intermediate_size // shape.tp
    freed = 2 if arch.style == "llama" else freed_by_rerun(arch.mlp_act)
    if freed:
        parts["mlp-act"] = [tokens * f * d] * freed
    if moe:
        parts["mlp"] = [term.num_bytes for term in analytic_kept.moe_terms(arch, shape)]
    else:
        parts["mlp"] = [tokens * f * d] * (4 if arch.style == "llama" else ACTIVATIONS[arch.mlp_act].kept)
    for side, which in (("attn", "attention"), ("mlp", "MLP")):
        if side in analytic_kept.norm_out_bytes(arch, shape, moe=moe):
            stats = [term.num_bytes for term in analytic_kept._norm_terms(arch, shape, which)[1:]]
            parts[f"norm-out:{side}"] = [*stats, analytic_kept.boundary_bytes(arch, shape)]
    return {name: [size for size in sizes if size > 0] for name, sizes in parts.items()}


def op_sac_tensors(arch: Arch, shape: Shape, *, moe: bool) -> list[int]:
    """The tensors op-level SAC keeps but the block's input, term by term of opsac.op_sac_kept_bytes."""
    tokens, d, boundary = shape.tokens, shape.d, analytic_kept.boundary_bytes(arch, shape)
    saved, _ = opsac._saved_and_rerun(arch, shape, moe=moe)
    kept = [tokens * out * d for _, _, out in saved]
    if moe and arch.expert_bias:
        kept.append(tokens // shape.sp_div * arch.num_experts * d)
    kept += [tokens * opsac._attention_out(arch, shape) * d, FP32 * (arch.num_heads // shape.tp) * tokens]
    if moe:
        kept += [FP32 * tokens * arch.num_experts_per_tok // shape.sp_div,
                 INDEX_BYTES * tokens * arch.num_experts_per_tok // shape.sp_div]
    if shape.sp:
        kept += [boundary, boundary]
    return [size for size in kept if size > 0]


def with_option_records(layer: LayerProfile, arch: Arch, shape: Shape, *, moe: bool,
                        within: range | None = None) -> LayerProfile:
    """`layer` (a block from analytic.block_layer, with none's and full's records) with a record for each of its
    selective options and op-level SAC whose tensors the terms name (mla-up: the up-projected Q, K, V and the
    latent norms' outputs and statistics, analytic_kept.mla_up_norm_bytes) (the module's docstring). `within`: the
    block's kept tensors among none's (indices into allocseq.forward_sizes) where the layer holds more than the
    block (an MTP layer: analytic_mtp.py); the parts are taken from there."""
    none = layer.alloc_records.get(OPTION_NONE)
    if none is None or not layer.recompute_options:
        return layer
    parts = part_tensors(arch, shape, moe=moe)
    records = dict(layer.alloc_records)
    for option in layer.recompute_options:
        if option.name in records or option.name == "offload":
            continue
        if option.name == opsac.OPTION_OP_SAC:
            found = allocseq.kept_then_rerun(none, op_sac_tensors(arch, shape, moe=moe), option.recompute_peak_bytes)
        else:
            found = _selective_record(none, _named_parts(option.name, parts), within)
        if found is not None:
            records[option.name] = found
    return layer.model_copy(update={"alloc_records": records})


def _named_parts(name: str, parts: dict[str, list[int]]) -> list[tuple[str, list[int]]] | None:
    """The option's parts with their tensors, in the order the backward reruns them; None where one has none."""
    found = []
    for part in name.split(","):
        if part == "norm-out":
            found += [(key, sizes) for key, sizes in parts.items() if key.startswith("norm-out:")]
        elif part in parts:
            found.append((part, parts[part]))
        else:
            return None
    return sorted(found, key=lambda item: item[0] not in MLP_SIDE)


def _selective_record(none: AllocRecord, parts: list[tuple[str, list[int]]] | None,
                      within: range | None = None) -> AllocRecord | None:
    """None's record less the parts' tensors in its forward (those `within`, where given), each part rerun at the
    start of the backward."""
    if parts is None:
        return None
    kept = allocseq.forward_sizes(none)
    span = range(len(kept)) if within is None else within
    removed: set[int] = set()
    for _, sizes in parts:
        for size in sizes:
            at = next((i for i in reversed(span) if kept[i] == size and i not in removed), None)
            if at is None:
                return None
            removed.add(at)
    return allocseq.remade(none, removed, [sizes for _, sizes in parts])
