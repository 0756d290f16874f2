"""A GPT-style block's MLP activation (Arch.mlp_act): the f-wide tensors its MLP keeps between
the two linears, and the bytes the activation moves per element of that tensor in 16 bits.

Read from the code each runs, on torch 2.13 and transformers 5.24 (docs/framework-facts.md §54):
- "gelu": Megatron-LM's GELU as Korthikanti et al. count it: the fused bias-GELU saves its input
  (megatron/core/fusions/fused_bias_gelu.py GeLUFunction.save_for_backward, 6e091e1b) and its
  output is the second linear's input: two tensors. Its passes are timed at gelu_new's eager bytes
  (36 / 56, as before this record; Megatron-core's own kernels are te_fused.py's), its selective
  rerun at the fused kernel's 4 B.
- "gelu_kernel": GELU as one torch kernel (F.gelu, exact or tanh: transformers' gelu and
  gelu_pytorch_tanh, StarCoder2's): GeluBackward0 saves its input; read 2 write 2 forward, read the
  gradient and the input and write 2 backward.
- "relu": OPT's; ReluBackward0 saves its result, which is the second linear's input: one tensor.
- "gelu_new": transformers' NewGELUActivation (GPT-2's default; AccurateGELUActivation runs the same
  ops), 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as eight eager ops: pow saves x, tanh its output,
  the last product both factors, 0.5·x and 1 + tanh: four tensors, five with the output. 36 B forward
  (pow, two scalar products, the add, tanh, 1 + tanh, 0.5·x: 4 each; the product 6); 56 backward
  (the product's two gradients 12, 0.5·x's 4, tanh's 6, the two scalar products' 8, pow's 14, the
  three gradients of x summed 12).
- "gelu_fast": FastGELUActivation, 0.5·x·(1 + tanh(0.7978845608·x·(1 + 0.044715·x·x))): its two
  tensor products save x, 0.044715·x, 0.7978845608·x and 1 + 0.044715·x², tanh its output, the last
  product 0.5·x and 1 + tanh: seven, eight with the output; 42 B forward, 72 backward.
- "gelu_python": GELUActivation(use_gelu_python=True), x·0.5·(1 + erf(x/√2)): erf saves x/√2 and
  the product x·0.5 and 1 + erf, not x itself: three, four with the output; 22 B forward, 48
  backward.
Each count is what torch's saved-tensor hooks see and what fake.OpBytes counts on the module alone
(tests/test_activations.py runs both).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Activation:
    kept: int  # f-wide tensors the MLP keeps between its linears: the activation's saved ones and its output
    fwd_bytes: int  # bytes moved per element of the activation, 16-bit, forward
    bwd_bytes: int  # and backward
    rerun_bytes: int  # what a selective recompute of the activation (`mlp-act`) moves per element


ACTIVATIONS = {
    "gelu": Activation(kept=2, fwd_bytes=36, bwd_bytes=56, rerun_bytes=4),
    "gelu_kernel": Activation(kept=2, fwd_bytes=4, bwd_bytes=6, rerun_bytes=4),
    "relu": Activation(kept=1, fwd_bytes=4, bwd_bytes=6, rerun_bytes=4),
    "gelu_new": Activation(kept=5, fwd_bytes=36, bwd_bytes=56, rerun_bytes=36),
    "gelu_fast": Activation(kept=8, fwd_bytes=42, bwd_bytes=72, rerun_bytes=42),
    "gelu_python": Activation(kept=4, fwd_bytes=22, bwd_bytes=48, rerun_bytes=22),
}


def freed_by_rerun(act: str) -> int:
    """f-wide tensors `mlp-act` frees: a checkpoint of the activation keeps its input, one tensor,
    where the MLP kept `kept` (ReLU: none freed, its output is its own backward's input)."""
    return ACTIVATIONS[act].kept - 1
