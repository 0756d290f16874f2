"""What one eager RMSNorm module moves, as the architecture's own code runs it: the bytes of each op of
its forward and backward (16-bit activations), counted op by op by OpBytes (planner/profiler/fake.py)
under torch 2.13 on transformers 5.24.0's modules (docs/framework-facts.md §512-§513).

The normalisation is one chain in both families: x to fp32, pow, mean, + eps, rsqrt, the product
(36 B an element forward of LLaMA's, with its two casts and the weight's product; 72 B of the
backward are the chain's own, 12 its two casts). They differ in the scale:
- LLaMA and kin (`LlamaRMSNorm.forward`, models/llama/modeling_llama.py 62-67, and every norm copied
  from it: Qwen, Mistral, SmolLM3, DeepSeek): the fp32 result cast to 16 bits, then `weight * x` in
  16 bits: 36 B an element forward, 96 backward (the weight's gradient, grad x the 16-bit normalised
  input and its sum over the tokens, 8 of them; the sum's write, 2 B of the weight's width);
- Gemma (`GemmaRMSNorm`, models/gemma/modeling_gemma.py 73-78; `Gemma3RMSNorm`, models/gemma3/
  modeling_gemma3.py 128-133; Arch.fp32_norm_scale): `output * (1.0 + weight.float())` in fp32, then
  `type_as(x)`: the product reads and writes 4 B a side, so 40 B an element forward (4 more) and 108
  backward (12 more: the gradient cast to fp32 ahead of both products, each product fp32); the weight's
  gradient is the fp32 product and its fp32 sum (16 B an element), written 4 B and cast back to 16 bits
  (6 B) over its width.
Where the norm ends what torch's checkpoint reruns (Gemma 3's post-MLP norm), the rerun stops at its last save:
the scale's product saves both its inputs before it runs, so the product and what follows are not rerun (`tail`).
The per-row figures (the statistics, fp32) are LLaMA's as they were first counted (28 and 44 B a row);
the two families run the same statistics. The weight-width bytes of the forward and of the input side
are left out (the width is one row's: under 1/T of the element bytes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RMSNormBytes:
    """Bytes one eager RMSNorm moves, per element it normalises, per row, and per element of its weight."""

    fwd: int  # forward, an element
    bwd: int  # backward, an element (the weight's gradient included)
    fwd_row: int  # forward, a row (the fp32 statistics)
    bwd_row: int  # backward, a row
    weight_grad: int  # of `bwd`: the weight's gradient an element (a zero-bubble schedule's W runs it)
    weight_out: int  # the weight's gradient written, an element of the weight
    # forward, an element, after the norm saves its last tensor: torch's non-reentrant checkpoint stops its rerun at
    # that save (an op saves its inputs before it runs), so where a norm ends the block's rerun it skips these
    tail: int

    def forward(self, elements: int, rows: int = 0) -> int:
        return self.fwd * elements + self.fwd_row * rows

    def backward(self, elements: int, rows: int = 0) -> int:
        return self.bwd * elements + self.bwd_row * rows


# transformers 5.24.0 models/llama/modeling_llama.py 62-67 (LlamaRMSNorm.forward)
LLAMA = RMSNormBytes(fwd=36, bwd=96, fwd_row=28, bwd_row=44, weight_grad=8, weight_out=2, tail=4)  # weight * x
# transformers 5.24.0 models/gemma3/modeling_gemma3.py 128-133 (Gemma3RMSNorm.forward; GemmaRMSNorm's the same,
# models/gemma/modeling_gemma.py 73-78): LLaMA's chain, its scale in fp32
GEMMA = RMSNormBytes(fwd=40, bwd=108, fwd_row=28, bwd_row=44, weight_grad=16, weight_out=10,
                     tail=14)  # the fp32 product (saving its inputs) and type_as


def rms_norm(arch) -> RMSNormBytes:
    """The eager RMSNorm the architecture's code runs (Arch.fp32_norm_scale: Gemma's fp32 scale)."""
    return GEMMA if arch.fp32_norm_scale else LLAMA
