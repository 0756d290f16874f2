"""TE's copies into and out of its userbuffers under --tp-comm-overlap (planner/cost/ub_sms.py buffer_copy_bytes,
planner/cost/comm.py userbuffers_copy_ms; docs/framework-facts.md §635-§637): each ring exchange's all-gather shard
copied into the buffer on the compute stream, each bulk reduce-scatter's chunk cloned out; by hand on a block's eight
collectives and on B4's block."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

# the 405B block's eight collectives and its userbuffers config, as test_b4scale builds them
from test_b4scale import H100_405B, MIB, _block

from planner.commands.comm_setup import _userbuffers
from planner.cost import comm, ub_sms
from planner.models.archs import gpu
from planner.schema import TrainSetup


def _setup(tp: int, *, float8: bool = False, **comm_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=tp, tp_gb_per_s=100.0, tp_overlap="tp-comm-overlap", **comm_fields),
                      training=dict(float8=float8))


def test_the_copies_by_hand():
    eight = _block(64 * MIB).collectives  # each site's tensor 64 MiB whole in bf16: an 8 MiB shard at tp 8
    # forward: qkv_fprop's and fc1_fprop's shards copied in, each read and written
    assert ub_sms.buffer_copy_bytes(eight, "fwd", config=H100_405B, tp=8) == 2 * 2 * 8 * MIB
    assert ub_sms.buffer_copy_bytes(eight, "recompute", config=H100_405B, tp=8) == 2 * 2 * 8 * MIB
    # in FP8 the shards are 1 B an element: half
    assert ub_sms.buffer_copy_bytes(eight, "fwd", config=H100_405B, tp=8, float8=True) == 2 * 2 * 4 * MIB
    # backward: proj_dgrad's and fc2_dgrad's output gradients copied in (FP8: 4 MiB shards), the two bulk scatters'
    # bf16 chunks (8 MiB) cloned out; the bulk gathers' copies run on the communication stream: none
    assert ub_sms.buffer_copy_bytes(eight, "bwd", config=H100_405B, tp=8, float8=True) == \
        2 * 2 * 4 * MIB + 2 * 2 * 8 * MIB
    assert ub_sms.buffer_copy_bytes(eight, "bwd", config=H100_405B, tp=8) == 4 * 2 * 8 * MIB
    # TE's defaults run the same ring exchanges and bulk scatters
    assert ub_sms.buffer_copy_bytes(eight, "bwd", config=None, tp=4) == 4 * 2 * 16 * MIB
    assert ub_sms.buffer_copy_bytes(eight, "fwd", config=H100_405B, tp=1) == 0
    assert ub_sms.buffer_copy_bytes(eight[:2], "fwd", config=H100_405B, tp=8) == 0  # not a dense block's eight


def test_only_ring_gathers_and_bulk_scatters_copy():
    # a file whose qkv_fprop is bulk (CommOverlap: its copy on the communication stream) and qkv_wgrad pipelined
    gemms = {name: SimpleNamespace(method=o.method, num_sm=o.num_sm, set_sm_margin=o.set_sm_margin, use_ce=True,
                                   aggregate=False) for name, o in ub_sms.TE_DEFAULT.items()}
    gemms["qkv_fprop"] = SimpleNamespace(method="bulk", num_sm=16, set_sm_margin=True, use_ce=True, aggregate=False)
    gemms["qkv_wgrad"] = SimpleNamespace(method="pipeline", num_sm=16, set_sm_margin=True, use_ce=True,
                                         aggregate=False)
    eight = _block(64 * MIB).collectives
    assert ub_sms.buffer_copy_bytes(eight, "fwd", config="ub.yaml", tp=8, gemms=gemms) == 2 * 8 * MIB
    assert ub_sms.buffer_copy_bytes(eight, "bwd", config="ub.yaml", tp=8, gemms=gemms) == 3 * 2 * 8 * MIB


def test_the_pass_pays_the_copies_at_the_rate_given():
    layer, rate = _block(64 * MIB), 1000.0  # GB/s
    setup = _setup(8, ub_cfg=H100_405B, ub_reduce_gb_per_s=rate)
    assert comm.userbuffers_copy_ms(layer, "fwd", setup.comm) == pytest.approx(32 * MIB / 1e12 * 1e3)
    assert comm.userbuffers_copy_ms(layer, "bwd", setup.comm, float8=True) == pytest.approx(48 * MIB / 1e12 * 1e3)
    assert comm.userbuffers_copy_ms(_block(64 * MIB, "moe_block"), "fwd", setup.comm) == 0.0
    assert comm.userbuffers_copy_ms(layer, "fwd", _setup(8, ub_cfg=H100_405B).comm) == 0.0  # no rate: a plan before
    no_overlap = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30],
                            runtime="megatron", comm=dict(tp=8, tp_gb_per_s=100.0, ub_reduce_gb_per_s=rate))
    assert comm.userbuffers_copy_ms(layer, "fwd", no_overlap.comm) == 0.0


def test_b4s_block_by_hand():
    # B4: 4,096 tokens a CP rank x hidden 16,384, tp 8, FP8 gathers; H100 SXM's eager elementwise class 0.922 of
    # 3.35 TB/s. Forward: two FP8 shards of 8 MiB, each read and written (32 MiB); backward: two (32 MiB) and two bf16
    # chunks of 16 MiB cloned (64 MiB): 128 MiB a block-microbatch
    fields = _userbuffers(gpu("h100-sxm"), SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg=H100_405B))
    setup, layer = _setup(8, **fields), _block(4096 * 16384 * 2)
    fwd = comm.userbuffers_copy_ms(layer, "fwd", setup.comm, float8=True)
    bwd = comm.userbuffers_copy_ms(layer, "bwd", setup.comm, float8=True)
    assert (fwd, bwd) == pytest.approx((32 * MIB / (3.35 * 0.922e12) * 1e3, 96 * MIB / (3.35 * 0.922e12) * 1e3))
    assert fwd + bwd == pytest.approx(0.04345, abs=1e-5)  # 43.5 µs a block-microbatch
