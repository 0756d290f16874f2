"""A context-parallel rank's block under torch.compile (planner/profiler/compiled_time.py): the rest of the block
compiled at the rank's s / cp tokens, the ring's flash calls as eager's, the ring's own fused bytes left to the
cost model (contextparallel.ring_membound_ms)."""

import pytest
from fixtures.tiny_compiled import TINY

from planner.models import archs
from planner.profiler import analytic_time, compiled_time
from planner.profiler.analytic import Shape
from planner.profiler.roofline import kernel_ms

H100 = archs.gpu("h100")


def test_a_cp_rank_moves_the_bytes_of_the_block_at_its_own_tokens():
    """CP 2 at 2,048 tokens: each rank holds 1,024, and the rotary table is sharded to 1,024 rows, so inductor's
    kernels outside the ring move what the block at 1,024 tokens without CP moves, policy by policy."""
    ring = compiled_time.compiled_block_bytes(TINY, Shape(seq_len=2048, micro_batch_size=1, cp=2), moe=False)
    alone = compiled_time.compiled_block_bytes(TINY, Shape(seq_len=1024, micro_batch_size=1), moe=False)
    assert ring == alone and set(ring) == {"none", "op-sac", "full"}


def test_the_rotary_table_is_the_ranks_rows_by_hand():
    """R = s / cp rows x head_dim / 2 complex64 (8 B): 4,096 / 4 x 8 x 8 = 65,536 B at head dim 16."""
    shape = Shape(seq_len=4096, micro_batch_size=1, cp=4)
    assert TINY.head_size == 16
    assert compiled_time._units(TINY, shape)["R"] == 1024 * 8 * 8 == 65_536
    assert compiled_time._units(TINY, shape)["Thd"] == 1024 * 64 * 2  # the rank's 1,024 tokens, bf16


def test_the_compiled_cp_block_differs_from_the_one_at_its_tokens_by_the_rings_second_flash_call_alone():
    """At CP 2 a rank makes two flash calls a pass, each a causal call's pairs over its 1,024 tokens (analytic_cp.
    ring_calls); everything else is the 1,024-token block's. So the compiled forward and backward exceed the
    1,024-token block's by one more such call each way, exactly as the eager passes do."""
    cp2, alone = Shape(seq_len=2048, micro_batch_size=1, cp=2), Shape(seq_len=1024, micro_batch_size=1)
    timed = {shape.cp: compiled_time.compiled_time(TINY, shape, H100, analytic_time.block_work(TINY, shape), moe=False)
             for shape in (cp2, alone)}
    call = analytic_time._attention(TINY, alone)[0][0]
    backward_call = analytic_time._backward_kernels([call])
    assert timed[2].fwd_ms - timed[1].fwd_ms == pytest.approx(kernel_ms(call, H100), rel=1e-12)
    assert timed[2].bwd_ms - timed[1].bwd_ms == pytest.approx(sum(kernel_ms(k, H100) for k in backward_call), rel=1e-12)
    # a full recompute reruns the forward's calls: one more call
    assert timed[2].recompute_ms["full"] - timed[1].recompute_ms["full"] == pytest.approx(kernel_ms(call, H100),
                                                                                          rel=1e-12)


def test_still_not_recorded_under_tensor_parallelism_with_cp():
    shape = Shape(seq_len=2048, micro_batch_size=1, cp=2, tp=2, sp=True)
    assert compiled_time.compiled_time(TINY, shape, H100, analytic_time.block_work(TINY, shape), moe=False) is None
