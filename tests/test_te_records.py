"""The allocation records the replays play hold what Megatron-core's Transformer Engine layers save
(planner/cost/te_kept.py te_record): the fused SwiGLU's one 2f-wide input and no SiLU output, TE's FP8 saved
inputs; by hand on the tiny LLaMA block of tests/test_bridge_memory.py, and the records' kept bytes equal to what
the allocated peak charges."""

from __future__ import annotations

from test_bridge_memory import profile, setup

from planner.cost import float8, te_kept
from planner.cost.reserve import _alive, _sizes
from planner.schema import AllocRecord

# 64 tokens, h 64, q 64 (4 heads of 16), K/V 32, f 160, TP 1, bf16: the block's record as the analytic profile
# synthesises it (its input, the attention norm's, left out): the attention norm's 1/rms (4 B a token), the QKV
# input, Q, K, V, the logsumexp (4 heads x 4 B), the attention output, the MLP norm's input and 1/rms, the MLP
# input, gate, SiLU output, up, product (64 x 160 x 2 each), the output; backward its scratch (SwiGLU's three f-wide
# gradients, analytic.block_scratch_terms: the product's freed once the mul's two are made, they last first after)
# and input gradient
BF16_FORWARD = [256, 8192, 8192, 4096, 4096, 1024, 8192, 8192, 256, 8192, 20480, 20480, 20480, 20480, 8192]


def _kept(record: AllocRecord) -> int:
    sizes = _sizes(record.forward)
    return sum(sizes[ident] for ident in _alive(record.forward) if ident != record.output)


def test_the_fused_swiglu_record_keeps_fc1s_one_output_and_no_silu():
    tiny = profile()
    assert tiny.layers[1].alloc_records["none"].forward == BF16_FORWARD
    fused = float8.float8_profile(tiny, setup()).layers[1]
    record = fused.alloc_records["none"]
    # gate and up one 2f-wide tensor (linear_fc1's output, the SwiGLU's saved input), the product; ids renumbered
    assert record == AllocRecord(
        forward=[256, 8192, 8192, 4096, 4096, 1024, 8192, 8192, 256, 8192, 40960, 20480, 8192],
        backward=[20480, 20480, 20480, -14, 8192, -16, -15, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1],
        output=13, input_grad=17,
        params=record.params)
    kept = {option.name: option.kept_bytes for option in fused.recompute_options}
    assert _kept(record) == kept["none"] - fused.input_in_act_bytes  # the option's kept bytes, its input aside
    assert fused.alloc_records["full"] == tiny.layers[1].alloc_records["full"]  # full keeps its input only


def test_te_float8_records_save_the_linears_fp8_inputs():
    tiny = profile()
    block = float8.float8_profile(tiny, setup(float8=True)).layers[1]
    record = block.alloc_records["none"]
    # the QKV and MLP inputs at 1 B (64 x 64), linear_proj's FP8 copy (64 x 64 x 1) after the attention output,
    # linear_fc2's input made in bf16 (id 13), quantized (14) and freed
    assert record.forward == [256, 4096, 8192, 4096, 4096, 1024, 8192, 4096, 8192, 256, 4096, 40960, 20480, 10240,
                              -13, 8192]
    assert record.backward == [20480, 20480, 20480, -16, 8192, -18, -17, -14, -12, -11, -10, -9, -8, -7, -6, -5, -4,
                               -3, -2, -1]
    assert (record.output, record.input_grad) == (15, 19)
    none = next(option.kept_bytes for option in block.recompute_options if option.name == "none")
    assert _kept(record) == none - block.input_in_act_bytes
    assert _kept(record) - _kept(float8.float8_profile(tiny, setup()).layers[1].alloc_records["none"]) == \
        te_kept.te_saved_inputs_delta(tiny)


def test_under_sp_the_norm_outputs_keep_the_shards_row_wise_copy_alone():
    # the quantizer's column-wise usage is off before the norm where its input is gathered (TE v2.9
    # layernorm_linear.py 186-192, §303): no transpose on Hopper either
    for gpu, copies in (("h100", 1), ("b200", 1)):
        tiny = profile(gpu, tp=2, sp=True)
        block = float8.float8_profile(tiny, setup(float8=True)).layers[1]
        record = block.alloc_records["none"]
        assert record.forward[1:1 + copies + 1] == [32 * 64, 8192 // 2]  # 32 shard rows at 1 B, then Q
        none = next(option.kept_bytes for option in block.recompute_options if option.name == "none")
        assert _kept(record) == none - block.input_in_act_bytes


def test_a_record_without_the_mlps_run_is_left_as_it_is():
    head = AllocRecord(forward=[128, 4096], backward=[128, -1], output=2, input_grad=3)
    assert te_kept.te_record(head, fused_swiglu=20480) == head
