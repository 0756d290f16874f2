"""scripts/bench_host.py, the measurement behind the Megatron record's host_block_linears: the replica block
dispatches exactly its parts' ops (counted by hand from Megatron-core's forward), and the script prints its table."""

from __future__ import annotations

import pytest
import torch
from fixtures.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_host")


def _forward_ops(bench) -> dict[str, int]:
    return {name: bench.count_ops(fwd, make)[0] for name, fwd, make in bench.parts()}


def test_the_linear_unit_and_the_blocks_forward_are_their_parts(bench):
    ops = _forward_ops(bench)
    assert ops["torch Linear (the unit)"] == 4  # view, t, addmm, view: a Linear over [s, b, h]
    assert ops["bias-dropout-add"] == 6  # add, then dropout's empty_like, bernoulli_, div_, mul; add
    assert ops["bias-gelu (GeLUFunction)"] == 10  # fused_bias_gelu.py's bias_gelu, op by op
    linear_no_bias = 4  # linear_proj, linear_fc1, linear_fc2 return their bias apart: view, t, mm, view
    parts = (ops["linear_qkv + view/split/reshape"] + ops["core_attention stand-in"] + 2 * ops["bias-dropout-add"]
             + ops["bias-gelu (GeLUFunction)"] + 3 * linear_no_bias)
    assert ops["dense block (TE spec replica)"] == parts == 48
    unfused = parts - ops["core_attention stand-in"] + ops["unfused attention (TE's UnfusedDotProductAttention)"]
    assert ops["dense block, unfused attention"] == unfused == 67


def test_the_moe_blocks_forward_is_its_parts(bench):
    ops = _forward_ops(bench)
    attention_half = (ops["linear_qkv + view/split/reshape"] + ops["core_attention stand-in"] + 4
                      + ops["bias-dropout-add"])  # linear_proj without its bias: view, t, mm, view
    assert attention_half == 24
    router = 3 + 1 + 2 + 1  # view + t, mm; the fused top-k (one op); the routing map (zeros_like, scatter_); sum
    dispatch = 2 + 1 + 1 + 2  # the copies' token index (view, remainder); permutation 1; the weights' view; sort
    experts = 2 * (2 + 2) + 4  # each GroupedLinear: split by m_splits, cat, t, mm; the weighted SwiGLU, eager
    combine = 2 + 3 + 1 + ops["bias-dropout-add"]  # unsort; unpermutation 1 (arange, index_select, slice); view; bda
    assert ops["MoE block (alltoall dispatcher, fused router and permute)"] == \
        attention_half + router + dispatch + experts + combine == 61


def test_the_mla_blocks_forward_is_its_parts(bench):
    """MLASelfAttention's forward op by op (multi_latent_attention.py 638-1003, rope_utils.py 92-157 at d98e8a64)."""
    ops = _forward_ops(bench)
    linear = 4  # a bias-free Linear over [s, b, h]: view, t, mm, view
    latents = 1 + 2 * linear + 1 + 2 * (linear + 1)  # input norm; the down projections; the split; up projections, views
    rotary = 2 + 3 + 4 + 6 + 1  # t / t_pass slices; the interleave (2 slices, cat); cos, mul, sin, mul; _rotate_half
    # (chunk, neg, cat), t * cos, * sin, add; the final cat (the casts to the same dtype dispatch nothing)
    glue = 1 + 1 + 2 + 2 * rotary + 1 + 1 + 1 + 1  # unsqueeze; the table's slice; q / kv splits; cats, expand, value's
    # .contiguous() (a split's slice: a clone; the cats' outputs are contiguous already)
    mlp = ops["bias-gelu (GeLUFunction)"] + 2 * linear + ops["bias-dropout-add"]
    tail = linear + ops["bias-dropout-add"] + mlp  # linear_proj, its bias-dropout-add, the dense MLP
    assert ops["MLA block (latent attention, TE spec)"] == latents + glue + ops["core_attention stand-in"] + tail == 101
    unfused = ops["unfused attention (TE's UnfusedDotProductAttention)"]
    assert ops["MLA block, unfused attention"] == latents + glue + unfused + tail == 120


def test_the_script_prints_each_part_against_the_linear(bench, capsys):
    threads = torch.get_num_threads()
    try:
        bench.main(["--repeats", "1", "--calls", "2", "--eager"])  # sets one thread, as it measures
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| part")]
    assert len(rows) == 11
    assert rows[0].startswith("| torch Linear (the unit) | 4 / 14 |") and "| 1.00 |" in rows[0]
    assert rows[5].startswith("| dense block (TE spec replica) | 48 / 83 |")
    assert rows[9].startswith("| MLA block (latent attention, TE spec) | 101 / ")


def test_only_and_fastest_time_the_named_parts_by_each_repeats_fastest_call(bench, capsys):
    threads = torch.get_num_threads()
    try:
        bench.main(["--repeats", "1", "--calls", "2", "--eager", "--fastest", "--only", "MLA"])
    finally:
        torch.set_num_threads(threads)
        bench.STAT["per_repeat"] = bench.statistics.median
    out = capsys.readouterr().out
    rows = [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| ") and not line.startswith("| part")]
    assert rows == ["| torch Linear (the unit)", "| MLA block (latent attention, TE spec)", "| MLA block, unfused attention"]
    assert "fastest call a repeat" in out
