"""inductor_buffers.run_call on a compiled block backward's wrapper: fallback kernels' outputs (a collective's, a
tuple's items) sized from inductor's asserts, float8 buffers, and the buffers live at the peak
(docs/published-runs.md §37.bwdalloc, framework-facts §283-§286), counted by hand."""

from __future__ import annotations

from planner.profiler.inductor_buffers import graph_input_bytes, run_call

# the shape of torch 2.13's wrapper for a Float8 TP block's backward (scripts/compiled_block_backward.py), cut down:
# the incoming gradient's float8 cast all-gathered, its transposed copy, an attention backward's tuple
WRAPPER = '''
def call(self, args):
    x_saved, tangents_1 = args
    args.clear()
    buf0 = empty_strided_cpu((4, 8), (8, 1), torch.float8_e5m2)
    cpp_fused_cast_0(tangents_1, buf0)
    buf1 = torch.ops._c10d_functional.all_gather_into_tensor.default(buf0, 2, '0')
    assert_size_stride(buf1, (8, 8), (8, 1), 'torch.ops._c10d_functional.all_gather_into_tensor.default')
    del buf0
    buf2 = empty_strided_cpu((8, 8), (1, 8), torch.float8_e5m2)
    cpp_fused_clone_1(buf1, buf2)
    del buf1
    buf3 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(buf2, x_saved)
    buf4 = buf3[0]
    assert_size_stride(buf4, (2, 8, 8), (64, 8, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default')
    buf5 = buf3[1]
    assert_size_stride(buf5, (2, 4, 8), (32, 8, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default')
    del buf3
    del buf2
    del x_saved
    buf6 = buf4; del buf4  # reuse
    return (buf6, buf5, )
'''
FX = 'def forward(self, x_saved: "f8e4m3fn[8, 16]", tangents_1: "bf16[4, 8]"):\n    pass\n'


def test_the_graphs_inputs_by_their_annotations():
    assert graph_input_bytes(FX) == {"x_saved": 128, "tangents_1": 64}


def test_fallback_outputs_are_sized_from_inductors_asserts_and_the_peak_names_its_buffers():
    result = run_call(WRAPPER, graph_input_bytes(FX))
    # inputs 128 + 64; buf0 32 (float8); the gathered buf1 64 (bf16 by the fallback dtype), buf0 freed: 224 + 64;
    # buf2 64 (float8) beside buf1: 128 + 64 + 64 + 64 = 320; buf1 freed: 256; the tuple's items 128 x 2 (bf16)
    # and 64 x 2: 256 + 256 + 128 = 640 before buf2 and x_saved go
    assert result.peak_bytes == 640
    assert result.peak_statement.startswith("assert_size_stride(buf5")
    assert dict(result.at_peak) == {"buf4": 256, "x_saved": 128, "buf5": 128, "tangents_1": 64, "buf2": 64}
    assert [result.storage_bytes[s] for s in result.returned_storages] == [256, 128]


def test_the_fallback_dtype_is_the_callers():
    result = run_call(WRAPPER, graph_input_bytes(FX), fallback_dtype="torch.float32")
    assert dict(result.at_peak)["buf4"] == 512


def test_a_checkpointed_graphs_symbolic_sizes_hold_no_storage():
    # torch 2.13's wrapper for a checkpointed block's backward reads its rng state's symbolic size
    wrapper = WRAPPER.replace("    args.clear()\n", "    args.clear()\n    x_saved_size = x_saved.size()\n    s0 = x_saved_size[0]\n")
    assert run_call(wrapper, graph_input_bytes(FX)).peak_bytes == 640
