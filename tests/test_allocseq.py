"""The allocations and frees a layer makes (planner/profiler/allocseq.py), storage by storage,
hand-counted on a Linear + GELU, and carried by a fake profile."""

import torch
from torch import nn

from planner.profiler.allocseq import layer_records

FP32 = 4


def test_a_linear_and_gelu_forward_and_backward_storage_by_storage():
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(64, 128), nn.GELU())
    x = torch.randn(4, 64, requires_grad=True)
    for param in layer.parameters():
        param.grad = torch.zeros_like(param)  # as the runtime preallocates them
    records = layer_records(layer, x, torch.ones(4, 128), [])
    out, inp, weight, bias = 4 * 128 * FP32, 4 * 64 * FP32, 128 * 64 * FP32, 128 * FP32
    none = records["none"]
    # forward: addmm's output (1, GELU saves it), GELU's output (2, the layer's output)
    assert none.forward == [out, out] and none.output == 2
    # backward: GELU's gradient (3), GELU's saved input freed, the input's gradient (4), the
    # weight's and the bias's gradients (5, 6: added into .grad, then freed), 3 freed
    assert none.backward == [out, -1, inp, weight, bias, -3, -6, -5] and none.input_grad == 4
    assert none.params == [weight, bias]
    # full (non-reentrant checkpoint): the forward keeps nothing but its output; the backward
    # recomputes addmm (3) and stops there, GELU's saved input being back
    full = records["full"]
    assert full.forward == [out, out, -1] and full.output == 2
    assert full.backward == [out, out, -3, inp, weight, bias, -4, -7, -6] and full.input_grad == 5
    assert x.grad is None
