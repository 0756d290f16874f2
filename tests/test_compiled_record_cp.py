"""A compiled block's record under context parallelism (docs/published-runs.md §42.cpblock): torch 2.6.0 traces the
ring into the block's graph, so its all-gather, its flash calls (run_and_save_rng_state in the forward,
run_with_rng_state in the backward's rerun) and the backward's all_to_all_single are the wrappers' own statements.
Counted by hand on wrappers cut to those statements as scripts/compiled_block_cp.py's reading writes them; the
record matched only at its CP degree, and played in place of cpring's ring."""

from __future__ import annotations

from planner.cost import compiled_block
from planner.profiler import compiled_blocks
from planner.profiler.compiled_record import Wrapper, block_record
from planner.schema import AllocRecord, LayerProfile, TrainSetup

# the IR's layouts of the fallbacks' items (2.6.0 writes no assert after a tuple's items): the rng state (CPU's
# generator in a CPU reading; 16 B here), each step's output O (bf16, 64 B) and logsumexp (fp32, 16 B)
IR = """
buf3.layout = FixedLayout('cpu', torch.uint8, size=[16], stride=[1])
buf4.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf5.layout = FixedLayout('cpu', torch.float32, size=[1, 2, 2], stride=[4, 2, 1])
buf7.layout = FixedLayout('cpu', torch.uint8, size=[16], stride=[1])
buf8.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf9.layout = FixedLayout('cpu', torch.float32, size=[1, 2, 2], stride=[4, 2, 1])
"""


def forward() -> Wrapper:
    """The ring's forward at CP 2 on rank 1: K/V concatenated (128 B) and all-gathered (256 B; the input freed at
    the wait), two flash calls each saving its rng state, the merge into an fp32 running output (128 B), the
    attention's bf16 output (64 B, the block's output here); saved: the gathered K/V, the two rng states."""
    code = """
def call(self, args):
    primals_1, primals_2 = args
    args.clear()
    buf0 = empty_strided_cpu((64, ), (1, ), torch.bfloat16)
    cpp_fused_cat_0(primals_2, buf0)
    buf1 = torch.ops._c10d_functional.all_gather_into_tensor.default(buf0, 2, '1')
    assert_size_stride(buf1, (128, ), (1, ))
    torch.ops._c10d_functional.wait_tensor.default(buf1)
    del buf0
    buf2 = torch.ops.higher_order.run_and_save_rng_state(torch.ops.aten._scaled_dot_product_flash_attention.default, primals_1, primals_2, primals_2, 0.0, True)
    buf3 = buf2[0]
    buf4 = buf2[1][0]
    buf5 = buf2[1][1]
    del buf2
    buf6 = torch.ops.higher_order.run_and_save_rng_state(torch.ops.aten._scaled_dot_product_flash_attention.default, primals_1, reinterpret_tensor(buf1, (1, 2, 4, 2), (128, 16, 2, 1), 0), reinterpret_tensor(buf1, (1, 2, 4, 2), (128, 16, 2, 1), 64))
    buf7 = buf6[0]
    buf8 = buf6[1][0]
    buf9 = buf6[1][1]
    del buf6
    buf10 = empty_strided_cpu((1, 2, 8, 2), (32, 16, 2, 1), torch.float32)
    cpp_fused_merge_1(buf4, buf5, buf8, buf9, buf10)
    del buf4
    del buf5
    del buf8
    del buf9
    buf11 = empty_strided_cpu((1, 2, 8, 2), (32, 16, 2, 1), torch.bfloat16)
    cpp_fused__to_copy_2(buf10, buf11)
    del buf10
    return (buf11, primals_1, buf1, buf3, buf7, )
"""
    fx = 'def forward(self, primals_1: "bf16[1, 2, 8, 2]", primals_2: "bf16[1, 2, 8, 2]"):\n    pass\n'
    return Wrapper(code, fx, IR)


BACKWARD_IR = """
buf1.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf2.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf3.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf5.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 8, 2], stride=[32, 16, 2, 1])
buf6.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 4, 2], stride=[16, 8, 2, 1])
buf7.layout = FixedLayout('cpu', torch.bfloat16, size=[1, 2, 4, 2], stride=[16, 8, 2, 1])
"""


def backward() -> Wrapper:
    """Its backward: the two steps' flash backwards issued together (dq 64 B, dk and dv 64 B at step 0, 32 B at step
    1, all alive at once), the gathered K/V freed after the last; dK, dV in fp32 sent by all_to_all_single (256 B
    each way; the sent buffer freed after the wait); the rng states freed where the rerun reads them; dQ (64 B) the
    block input's gradient."""
    code = """
def call(self, args):
    primals_1, buf1_saved, rng_state_output_0, rng_state_output_1, tangents_1 = args
    args.clear()
    del rng_state_output_0
    del rng_state_output_1
    buf0 = torch.ops.aten._scaled_dot_product_flash_attention_backward.default(tangents_1, primals_1, primals_1, primals_1, tangents_1, tangents_1, None, None, 8, 8, 0.0, True, tangents_1, tangents_1)
    buf4 = torch.ops.aten._scaled_dot_product_flash_attention_backward.default(tangents_1, primals_1, reinterpret_tensor(buf1_saved, (1, 2, 4, 2), (128, 16, 2, 1), 0), reinterpret_tensor(buf1_saved, (1, 2, 4, 2), (128, 16, 2, 1), 64), tangents_1, tangents_1, None, None, 8, 4, 0.0, False, tangents_1, tangents_1)
    del buf1_saved
    buf1 = buf0[0]
    buf2 = buf0[1]
    buf3 = buf0[2]
    del buf0
    buf5 = buf4[0]
    buf6 = buf4[1]
    buf7 = buf4[2]
    del buf4
    buf8 = empty_strided_cpu((64, ), (1, ), torch.float32)
    cpp_fused_cat_3(buf2, buf3, buf8)
    del buf2
    del buf3
    buf9 = torch.ops._c10d_functional.all_to_all_single.default(buf8, [64, 0], [64, 0], '1')
    assert_size_stride(buf9, (64, ), (1, ))
    torch.ops._c10d_functional.wait_tensor.default(buf9)
    del buf8
    buf10 = empty_strided_cpu((1, 2, 8, 2), (32, 16, 2, 1), torch.bfloat16)
    cpp_fused_add_4(buf1, buf5, buf6, buf7, buf9, buf10)
    del buf1
    del buf5
    del buf6
    del buf7
    del buf9
    del primals_1
    del tangents_1
    return (buf10, None, )
"""
    fx = ('def forward(self, primals_1: "bf16[1, 2, 8, 2]", buf1_saved: "bf16[128]", rng_state_output_0: "u8[16]", '
          'rng_state_output_1: "u8[16]", tangents_1: "bf16[1, 2, 8, 2]"):\n    pass\n')
    return Wrapper(code, fx, BACKWARD_IR)


def test_the_rings_statements_read_by_hand():
    record = block_record(forward(), backward())
    # forward: the concatenation (1, 128 B), the gathered K/V (2, 256 B), the concatenation freed at the wait; step 0:
    # its rng state (3, 16), O (4, 64), lse (5, 16); step 1: rng state (6), O (7), lse (8); the fp32 merge (9, 128),
    # then both steps' O and lse freed; the bf16 output (10, 64), the merge freed; the gathered K/V and both rng
    # states saved (alive), the output alive
    assert record.forward == [128, 256, -1, 16, 64, 16, 16, 64, 16, 128, -4, -5, -7, -8, 64, -9]
    assert record.output == 10
    # backward, ids from 11: the rng states freed first (3, 6); each flash backward's dq, dk, dv made where the op
    # runs, though the wrapper takes them out of its tuple after the next call and the gathered K/V's free: step 0's
    # (11-13, 64 B each), step 1's (14; 15, 16 on half the keys, 32 B), then the gathered K/V freed; the fp32 send
    # buffer (17, 256), dk and dv freed; the received (18, 256), the sent freed at the wait; the input's gradient
    # (19, 64), the rest freed
    assert record.backward == [-3, -6, 64, 64, 64, 64, 32, 32, -2, 256, -12, -13, 256, -17, 64, -11, -14, -15, -16,
                               -18]
    assert record.input_grad == 19


def test_a_cp_reading_matches_only_a_profile_at_its_degree():
    reading = {"dims": {"hidden": 16, "heads": 4, "kv_heads": 2, "head_dim": 4, "ffn": 32, "tokens": 8}, "tp": 1,
               "cp": 8}
    block = dict(hidden=32, heads=4, kv_heads=2, head_dim=8, ffn=64, tokens=16, tp=1)
    assert compiled_blocks.matching(reading, **block, cp=8) == 2
    assert compiled_blocks.matching(reading, **block, cp=4) is None
    assert compiled_blocks.matching(reading, **block) is None  # a profile without CP
    assert compiled_blocks.matching({**reading, "cp": 1}, **block) == 2  # a reading naming none is CP 1's
    assert compiled_blocks.settings_key(["float8", "async-tp"], 8) == "async-tp,cp8,float8"
    assert compiled_blocks.settings_key(["float8", "async-tp"]) == "async-tp,float8"


def _setup(**update) -> TrainSetup:
    fields = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[1 << 40], runtime="torchtitan",
                  runtime_version="9dec370", compile=True, float8=True, tp=8, tp_overlap="async-tp", cp=8)
    return TrainSetup(**{**fields, **update})


def test_the_cp_record_plays_only_at_its_degree():
    record = AllocRecord(forward=[8], backward=[8], output=1)
    layer = LayerProfile(name="layers.0", kind="decoder_block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1,
                         bwd_ms_min=2, bwd_ms_max=2, act_bytes=8, input_bytes=8, output_bytes=8, param_count=1,
                         param_bytes=2, transient_bytes=8, compiled_records={"async-tp,cp8,float8": record})
    assert compiled_block.settings_key(_setup()) == "async-tp,cp8,float8"
    assert compiled_block.record(layer, "full", _setup()) == record
    assert compiled_block.record(layer, "full", _setup(cp=4)) is None
    assert compiled_block.record(layer, "full", _setup(cp=1)) is None
    # the readings ran torch's all-gather rotater: torchtitan's alltoall rotation (--cp-comm p2p) is another program
    assert compiled_block.settings_key(_setup(cp_comm="allgather")) == "async-tp,cp8,float8"
    assert compiled_block.settings_key(_setup(cp_comm="p2p")) == "async-tp,cp8-p2p,float8"
    assert compiled_block.record(layer, "full", _setup(cp_comm="p2p")) is None



def test_a_layout_copy_for_the_cuda_flash_op_on_cpu_is_no_allocation_even_in_a_reused_buffer():
    """A reading that calls the CUDA flash op on CPU (the ring's) copies each flash backward's output gradient to
    contiguous strides, a kernel named after the op alone, into a dying buffer's storage (`# reuse`); CUDA passes the
    view (torch 2.6.0 lowering.py sdpa_constraint): the copy is no allocation, and the dying buffer goes at its del."""
    from planner.profiler.compiled_record import cpu_layout_copies
    from planner.profiler.inductor_buffers import run_call

    code = """
cpp_fused__scaled_dot_product_flash_attention_backward_3 = async_compile.cpp_pybinding(['const bfloat16*', 'bfloat16*'], '''
''')
def call(self, args):
    primals_1, = args
    args.clear()
    buf0 = empty_strided_cpu((32, ), (1, ), torch.bfloat16)
    cpp_fused_mm_0(primals_1, buf0)
    buf1 = empty_strided_cpu((8, ), (1, ), torch.float32)
    buf2 = buf1; del buf1  # reuse
    cpp_fused__scaled_dot_product_flash_attention_backward_3(buf0, buf2)
    buf3 = empty_strided_cpu((16, ), (1, ), torch.bfloat16)
    del buf2
    return (buf0, buf3, )
"""
    assert cpu_layout_copies(code) == {"buf2"}
    copied = run_call(code, {"primals_1": 0}, unallocated=cpu_layout_copies(code))
    # buf0 64 B, buf1 32 B, released at the reuse's del; buf3 32 B: at most 96 B at once, not 128
    assert copied.peak_bytes == 96
    assert run_call(code, {"primals_1": 0}).peak_bytes == 128


def test_the_records_peak_takes_the_rings_charge_out_of_the_layers_extra():
    """At CP 2 the block's extra where its record plays is the record's peak less every eager term it replaces, the
    ring's charge (contextparallel.extra_bytes) among them: the record holds the ring (§42.cpblock)."""
    from planner.cost import contextparallel
    from planner.cost.layers import layer_costs
    from planner.cost.repeatedkv import repeated_kv_extra_bytes
    from planner.cost.rules import layer_extra_bytes
    from planner.cost.tpgathered import tp_gathered_extra_bytes
    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.analytic import Shape
    from planner.schema import FileRef

    arch = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
    profile = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=1, cp=2), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    record = AllocRecord(forward=[1000, -1, 300], backward=[10**6, -2, -3], output=2)  # one 1 MB backward buffer
    layers = [layer.model_copy(update={"compiled_records": {"cp2,float8": record}})
              if layer.kind == "decoder_block" else layer for layer in profile.layers]
    profile = profile.model_copy(update={"layers": layers})
    setup = _setup(tp=1, tp_overlap="none", cp=2, context_parallel=2)
    block = next(cost for cost in layer_costs(profile) if cost.kind == "decoder_block")
    ring = contextparallel.extra_bytes(block, setup, 1)
    assert ring > 0  # the ring's buffers the eager terms charge at this shape
    eager = layer_extra_bytes(block, 1) + tp_gathered_extra_bytes(block, 1, profile, setup) \
        + repeated_kv_extra_bytes(block, 1, profile, setup) + ring
    # the record's backward: 1 MB beside the received gradient (the block's output), its forward's 1300 B below it
    assert compiled_block.extra_bytes(block, 1, profile, setup) == 10**6 + block.output_bytes - eager
    # at another CP the record does not play: no change to the eager terms
    assert compiled_block.extra_bytes(block, 1, profile, _setup(tp=1, tp_overlap="none", cp=4, context_parallel=4)) == 0
