"""What a block keeps under Transformer Engine's FP8 (current scaling) for the selective recompute options, beside
the option that recomputes nothing (planner/cost/te_kept.py te_saved_inputs_delta for a dense block,
planner/cost/te_moe_float8.py saved_inputs_delta for a Megatron-core MoE block): which of the FP8 inputs TE's
linears save are still kept when a module is rerun (TE v2.9, megatron-core 92c8482e; docs/framework-facts.md §113).

A module under Megatron's selective recompute runs its first forward under `torch.no_grad()` (TE's `checkpoint`
for `mlp` / `moe` under FP8, transformer_engine/pytorch/distributed.py 354; `CheckpointWithoutOutput` for `moe_act`
and `layernorm`, megatron/core/tensor_parallel/random.py 502; `tensor_parallel.checkpoint` for `core_attn`), so
what its own linears would save is not saved; the linears outside it save their FP8 inputs as without recompute:
- `core-attn` (core_attn): the attention core saves nothing, so the bf16 attention output, which the core's kept
  tensors held beside linear_proj's FP8 copy without recompute, is kept by nothing: linear_proj's FP8 input
  (1 B x T q) in place of the bf16 output (2 B x T q) the bf16 option counts; the other linears as without
  recompute;
- `mlp` (dense mlp, a MoE block's moe): linear_fc1's and linear_fc2's inputs (a dense block's MLP norm output, a
  MoE block's permuted tokens and GLU output) are not saved: only the attention's FP8 inputs differ from the bf16
  option's count (linear_qkv's norm output at 1 B, linear_proj's FP8 input beside the attention output). The
  bf16 count keeps the checkpoint's input; under the TE spec a dense MLP's norm is inside linear_fc1 and
  reruns with it, which the bf16 count does not take off either (analytic_kept's safe side);
- `mlp-act` on a MoE block (moe_act): Megatron sets `save_original_input` on linear_fc2 under FP8 (experts.py
  99-105), so linear_fc2 saves its bf16 input, the weighted GLU's output, which the `CheckpointWithoutOutput`
  discards and reruns: linear_fc2 keeps no FP8 copy, the bf16 option counts none; linear_fc1 and the attention as
  without recompute;
- `norm-out` on a MoE block (layernorm: its pre-MLP TENorm): the norm's output feeds the router and the
  dispatcher, not a TE linear the FP8 record runs (`set_for_recompute_pre_mlp_layernorm` sets `save_original_input`
  on the shared experts' linear_fc1 only, moe_layer.py 335-342): every FP8 input as without recompute.
A dense block's `mlp-act` (no Megatron module), whole-attention `attn`, `mla-up`, offload and op-level AC, and any
combination with them, keep the bf16 count (the safe side, as before); `full` keeps the block's input only. Only
kept bytes move: these options hold no allocation record (the replay plays none's), and their rerun's extra peak
(recompute_peak_bytes) stays the bf16 one, the larger (the safe side).
"""

from __future__ import annotations

from planner.schema import LayerProfile, Profile

DENSE_PARTS = frozenset({"core-attn", "mlp"})
MOE_PARTS = frozenset({"core-attn", "mlp", "mlp-act", "norm-out"})


def dense_delta(name: str, tensors: dict) -> int | None:
    """Bytes a dense block keeps a microbatch under option `name` under TE's FP8 beyond its bf16 count
    (te_kept.te_saved_inputs' tensors); None for an option not read here (the module's docstring)."""
    parts = set(name.split(","))
    if not parts <= DENSE_PARTS:
        return None
    norm = tensors["norm_rows"] * tensors["norm_out"] - tensors["norm_bf16"]  # one norm output, FP8 for bf16
    proj = tensors["proj"] - (tensors["attn_out"] if "core-attn" in parts else 0)
    mlp = 0 if "mlp" in parts else norm + tensors["fc2"] - tensors["fc2_bf16"]
    return norm + proj + mlp


def moe_delta(name: str, tensors: dict) -> int | None:
    """The same for a Megatron-core MoE block (te_moe_float8.saved_inputs' tensors)."""
    parts = set(name.split(","))
    if not parts <= MOE_PARTS:
        return None
    proj = tensors["proj"] - (tensors["attn_out"] if "core-attn" in parts else 0)
    fc1 = 0 if "mlp" in parts else tensors["fc1"] - tensors["fc1_bf16"]
    fc2 = 0 if "mlp" in parts or "mlp-act" in parts else tensors["fc2"] - tensors["fc2_bf16"]
    return tensors["norm"] - tensors["norm_bf16"] + proj + fc1 + fc2


def selective_kept(profile: Profile, *, dense: dict | None, moe: dict | None) -> Profile:
    """The profile with each selective option's kept bytes (not none's, which te_kept and te_moe_float8 charge)
    under TE's FP8: `dense` te_kept.te_saved_inputs' tensors for the decoder blocks, `moe`
    te_moe_float8.saved_inputs' for the MoE blocks (None: the block kind's count not read)."""
    def moved(layer: LayerProfile) -> LayerProfile:
        tensors, delta_of = (dense, dense_delta) if layer.kind == "decoder_block" else (moe, moe_delta)
        if tensors is None or layer.kind not in ("decoder_block", "moe_block") or layer.float8 is None:
            return layer
        options = []
        for option in layer.recompute_options:
            delta = None if option.name == "none" else delta_of(option.name, tensors)
            options.append(option if delta is None else option.model_copy(update={"kept_bytes": option.kept_bytes + delta}))
        return layer.model_copy(update={"recompute_options": options})

    return profile.model_copy(update={"layers": [moved(layer) for layer in profile.layers]})
