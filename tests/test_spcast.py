"""Under sequence parallelism Transformer Engine quantizes a LayerNormLinear's input on the rank's sequence shard
and a row-parallel Linear's output gradient on its shard, gathers the FP8 data (1 B an element) and, on Hopper,
transposes the gathered rows (TE v2.9 / v2.16; docs/framework-facts.md §301-§304): the casts' and the gathers'
bytes by hand on a tiny TP 2 + SP block."""

from __future__ import annotations

import pytest

from planner.cost import comm, runtimes
from planner.models import archs
from planner.models.archs import gpu
from planner.profiler import analytic_comm, float8
from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel, work

# hidden 64, 4 heads of 16, 2 K/V heads, f 160; 64 tokens (32 x 2): at TP 2 with SP each rank's shard is 32 rows
TINY = archs.Arch(name="tiny-spcast", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=256, tie_word_embeddings=False)
SP = Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True)
NO_SP = Shape(seq_len=32, micro_batch_size=2, tp=2, sp=False)
H100, B200 = gpu("h100-sxm"), gpu("b200")


def _linears(shape: Shape) -> dict[str, float8.Linear]:
    return {linear.fqn.rsplit(".", 1)[1]: linear for linear in float8.te_linears(TINY, shape, "layers.0")}


def test_the_block_linears_say_which_rows_each_cast_covers():
    made = _linears(SP)
    # qkv: k 64, n 32 + 2 x 16; proj: k 32, n 64; fc1: k 64, n 2 x 80; fc2: k 80, n 64; all on the 64 gathered rows
    assert [(linear.tokens, linear.k, linear.n) for linear in made.values()] == \
        [(64, 64, 64), (64, 32, 64), (64, 64, 160), (64, 80, 64)]
    # the column-parallel LayerNormLinears gather their input (cast on the 32-row shard), the row-parallel Linears
    # their output gradient
    assert [(linear.shard_rows, linear.grad_rows) for linear in made.values()] == [(32, 0), (0, 32), (32, 0), (0, 32)]
    assert all(not (linear.shard_rows or linear.grad_rows) for linear in _linears(NO_SP).values())


def test_a_layernorm_linears_input_cast_is_on_the_shard_and_its_transpose_after_the_backwards_gather():
    qkv, qkv_plain = _linears(SP)["linear_qkv"], _linears(NO_SP)["linear_qkv"]
    # current scaling: the norm writes bf16 and its amax, the quantize reads 2 and writes 1: 3 B on 32 x 64, row-wise
    # only (no transpose under SP, on Hopper either); without SP 64 x 64 rows with Hopper's transpose (1 B more)
    assert float8.te_input_bytes(qkv, H100) == 3 * 32 * 64
    assert float8.te_input_bytes(qkv, B200) == 3 * 32 * 64
    assert float8.te_input_bytes(qkv_plain, H100) == 4 * 64 * 64
    # delayed scaling: the norm writes FP8 (1 B where bf16 wrote 2) on the shard
    assert float8.te_input_bytes(qkv, H100, delayed=True) == -1 * 32 * 64
    assert float8.te_input_bytes(qkv_plain, H100, delayed=True) == (-1 + 2) * 64 * 64
    # the backward gathers the FP8 shard again and, on Hopper, tex.fp8_transpose reads and writes 1 B on 64 x 64
    assert float8.te_gathered_input_bytes(qkv, H100) == 2 * 64 * 64
    assert float8.te_gathered_input_bytes(qkv, B200) == 0
    assert float8.te_gathered_input_bytes(qkv_plain, H100) == 0


def test_a_row_parallel_linears_grad_output_is_cast_on_the_shard_and_its_input_on_every_row():
    proj, proj_plain = _linears(SP)["linear_proj"], _linears(NO_SP)["linear_proj"]
    # its input is not gathered: amax, cast (5 B) and Hopper's transpose (1) on its 64 x 32, as without SP
    assert float8.te_input_bytes(proj, H100) == float8.te_input_bytes(proj_plain, H100) == 6 * 64 * 32
    # grad_output: amax and cast (5 B; delayed 3) on the 32 x 64 shard, then on Hopper the gathered 64 x 64's transpose
    assert float8.te_grad_bytes(proj, H100) == 5 * 32 * 64 + 2 * 64 * 64
    assert float8.te_grad_bytes(proj, B200) == 5 * 32 * 64
    assert float8.te_grad_bytes(proj, H100, delayed=True) == 3 * 32 * 64 + 2 * 64 * 64
    assert float8.te_grad_bytes(proj_plain, H100) == 6 * 64 * 64
    # a column-parallel linear's grad_output is its own 64 rows (not gathered)
    assert float8.te_grad_bytes(_linears(SP)["linear_qkv"], H100) == 6 * 64 * 64


def _bf16(linears, gemms: int):
    return work(sum(linear.flops for linear in linears) * gemms, 10**6,
                [Kernel("matmul", linear.flops) for linear in linears for _ in range(gemms)])


def test_the_block_passes_casts_by_hand():
    linears = float8.te_linears(TINY, SP, "layers.0")
    fwd, _ = float8.te_forward(_bf16(linears, 1), linears, H100)
    bwd = float8.te_backward(_bf16(linears, 2), linears, H100)
    # forward: qkv 3 x 32 x 64, proj 6 x 64 x 32, fc1 3 x 32 x 64, fc2 6 x 64 x 80
    assert fwd.bytes - 10**6 == 3 * 32 * 64 + 6 * 64 * 32 + 3 * 32 * 64 + 6 * 64 * 80 == 55296
    # backward: qkv's grad (6 x 64 x 64) and its gathered input's transpose (2 x 64 x 64); proj's grad on the shard
    # (5 x 32 x 64) and transposed gathered (2 x 64 x 64); fc1's 6 x 64 x 160 and 2 x 64 x 64; fc2's as proj's
    assert bwd.bytes - 10**6 == (8 * 64 * 64 + (5 * 32 * 64 + 2 * 64 * 64) + (6 * 64 * 160 + 2 * 64 * 64)
                                 + (5 * 32 * 64 + 2 * 64 * 64)) == 139264
    assert sum(count for kernel, count in fwd.kernels if kernel.kind == "matmul-fp8") == 4
    assert sum(count for kernel, count in bwd.kernels if kernel.kind == "matmul-fp8") == 8


def test_the_blocks_all_gathers_move_one_byte_an_element_under_megatron():
    collectives = analytic_comm.block_collectives(TINY.hidden_size, SP)
    whole = 64 * 64 * 2  # the gathered sequence, bf16
    moved = {(c.kind, "fwd" if c.fwd else "bwd"): 0 for c in collectives}
    for c in collectives:
        moved[(c.kind, "fwd" if c.fwd else "bwd")] += comm.collective_bytes(c.kind, c.tensor_bytes, float8=True)
    # two all-gathers a pass (the LayerNormLinears' inputs forward, the row-parallel grad_outputs backward) at 1 B
    # an element, the scale_inv not sent; the reduce-scatters' bf16 sums
    assert moved == {("all-gather", "fwd"): 2 * whole / 2, ("reduce-scatter", "fwd"): 2 * whole,
                     ("all-gather", "bwd"): 2 * whole / 2, ("reduce-scatter", "bwd"): 2 * whole}
    assert runtimes.facts("megatron").tp_gathers_float8
    assert "layernorm_linear.py" in runtimes.facts("megatron").sources["tp_gathers_float8"]


@pytest.mark.parametrize("shape", [SP, NO_SP])
def test_the_casts_never_count_fewer_rows_than_a_shard(shape):
    for linear in float8.te_linears(TINY, shape, "layers.0"):
        assert float8.te_input_bytes(linear, B200) >= 3 * (linear.tokens // shape.tp) * linear.k
