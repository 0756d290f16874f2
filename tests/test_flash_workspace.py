"""The flash attention backward's own workspace (planner/models/flash_workspace.py) counted by hand, found in an
inductor wrapper where the op runs (inductor_buffers.run_call), inserted into a compiled block's record there
(compiled_record.with_workspaces) and played at the job's widths (compiled_blocks.records_for;
docs/published-runs.md §43.m17mem)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from planner.cost import compiled_block, cpring
from planner.models.flash_workspace import flash2_backward_workspace
from planner.profiler import compiled_blocks
from planner.profiler.compiled_record import (
    Wrapper,
    block_record_calls,
    flash_calls_law,
    scaled,
    with_workspaces,
)
from planner.profiler.inductor_buffers import run_call
from planner.schema import AllocRecord


def test_the_405b_blocks_flash_backward_workspace_by_hand():
    # M17's block: 4 sequences of 8,192 tokens, 128 / 8 = 16 heads a TP rank, head dim 128 (no rounding)
    softmax_d, dq_accum = flash2_backward_workspace(4, 16, 8192, 128)
    assert softmax_d == 4 * 4 * 16 * 8192 == 2_097_152
    assert dq_accum == 4 * 4 * 8192 * 16 * 128 == 268_435_456  # twice the bf16 query's bytes


def test_the_workspace_rounds_the_length_to_128_and_the_head_dim_to_32_or_64():
    assert flash2_backward_workspace(1, 2, 100, 80) == (4 * 2 * 128, 4 * 128 * 2 * 96)
    assert flash2_backward_workspace(1, 1, 128, 160) == (4 * 128, 4 * 128 * 192)  # above 128: a multiple of 64
    # deterministic: ceil(132 SMs / (2 x 16)) = 5 zeroed copies of dq_accum
    assert flash2_backward_workspace(2, 16, 256, 128, deterministic=True, sms=132)[1] == 5 * 4 * 2 * 256 * 16 * 128


def _backward(t: int, d: int) -> Wrapper:
    """A backward that runs the CPU's flash backward for a [1, 2, t, d] query (its tuple's dq, dk, dv made where it
    runs), then a T x 2d bf16 buffer after the call, and returns the query's gradient."""
    q = 2 * t * d
    code = f'''
def call(self, args):
    primals_1, getitem, tangents_1 = args
    args.clear()
    buf0 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(reinterpret_tensor(tangents_1, (1, 2, {t}, {d}), ({q}, {d}, {2 * d}, 1), 0), primals_1, primals_1, primals_1, getitem, getitem, 0.0, True)
    buf1 = buf0[0]
    assert_size_stride(buf1, (1, 2, {t}, {d}), ({q}, {t * d}, {d}, 1))
    buf2 = buf0[1]
    assert_size_stride(buf2, (1, 2, {t}, {d}), ({q}, {t * d}, {d}, 1))
    buf3 = buf0[2]
    assert_size_stride(buf3, (1, 2, {t}, {d}), ({q}, {t * d}, {d}, 1))
    del buf0
    del buf2
    buf4 = empty_strided_cpu(({t}, {4 * d}), ({4 * d}, 1), torch.bfloat16)
    del buf3
    del buf4
    return (buf1, )
'''
    fx = f'def forward(self, primals_1: "bf16[1, 2, {t}, {d}]", getitem: "bf16[1, 2, {t}, {d}]", tangents_1: "bf16[{t}, {2 * d}]"):\n    pass\n'
    return Wrapper(code, fx)


def _forward(t: int, d: int) -> Wrapper:
    code = f'''
def call(self, args):
    primals_1, = args
    args.clear()
    buf0 = empty_strided_cpu((1, 2, {t}, {d}), ({2 * t * d}, {t * d}, {d}, 1), torch.bfloat16)
    return (buf0, primals_1, buf0, )
'''
    return Wrapper(code, f'def forward(self, primals_1: "bf16[1, 2, {t}, {d}]"):\n    pass\n')


def test_the_flash_backward_is_found_where_its_outputs_are_made():
    found = run_call(_backward(256, 16).code, {"primals_1": 0, "getitem": 0, "tangents_1": 0})
    [(at, shape)] = found.flash_backward
    assert shape == (1, 2, 256, 16)
    assert [e for e in found.events[:at] if e > 0][-3:] == sorted(e for e in found.events[:at] if e > 0)[-3:]
    record, calls = block_record_calls(_forward(256, 16), _backward(256, 16))
    q = 2 * 256 * 16 * 2  # a [1, 2, 256, 16] bf16 tensor
    # forward: the output (id 1, saved); backward: dq, dk, dv (ids 2-4), the call returns, dk goes, a 256 x 64 bf16
    # buffer (id 5) made, dv and it go, the saved output freed as call returns; dq handed back
    assert record.backward == [q, q, q, -3, 256 * 64 * 2, -4, -5, -1]
    assert calls == [(3, (1, 2, 256, 16))]
    flash_calls_law(calls, Fraction(1, 8), [(3, (1, 2, 512, 32))], Fraction(1, 4))
    with pytest.raises(ValueError, match="not the same call scaled"):
        flash_calls_law(calls, Fraction(1, 8), [(3, (1, 2, 512, 16))], Fraction(1, 4))


def test_a_workspace_is_made_after_the_calls_outputs_and_freed_at_its_return_the_later_ids_moved():
    record = AllocRecord(forward=[10, -1, 7], backward=[20, 30, -3, 40, -4, -2, -5], output=2, input_grad=4,
                         param_grads=[0, 5])
    out = with_workspaces(record, [(3, [1, 2]), (5, [9])])
    # ids: forward's 1, 2; backward's 20 -> 3, 30 -> 4, the workspace 1 -> 5 and 2 -> 6, 40 -> 7, the workspace 9 -> 8
    assert out.backward == [20, 30, -3, 1, 2, -6, -5, 40, -4, 9, -8, -2, -7]
    assert (out.output, out.input_grad, out.param_grads) == (2, 4, [0, 7])
    # from the forward's 7 B alive: 7 + 20 + 30 = 57; 7 + 30 + 1 + 2 = 40 at the first workspace; 7 + 30 + 40 = 77;
    # 7 + 40 + 9 = 56 at the second
    assert cpring.peak(out.backward, made=2, live=7) == 77


def test_m17s_block_holds_the_workspace_at_its_backward_peak():
    # the 405B's block at M17's widths (4 x 8,192 tokens, TP 8, Float8, AsyncTP): the reading's flash backward call is
    # where its backward peaks (its dq, dk, dv just made), so the record's peak rises by the call's workspace
    block = dict(hidden=16384, heads=128, kv_heads=8, head_dim=128, ffn=53248, tokens=32768, tp=8, micro_batch=4)
    with_ws = compiled_blocks.records_for(**block)["async-tp,float8"]
    [reading] = [r for r in compiled_blocks.readings() if compiled_blocks.matching(
        r, **{k: v for k, v in block.items() if k != "micro_batch"}) is not None and r.get("cp", 1) == 1]
    bare = scaled(AllocRecord.model_validate(reading["record"]), Fraction(1, 8), reading["powers"])
    incoming = 32768 * 2048 * 2  # the block output's gradient: a sequence shard of [tokens, hidden] bf16
    added = compiled_block.backward_peak(with_ws, incoming) - compiled_block.backward_peak(bare, incoming)
    assert added == sum(flash2_backward_workspace(4, 16, 8192, 128)) == 270_532_608
