"""A compiled block's allocation record read from inductor's two wrappers (planner/profiler/compiled_record.py), its
scaling law, and the cost model's choice of it (planner/cost/compiled_block.py; docs/published-runs.md §41.cblock),
counted by hand on wrappers cut to the statements the reader knows."""

from __future__ import annotations

from fractions import Fraction

import pytest

from planner.cost import compiled_block
from planner.profiler.compiled_record import (
    Wrapper,
    block_record,
    cpu_layout_copies,
    degrees,
    scaled,
)
from planner.schema import AllocRecord


def forward(t: int, h: int) -> Wrapper:
    """A checkpointed block's forward at t tokens and width h: a T x h fp32 temporary, the bf16 output, a scalar
    (4 B) and the rng state it saves (16 B): returns (output, the input, the weight, the rng state)."""
    code = f'''
def call(self, args):
    primals_1, primals_2 = args
    args.clear()
    buf0 = empty_strided_cpu(({t}, {h}), ({h}, 1), torch.float32)
    buf1 = empty_strided_cpu((), (), torch.float32)
    buf2 = empty_strided_cpu((16, ), (1, ), torch.uint8)
    buf3 = empty_strided_cpu(({t}, {h}), ({h}, 1), torch.bfloat16)
    cpp_fused_0(primals_1, primals_2, buf0, buf1, buf2, buf3)
    del buf0
    return (buf3, primals_1, primals_2, buf2, )
'''
    fx = f'def forward(self, primals_1: "bf16[{t}, {h}]", primals_2: "bf16[{h}, {h}]"):\n    pass\n'
    return Wrapper(code, fx)


def backward(t: int, h: int, heads: int) -> Wrapper:
    """Its backward: the rerun's bf16 T x h, a T x heads fp32 statistic, a layout copy only the CPU's SDPA wants, the
    weight's gradient (h x h), the input's gradient made in place of the rerun's buffer (`# reuse`)."""
    code = f'''
cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_1 = async_compile.cpp_pybinding(['const bfloat16*', 'bfloat16*'], \'\'\'
\'\'\')
def call(self, args):
    primals_1, primals_2, rng_state, tangents_1 = args
    args.clear()
    buf0 = empty_strided_cpu(({t}, {h}), ({h}, 1), torch.bfloat16)
    buf1 = empty_strided_cpu(({t}, {heads}), ({heads}, 1), torch.float32)
    del rng_state
    buf2 = empty_strided_cpu(({t}, {h}), ({h}, 1), torch.bfloat16)
    cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_1(buf0, buf2)
    buf3 = empty_strided_cpu(({h}, {h}), ({h}, 1), torch.bfloat16)
    del buf1
    del buf2
    buf4 = buf0; del buf0  # reuse
    del primals_1
    del primals_2
    del tangents_1
    return (buf4, buf3, None, )
'''
    fx = (f'def forward(self, primals_1: "bf16[{t}, {h}]", primals_2: "bf16[{h}, {h}]", rng_state: "u8[16]", '
          f'tangents_1: "bf16[{t}, {h}]"):\n    pass\n')
    return Wrapper(code, fx)


def test_the_cpu_sdpa_layout_copy_is_named_by_its_kernel():
    assert cpu_layout_copies(backward(8, 4, 2).code) == {"buf2"}


def test_a_compiled_blocks_record_by_hand():
    record = block_record(forward(8, 4), backward(8, 4, 2), param_order=(0,))
    # forward: buf0 128 B (fp32 8 x 4), buf1 4, buf2 16, buf3 64; buf0 freed; buf1 dropped as call returns (made,
    # never returned); the output (id 4) and the rng state (id 3) alive
    assert record.forward == [128, 4, 16, 64, -1, -2]
    assert record.output == 4
    # backward, ids from 5: buf0 64 (5), buf1 64 (6, fp32 8 x 2), the saved rng state (forward's id 3) freed, the CPU's
    # layout copy not made, the weight's gradient 32 (7), buf1 freed; buf0 handed on as the input's gradient
    assert record.backward == [64, 64, -3, 32, -6]
    assert record.input_grad == 5
    assert record.param_grads == [7]


def test_the_law_takes_each_buffer_by_its_power_and_refuses_another_program():
    half = block_record(forward(8, 4), backward(8, 4, 2), param_order=(0,))
    whole = block_record(forward(16, 8), backward(16, 8, 2), param_order=(0,))
    powers = degrees(half, Fraction(1, 2), whole, Fraction(1))
    # T x h: 2; the scalar and the rng state: 0; T x heads: 1 (heads do not scale); h x h: 2
    assert powers == [2, 0, 0, 2, 2, 1, 2]
    assert scaled(half, Fraction(1, 2), powers) == whole
    quarter = block_record(forward(4, 2), backward(4, 2, 2), param_order=(0,))
    assert scaled(half, Fraction(1, 2), powers, Fraction(1, 4)) == quarter
    with pytest.raises(ValueError, match="not a whole power"):
        degrees(half, Fraction(1, 2), block_record(forward(16, 12), backward(16, 12, 2)).model_copy(
            update={"param_grads": [7]}), Fraction(1))
    other = whole.model_copy(update={"backward": [*whole.backward[:-1], -5]})
    with pytest.raises(ValueError, match="not the same program"):
        degrees(half, Fraction(1, 2), other, Fraction(1))


def test_the_weights_gradients_leave_the_replays_program_where_they_were_made():
    record = block_record(forward(8, 4), backward(8, 4, 2), param_order=(0,))
    program, places = compiled_block.backward_without_grads(record)
    assert program == [64, 64, -3, -6]
    assert places == ((3, 0),)  # made before the backward's fourth code (buf1's free)
    # with the received gradient (16 B) first: 16 + 64 + 64 = 144 at the peak
    assert compiled_block.backward_peak(record, 16) == 144
    assert compiled_block.forward_peak(record) == 128 + 4 + 16 + 64
    # the replay's program (the received gradient, then the record's part): the gradient falls past the last
    # allocation, so at the program's end
    assert compiled_block.grads_at(record, (16, 64, 64, -2)) == ((4, 0),)


def _setup(**update):
    from planner.schema import TrainSetup

    fields = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[1 << 40], runtime="torchtitan",
                  runtime_version="9dec370", compile=True, float8=True, tp=8, tp_overlap="async-tp")
    return TrainSetup(**{**fields, **update})


def test_the_record_plays_only_where_the_job_compiles_a_checkpointed_block_under_its_settings():
    from planner.schema import LayerProfile

    record = AllocRecord(forward=[8], backward=[8], output=1)
    layer = LayerProfile(name="layers.0", kind="decoder_block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1,
                         bwd_ms_min=2, bwd_ms_max=2, act_bytes=8, input_bytes=8, output_bytes=8, param_count=1,
                         param_bytes=2, transient_bytes=8, compiled_records={"async-tp,float8": record})
    assert compiled_block.record(layer, "full", _setup()) == record
    assert compiled_block.record(layer, "none", _setup()) is None
    assert compiled_block.record(layer, "full", _setup(compile=False)) is None
    assert compiled_block.record(layer, "full", _setup(tp_overlap="none")) is None  # no record read for that program
    assert compiled_block.record(layer.model_copy(update={"kind": "embedding"}), "full", _setup()) is None
    # torchtitan 2c8b5947's torchao casts the saved bf16 input again (float8_saves_input False): not the program read
    assert compiled_block.settings_key(_setup(runtime_version="2c8b5947")) == "async-tp,float8-recast"
    assert compiled_block.record(layer, "full", _setup(runtime_version="2c8b5947")) is None
