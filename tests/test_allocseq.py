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


def test_an_analytic_layer_is_given_records_from_the_tensors_its_formulas_count():
    from planner.profiler import analytic
    from planner.profiler.allocseq import synthesised
    from planner.schema import LayerProfile

    layer = LayerProfile(name="b", kind="block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2,
                         bwd_ms_max=2, act_bytes=700, input_bytes=100, output_bytes=100, input_in_act_bytes=100,
                         param_count=10, param_bytes=20, transient_bytes=400)
    records = synthesised(layer, [100, 200, 400]).alloc_records  # the input (100) is the previous layer's
    # none: the two kept tensors and the output; backward: scratch (transient 400 less the incoming
    # gradient's 100), the input's gradient, then scratch and kept freed, last first
    assert records["none"].forward == [200, 400, 100] and records["none"].output == 3
    assert records["none"].backward == [300, 100, -4, -2, -1] and records["none"].input_grad == 5
    # full: the output alone, then the kept tensors again in the backward
    assert records["full"].forward == [100] and records["full"].output == 1
    assert records["full"].backward == [200, 400, 300, 100, -4, -3, -2] and records["full"].input_grad == 5
    assert records["none"].params == [20]
    # an analytic profile carries them for every layer: none's forward makes its kept bytes (less
    # the input the previous layer made) and its output
    from planner.models.archs import arch, gpu
    from planner.profiler.formulas import Shape

    block = analytic.block_layer(0, arch("llama3-8b"), Shape(seq_len=256, micro_batch_size=1), gpu("h100-sxm"))
    none = block.alloc_records["none"]
    assert sum(none.forward[:-1]) == block.act_bytes - block.input_in_act_bytes
    assert none.forward[-1] == block.output_bytes and none.output == len(none.forward)


def test_an_analytic_blocks_scratch_is_swiglus_three_gradients_and_survives_the_compiled_remake():
    from planner.models.archs import arch, gpu
    from planner.profiler import analytic
    from planner.profiler.allocseq import synthesised
    from planner.profiler.formulas import Shape

    shape = Shape(seq_len=256, micro_batch_size=1)
    block = analytic.block_layer(0, arch("llama3-8b"), shape, gpu("h100-sxm"))
    # [tokens, f] in bf16: w2's input gradient (the product's), then the mul's two (SiLU's output's, w3's output's)
    wide = 256 * 14336 * 2
    assert analytic.block_scratch_terms(arch("llama3-8b"), shape) == [wide, wide, wide]
    assert block.transient_bytes == 256 * 4096 * 2 + 3 * wide  # the output's gradient and the three
    none = block.alloc_records["none"]
    made = len([code for code in none.forward if code > 0])
    # the three, the product's freed, the input's gradient [tokens, h], then the mul's two freed last first
    assert none.backward[:7] == [wide, wide, wide, -(made + 1), 256 * 4096 * 2, -(made + 3), -(made + 2)]
    # remade from other kept tensors (--compile's), the scratch keeps its cut and its early free
    again = synthesised(block, [block.input_in_act_bytes, 1000]).alloc_records["none"]
    assert again.backward[:6] == [wide, wide, wide, -3, 256 * 4096 * 2, -5]


def test_a_gelu_blocks_scratch_is_two_gradients():
    from planner.models.archs import arch
    from planner.profiler import analytic
    from planner.profiler.formulas import Shape

    gpt = arch("gpt3-175b")
    shape = Shape(seq_len=128, micro_batch_size=1, tp=8)
    wide = 128 * (gpt.intermediate_size // 8) * 2  # fc2's input gradient, GELU's backward output
    assert analytic.block_scratch_terms(gpt, shape) == [wide, wide]
    assert analytic.block_scratch(gpt, shape).freed_early == 0
