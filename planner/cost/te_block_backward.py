"""A Megatron-core Transformer Engine decoder layer's backward as its autograd nodes free what they saved, for the
caching allocator's replay of Megatron-FSDP's step (reserve_megatron_fsdp.py). Read at TransformerEngine v2.9
(70f536662a, the TE Megatron-Bridge 25.11 pins) and megatron-core 92c8482e (docs/framework-facts.md §143):

- every saved tensor of a layer is saved by one autograd node of it: linear_qkv (TE's LayerNormLinear: the norm's
  statistics and its FP8 output, the input `inputmat`), the fused attention (Q, K, V, its output O, the softmax
  statistics), linear_proj (TE's Linear: its FP8 input), linear_fc1 (LayerNormLinear: the residual stream it
  normalises, the statistics, the FP8 norm output), megatron-core's SwiGLU (its bf16 input, fc1's output) and
  linear_fc2 (Linear: its FP8 input). Under TE's offload context every saved tensor goes through the handler's
  saved-tensor hooks, and `tensor_pop` takes it out of the handler's dict when the node unpacks it
  (cpu_offload.py 356-450): from then on only the node's backward holds it, and it is freed when the node
  returns (or earlier by TE's `clear_tensor_data`), not at the layer's end;
- TE's `_Linear.backward` frees its own FP8 input right after the wgrad GEMM (`ctx.owns_input`:
  `clear_tensor_data(inputmat_total)`, module/linear.py 895-908); `_LayerNormLinear.backward` its FP8 norm
  output after the wgrad GEMM and the statistics after the norm's backward (layernorm_linear.py 908-917, 977-978);
- the weight gradients (under --no-gradient-accumulation-fusion autograd's bf16 `.grad`, one per parameter) are
  made in their node: the wgrad GEMM's output, and the norm weight's in the norm's backward;
- megatron-core's SwiGLU backward (fusions/fused_bias_swiglu.py `SwiGLUFunction.backward`, `swiglu_back` under
  `jit_fuser` = torch.compile: one kernel writing the 2f-wide cat) makes its input's gradient while fc2's input
  gradient is alive; both the saved input and fc2's gradient are freed when it returns.

The program below re-times the frees of the layer's allocation record (allocseq.synthesised's, rewritten by
te_kept.te_record) and places the weight gradients, node by node, in the order autograd runs them: fc2, SwiGLU,
fc1, linear_proj, the attention, linear_qkv. It adds no tensor the record does not hold (the h-wide gradients
between the nodes and the FP8 casts of the incoming gradients are the record's scratch as the cost model counts
it), and it applies only where the record is the FP8 dense block te_record writes (the sizes checked against
te_kept.te_saved_inputs); elsewhere the record's own order (every saved tensor to the layer's last gradient)
stands. Pure functions; nothing here reads a file or prints.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schema import AllocRecord

# Megatron-core's decoder layer's parameters as Megatron-FSDP holds them (module registration order):
# linear_qkv.layer_norm_weight, linear_qkv.weight (q, k and v fused), linear_proj.weight,
# linear_fc1.layer_norm_weight, linear_fc1.weight (gate and up fused), linear_fc2.weight
NORM1, QKV, PROJ, NORM2, FC1, FC2 = range(6)


def megatron_parts(parts: Sequence[int]) -> list[int]:
    """A LLaMA decoder block's parameter tensors (fsdp2_layers.parameter_parts: wq, wk, wv, wo, w1, w2, w3,
    attention_norm, ffn_norm) as Megatron-core's layer holds them (the order of NORM1 .. FC2); as given where the
    block is not that nine-tensor layout."""
    if len(parts) != 9:
        return list(parts)
    wq, wk, wv, wo, w1, w2, w3, norm1, norm2 = parts
    return [norm1, wq + wk + wv, wo, norm2, w1 + w3, w2]


def program(record: AllocRecord, saved: dict | None) -> list[int | tuple[str, int]] | None:
    """The layer's backward as the replay plays it: the record's codes (n > 0 makes the record's next tensor, -k
    frees id k) with each saved tensor's free moved to its node's, and ("wgrad", n) where the node makes the weight
    gradient of parameter n (NORM1 .. FC2). `saved`: te_kept.te_saved_inputs of the profile. None where the record
    is not the FP8 dense block te_record writes (its order then stands)."""
    if saved is None:
        return None
    n = saved["norm_out"]
    ln, sizes = saved["norm_rows"], [code for code in record.forward if code > 0]
    if len(sizes) != 2 * n + 13 or record.output != len(sizes):
        return None
    # ids: 1 rsigma, 2 .. n+1 ln_out, then Q K V, the statistics, O, proj's input, the residual, rsigma, ln_out,
    # fc1's output, fc2's bf16 input (freed in the forward), fc2's FP8 input, the output
    ln1 = list(range(2, n + 2))
    q, k, v, lse, out, proj, residual, rsigma2 = range(n + 2, n + 10)
    ln2 = list(range(n + 10, 2 * n + 10))
    fc1_out, fc2_bf16, fc2 = 2 * n + 10, 2 * n + 11, 2 * n + 12
    expect = {out: saved["attn_out"], proj: saved["proj"], residual: saved["norm_bf16"], fc1_out: 2 * saved["fc2_bf16"],
              fc2_bf16: saved["fc2_bf16"], fc2: saved["fc2"], **{i: ln for i in ln1 + ln2}}
    if any(sizes[i - 1] != size for i, size in expect.items()) or -fc2_bf16 not in record.forward:
        return None
    made = [code for code in record.backward if code > 0]
    first = len(sizes) + 1  # the backward's ids: fc2's input gradient, SwiGLU's (its two halves), the input's
    g, half1, half2, grad_in = first, first + 1, first + 2, first + 3
    if made != [saved["fc2_bf16"]] * 3 + [made[-1]] or record.input_grad != grad_in:
        return None
    freed = {-code for code in record.backward if code < 0}
    if freed != {g, half1, half2, 1, *range(2, fc2_bf16), fc2}:
        return None
    wide = saved["fc2_bf16"]
    return [
        wide, ("wgrad", FC2), -fc2,  # linear_fc2: dgrad, wgrad, its FP8 input cleared
        wide, wide, -g, -fc1_out,  # SwiGLU: the 2f-wide gradient; fc2's gradient and the saved input at its return
        ("wgrad", FC1), *(-i for i in ln2), ("wgrad", NORM2), -rsigma2, -residual, -half1, -half2,  # linear_fc1
        ("wgrad", PROJ), -proj,  # linear_proj
        -out, -lse, -v, -k, -q,  # the attention, at its return
        # linear_qkv: the wgrad, its FP8 norm output cleared, the norm's backward making the input's gradient
        ("wgrad", QKV), *(-i for i in ln1), made[-1], ("wgrad", NORM1), -1,
    ]
