"""Megatron-FSDP's replay (planner/cost/reserve_megatron_fsdp.py) as the code frees row B3's tensors: a Transformer
Engine FP8 decoder block's backward node by node (planner/cost/te_block_backward.py: each saved tensor freed when
the node that saved it returns or TE clears it, each bf16 weight gradient made in its node), by hand on the tiny
LLaMA block of tests/test_bridge_memory.py; and the reduce queue's element capacity freeing the output layer's
gradient bucket at the last unit's post-backward (wait_for_previous_grad_reduce)."""

from __future__ import annotations

import dataclasses

from test_bridge_memory import profile, setup
from test_fsdpreplay import LAYERS, LOSS, OPTIONS, RECORDS, STATIC, _Layer, _Option

from planner.cost import allocator, float8, te_block_backward, te_kept
from planner.cost.allocator import Alloc, Free
from planner.cost.reserve_megatron_fsdp import FsdpLayer, FsdpStatic, step_player
from planner.schema import AllocRecord

MIB = 2**20


def _fp8_block():
    tiny = profile()
    return tiny, float8.float8_profile(tiny, setup(float8=True)).layers[1].alloc_records["none"]


def test_megatrons_six_parameter_tensors_from_the_nine_of_a_llama_block():
    # wq 64x64, wk and wv 32x64, wo, w1 w2 w3 (f 160), the two norms: qkv and fc1 fused, in the layer's order
    assert te_block_backward.megatron_parts([4096, 2048, 2048, 4096, 10240, 10240, 10240, 64, 64]) == \
        [64, 8192, 4096, 64, 20480, 10240]
    assert te_block_backward.megatron_parts([5, 7]) == [5, 7]


def test_the_fp8_blocks_backward_node_by_node():
    tiny, record = _fp8_block()
    # the record (tests/test_te_records.py): ids 1 rsigma, 2 the FP8 norm output, 3-5 Q K V, 6 the statistics,
    # 7 the attention output, 8 linear_proj's FP8 input, 9 the MLP norm's input, 10 its rsigma, 11 its FP8 output,
    # 12 fc1's output, 13 fc2's bf16 input (freed in the forward), 14 fc2's FP8 input, 15 the output; backward
    # 16 fc2's input gradient, 17-18 SwiGLU's 2f-wide gradient, 19 the input's
    program = te_block_backward.program(record, te_kept.te_saved_inputs(tiny))
    wgrad = {n: ("wgrad", n) for n in range(6)}
    assert program == [
        20480, wgrad[5], -14,  # linear_fc2: dgrad, wgrad, its FP8 input cleared after the wgrad GEMM
        20480, 20480, -16, -12,  # SwiGLU: fc2's gradient and its saved input gone when it returns
        wgrad[4], -11, wgrad[3], -10, -9, -17, -18,  # linear_fc1: wgrad, ln_out cleared, the norm's, rsigma, inputmat
        wgrad[2], -8,  # linear_proj
        -7, -6, -5, -4, -3,  # the attention
        wgrad[1], -2, 8192, wgrad[0], -1,  # linear_qkv, its norm making the input's gradient
    ]
    # every code of the record's backward is played once, allocations in the record's order
    codes = [item for item in program if isinstance(item, int)]
    assert sorted(codes) == sorted(record.backward)
    assert [c for c in codes if c > 0] == [c for c in record.backward if c > 0]
    # not the FP8 block te_record writes (the bf16 block; no profile facts): the record's own order stands
    bf16 = float8.float8_profile(tiny, setup()).layers[1].alloc_records["none"]
    assert te_block_backward.program(bf16, te_kept.te_saved_inputs(tiny)) is None
    assert te_block_backward.program(record, None) is None


def _stage_peak(record: AllocRecord, programs) -> int:
    """An embedding, the FP8 block and a head with no Megatron-FSDP buffers but the block's unfused gradients."""
    none = sum(record.forward[:14]) + 8192  # the block keeps its input (the embedding's output) too
    layers = [_Layer("embedding"), _Layer("decoder_block", (_Option("none", none),)), _Layer("norm+lm_head")]
    edge = FsdpLayer(shards=(), moment=0, step_grad=0, unit=False, gathered=(), bucket=0)
    block = FsdpLayer(shards=(), moment=0, step_grad=0, unit=True, gathered=(), bucket=0,
                      unfused=(128, 16384, 8192, 128, 40960, 20480))  # Megatron's six, bf16
    static, one_step = step_player(
        layers, ["none"] * 3, [AllocRecord(forward=[8192], output=1), record,
                               AllocRecord(forward=[16384], backward=[8192], output=1, input_grad=2)],
        static=FsdpStatic(layers=(edge, block, edge), rest_bytes=0), num_microbatches=1,
        loss=AllocRecord(forward=[64], backward=[-1]), keeps_logits=True, programs=programs)
    state = allocator.CachingAllocator()
    allocator.play(state, static)
    allocator.play(state, one_step(0))
    return state.allocated_peak


def test_the_blocks_backward_peak_by_hand_in_either_order():
    tiny, record = _fp8_block()
    program = te_block_backward.program(record, te_kept.te_saved_inputs(tiny))
    # bytes: the block's saved set 98,304 (what its forward leaves but its output: 256 + 4096 + 8192 + 4096 + 4096
    # + 1024 + 8192 + 4096 + 8192 + 256 + 4096 + 40960 + 10240, the two 256 B statistics taking 512 B each, the
    # caching allocator's rounding), its input 8192 (the embedding's output), the head's input gradient 8192 it
    # receives; its output went with the head's forward, the logits with the head's backward. Node by node the most
    # is at SwiGLU's second half: + fc2's gradient 20480 + fc2's wgrad 20480 - fc2's FP8 input 10240 + 2 x 20480
    assert _stage_peak(record, [None, program, None]) == 8192 + 98304 + 8192 + 20480 + 20480 - 10240 + 2 * 20480
    # in the record's order every saved tensor stays to the input's gradient, and the six bf16 gradients (87,040:
    # the norms' 128 B at 512) come after it: + 3 x 20480 - 20480 + 8192 + 87040
    assert _stage_peak(record, None) == 8192 + 98304 + 8192 + 2 * 20480 + 8192 + 87040


def test_the_queue_capacity_frees_the_heads_bucket_at_the_last_units_post_backward():
    layers = tuple(dataclasses.replace(layer, elements=layer.bucket // 2) for layer in STATIC.layers)
    key = (0, 0)

    def events(capacity):
        static = FsdpStatic(layers=layers, rest_bytes=0, queue_capacity=capacity)
        return step_player(LAYERS, OPTIONS, RECORDS, static=static, num_microbatches=1, loss=LOSS,
                           keeps_logits=True)[1](0)

    freed = Free(("gbucket", key, 5))
    # the head's bucket (3 Mi elements) alone passes a capacity of 2 Mi when the last block (4) reduces: it is
    # waited for and freed there, after block 4's gradients went into their slot and before block 3's backward
    late, early = events(None), events(2 * MIB)
    assert early.index(freed) == early.index(Free(("wgrad", key, 4, 1))) + 1
    assert early.index(freed) < early.index(Alloc((key, 3, 3), 4 * MIB))
    # without it (two buckets queued alone) at block 3's post-backward, after its backward
    assert late.index(freed) > late.index(Alloc((key, 3, 3), 4 * MIB))
    # a capacity the queue never passes changes nothing
    assert events(64 * MIB) == late
