"""inductor_buffers.run_call on a compiled block backward's wrapper: fallback kernels' outputs (a collective's, a
tuple's items) sized from inductor's asserts, float8 buffers, and the buffers live at the peak
(docs/published-runs.md §37.bwdalloc, framework-facts §283-§286), counted by hand."""

from __future__ import annotations

from planner.profiler.inductor_buffers import graph_input_bytes, ir_buffer_bytes, run_call

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
    buf3 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(tangents_1, buf2, x_saved)
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
    # inputs 128 + 64; buf0 32 (float8): 224; the gathered buf1 64 (float8, its input's dtype): 288, buf0 freed:
    # 256; buf2 64 (float8) beside buf1: 320; buf1 freed: 256; the tuple's items (bf16 by the fallback dtype: its
    # first argument is an input of the graph, whose dtype the wrapper does not state) 128 x 2 and 64 x 2:
    # 256 + 256 + 128 = 640 before buf2 and x_saved go
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


# torch 2.6.0's wrapper for the same block (scripts/compiled_block_backward.py on 2.6.0 + torchao eab345c): its
# asserts name no op, and a Shard(1) all-gather is re-laid by a cat of uint8 views of the gathered float8, with no
# assert after it (its bytes are its views')
WRAPPER_26 = '''
def call(args):
    tangents_1, = args
    args.clear()
    assert_size_stride(tangents_1, (1, 4, 8), (32, 8, 1))
    buf0 = empty_strided_cpu((1, 4, 8), (32, 8, 1), torch.float8_e5m2)
    cpp_fused__to_copy_0(tangents_1, buf0)
    buf1 = torch.ops._c10d_functional.all_gather_into_tensor.default(buf0, 2, '0')
    assert_size_stride(buf1, (2, 4, 8), (32, 8, 1))
    torch.ops._c10d_functional.wait_tensor.default(buf1)
    buf2 = torch.ops.aten.cat.default([aten.view.dtype(reinterpret_tensor(buf1, (1, 4, 8), (32, 8, 1), 0), torch.uint8), aten.view.dtype(reinterpret_tensor(buf1, (1, 4, 8), (32, 8, 1), 32), torch.uint8)], 1)
    del buf1
    buf3 = empty_strided_cpu((2, 4, 8), (32, 8, 1), torch.float32)
    cpp_fused_1(buf2, buf3)
    del buf2
    buf4 = torch.ops._c10d_functional.reduce_scatter_tensor.default(buf3, 'sum', 2, '0')
    assert_size_stride(buf4, (1, 4, 8), (32, 8, 1))
    del buf3
    return (buf4, )
'''


def test_torch_26_asserts_and_a_collectives_dtype_its_inputs():
    result = run_call(WRAPPER_26, {"tangents_1": 64})
    # tangents 64; buf0 32 (float8): 96; buf1 the gathered float8 64: 160; the cat of uint8 views 64: 224; buf1
    # freed: 160; buf3 256 (fp32): 416; buf2 freed: 352; buf3's reduce-scatter 128 (fp32, its input's dtype, not
    # the bf16 fallback's 64): 480, the peak
    assert result.peak_bytes == 480
    assert dict(result.at_peak) == {"buf3": 256, "buf4": 128, "tangents_1": 64, "buf0": 32}
    assert [result.storage_bytes[s] for s in result.returned_storages] == [128]


def test_a_fused_ops_items_sized_from_inductors_ir():
    # 2.6.0 with async TP: symm_mem's fused all-gather + scaled matmul returns (the gathered input, [outputs]) and the
    # wrapper writes no assert after the items; their layouts are in ir_post_fusion.txt
    wrapper = '''
def call(args):
    x_shard, w = args
    args.clear()
    buf0 = empty_strided_cpu((1, 4, 8), (32, 8, 1), torch.float8_e4m3fn)
    cpp_fused_cast_0(x_shard, buf0)
    buf1 = torch.ops.symm_mem.fused_all_gather_scaled_matmul.default(buf0, [w], buf2, [buf3], 1, '0', [None], [None], [torch.bfloat16], [False])
    buf4 = buf1[0]
    buf5 = buf1[1][0]
    del buf1
    del buf0
    return (buf4, buf5, )
'''
    ir = ("    buf4.layout = FixedLayout('cpu', torch.float8_e4m3fn, size=[1, 8, 8], stride=[64, 8, 1])\n"
          "    buf5.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 8, 16], stride=[128, 16, 1])\n"
          "    buf2.layout = FixedLayout('cpu', torch.float32, size=[], stride=[])\n")
    assert ir_buffer_bytes(ir) == {"buf4": 64, "buf5": 256, "buf2": 4}
    result = run_call(wrapper, {"x_shard": 64, "w": 256}, buffer_bytes=ir_buffer_bytes(ir))
    # inputs 64 + 256; buf0 32: 352; the gathered input 64 (float8) and the output 256 (bf16): 672
    assert result.peak_bytes == 672
    assert [result.storage_bytes[s] for s in result.returned_storages] == [64, 256]
    # without the IR the items would inherit the float8 shard's dtype, and with no assert hold no bytes
    assert run_call(wrapper, {"x_shard": 64, "w": 256}).peak_bytes == 352


def test_a_fused_op_returning_one_tensor_sized_from_inductors_ir():
    # 2.6.0 with async TP: fused_scaled_matmul_reduce_scatter returns one tensor; the wrapper writes its MultiOutput
    # as `bufM = bufN` with no assert after it, and ir_post_fusion.txt states bufM's layout (§439). The block's
    # output is that storage (`buf4 = buf2  # reuse` then an in-place add): it holds its bytes to the return.
    wrapper = '''
def call(args):
    x, w = args
    args.clear()
    buf0 = empty_strided_cpu((1, 8, 8), (64, 8, 1), torch.float8_e4m3fn)
    cpp_fused_cast_0(x, buf0)
    buf1 = torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter.default(buf0, w, buf5, buf6, 'sum', 1, '0', None, None, torch.bfloat16, True)
    del buf0
    buf2 = buf1
    del buf1
    buf3 = empty_strided_cpu((1, 4, 16), (64, 16, 1), torch.float32)
    cpp_fused_1(buf2, buf3)
    del buf3
    buf4 = buf2; del buf2  # reuse
    cpp_fused_add_2(buf4, x)
    return (buf4, )
'''
    ir = "    buf2.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 4, 16], stride=[64, 16, 1])\n"
    result = run_call(wrapper, {"x": 128, "w": 256}, buffer_bytes=ir_buffer_bytes(ir))
    # inputs 128 + 256; buf0 64 (float8): 448; then the output 128 (bf16 1x4x16) and buf3 256 (fp32): 768
    assert result.peak_bytes == 768
    assert [result.storage_bytes[s] for s in result.returned_storages] == [128]
    made = [e for e in result.events if e > 0 and e not in result.inputs]
    assert [result.storage_bytes[e] for e in made] == [64, 128, 256]
    # without the IR the output holds no bytes: the peak is the inputs with buf3 (640), the returned storage 0
    bare = run_call(wrapper, {"x": 128, "w": 256})
    assert bare.peak_bytes == 640
    assert [bare.storage_bytes[s] for s in bare.returned_storages] == [0]
