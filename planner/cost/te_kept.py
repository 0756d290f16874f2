"""What Megatron-core's Transformer Engine layers keep for the backward where it differs from the analytic
profile's dense block (planner/profiler/analytic_kept.py, which counts the tensors eager PyTorch saves), each a
fact of the runtime record read here (docs/framework-facts.md §46):

- the fused SwiGLU (RuntimeFacts.fused_swiglu_saves_input_only: megatron-core's bias_swiglu_impl, on by
  default) saves only its input, the first linear's 2f-wide output, and recomputes SiLU in its backward: the
  block keeps no SiLU output, f a token fewer than the eager block's four f-wide tensors;
- under Float8, the linears' inputs as Transformer Engine saves them (te_saved_inputs_delta).

Applied to the profile's dense decoder blocks for the option that recomputes nothing, and, for the SwiGLU,
every option that keeps the MLP; an analytic profile's only (a measured profile's kept bytes are its own).
"""

from __future__ import annotations

from planner.cost.bridgesettings import TN_ONLY_GPUS
from planner.schema import LayerProfile, Profile

BF16_BYTES = 2


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

    options = [option.model_copy(update={"kept_bytes": option.kept_bytes - less}) if keeps_mlp(option.name)
               else option for option in layer.recompute_options]
    return layer.model_copy(update={"act_bytes": layer.act_bytes - less, "recompute_options": options})


def te_saved_inputs_delta(profile: Profile) -> int:
    """Bytes a dense block keeps per microbatch under Transformer Engine's Float8 beyond the bf16 block the
    analytic profile counts (RuntimeFacts.te_float8_saved_inputs; TE v2.9, docs/framework-facts.md §46), without
    recompute: linear_qkv's and linear_fc1's norm outputs saved in FP8, 1 B an element where bf16 is 2 (under
    sequence parallelism the row-wise copy kept for the backward's all-gather, and on Hopper the transpose
    beside it: 2, no change); linear_proj's FP8 input, 1 B, beside the attention output the attention keeps in
    bf16; linear_fc2's FP8 input, 1 B, in place of the bf16 activation output. From the analytic profile's
    shape (its assumptions); 0 for another profile."""
    dims = _dims(profile)
    if dims is None:
        return 0
    shape, model = dims
    tp, cp = shape.get("tp", 1), shape.get("cp", 1)
    tokens = shape["seq_len"] // cp * shape["micro_batch_size"]  # formulas.Shape.tokens
    hidden = model["hidden_size"]
    q = model["num_heads"] * (model.get("head_dim") or hidden // model["num_heads"]) // tp
    ffn = model["intermediate_size"] // tp
    gathered = tp > 1 and shape.get("sp", False)  # the norm output's row-wise copy kept to gather it again
    norm_out = 1 + (1 if shape.get("gpu") in TN_ONLY_GPUS else 0) if gathered else 1
    norm_rows = tokens // tp if gathered else tokens
    return 2 * norm_rows * hidden * (norm_out - 2) + tokens * q - tokens * ffn
