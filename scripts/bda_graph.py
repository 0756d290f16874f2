"""Megatron-core's fused bias-dropout-add as torch.compile partitions it (docs/framework-facts.md §72): prints
the forward and backward graphs, whose outputs say what the forward keeps for the backward (the dropout's bool
mask) and which random op draws it. The function is megatron/core/fusions/fused_bias_dropout.py's
_bias_dropout_add_func (bias_dropout_add_fused_train = jit_fuser(it), jit_fuser = torch.compile on torch >= 2.2),
without its dtype casts (all bf16 here).
usage: TORCH_LOGS=aot_graphs python scripts/bda_graph.py   (CPU is enough: the partition is device-independent)"""

import torch


def _bias_dropout_add_func(x_with_bias, residual, prob, training):
    x, bias = x_with_bias
    if bias is not None:
        x = x + bias
    out = torch.nn.functional.dropout(x, p=prob, training=training)
    return residual + out


@torch.compile
def bias_dropout_add_fused_train(x_with_bias, residual, prob):
    return _bias_dropout_add_func(x_with_bias, residual, prob, True)


def main() -> None:
    x = torch.randn(64, 2, 256, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(256, dtype=torch.bfloat16, requires_grad=True)
    residual = torch.randn(64, 2, 256, dtype=torch.bfloat16, requires_grad=True)
    bias_dropout_add_fused_train((x, bias), residual, 0.1).sum().backward()
    print("compiled and ran: the graphs are in the aot_graphs log above")


if __name__ == "__main__":
    main()
