"""The SMs the rest of the communication takes (planner/cost/nccl_sms.py; docs/framework-facts.md §147), by hand:
an all-reduce's CTAs at the ring's channels where the launch turns NVLink SHARP off (NCCL_NVLS_ENABLE=0), and FSDP2's
hidden collectives holding their CTAs through NCCL's ring latency as well as their bytes.

The model is test_ncclsm's: embedding and head 1e9 parameters, two blocks of 0.5e9; forward 1, 40, 40, 30 ms,
backward twice that; 4 ranks at 100 GB/s: a block's all-gather 7.5 ms, its reduce-scatter 15, its all-reduce
(ZeRO 0, 2 x 3/4 of its fp32 gradients) 30.
"""

from __future__ import annotations

import pytest

from planner.cost import dataparallel, nccl_sms
from planner.cost.layers import layer_costs
from tests.test_ncclsm import _four_layers
from tests.test_ncclsm import setup as _setup


@pytest.mark.parametrize("gpu, ranks, local, nvls, ctas", [
    ("h100-sxm", 8, 8, True, 16),  # NVLS_NCHANNELS_SM90 (nvls.cc 147)
    ("h100-sxm", 8, 8, False, 24),  # NCCL_NVLS_ENABLE=0: the ring's 24 channels (6 NVLink rings, doubled twice)
    ("b200", 8, 8, False, 32),  # the ring's 32, not NVLS_NCHANNELS_SM100_NVL's 24
    ("gb200", 144, 72, False, 16),  # across domains: the network ring's 2 a NIC x 8 NICs, not NVLS's 32
    ("h100-sxm", 16, 2, True, 16),  # two ranks a node: no NVLS whatever the launch (nvls.cc 160), the network ring
    ("a100-80g", 8, 8, True, 24),  # no multicast: the ring either way
])
def test_an_all_reduce_runs_nvls_channels_only_where_nccl_runs_nvls(gpu, ranks, local, nvls, ctas):
    assert nccl_sms.collective_ctas(gpu, "all-reduce", 10**9, ranks=ranks, local_ranks=local, nvls=nvls) == ctas


def test_a_gather_or_reduce_scatter_is_the_ring_whatever_the_launch_says():
    for nvls in (True, False):
        assert nccl_sms.collective_ctas("h100-sxm", "all-gather", 10**9, ranks=8, local_ranks=8, nvls=nvls) == 24
        assert nccl_sms.collective_ctas("h100-sxm", "reduce-scatter", 10**9, ranks=8, local_ranks=8,
                                        nvls=nvls) == 24


def test_the_setting_nccl_nvls_off_moves_a_hidden_all_reduce_from_16_ctas_to_24():
    p = _four_layers("h100-sxm")
    block = layer_costs(p)[1]
    on, off = _setup(zero=0), _setup(zero=0, nccl_nvls_off=True)
    _, reduce = dataparallel.collectives_ms(block.param_count, on)
    assert reduce == pytest.approx(30.0)  # 2 x 3/4 x 2e9 B at 100 GB/s
    assert nccl_sms.layer_ms(block, p, on) == pytest.approx(30.0 * 16 / 132)
    assert nccl_sms.layer_ms(block, p, off) == pytest.approx(30.0 * 24 / 132)


def test_fsdp2s_unit_latency_is_charged_only_where_its_units_are_charged_per_moment():
    # 4 ranks of one node: 8.4 + 3 x 3.4 = 18.6 µs a ring all-gather or reduce-scatter (links.ring_latency_us)
    assert nccl_sms.fsdp2_latency_ms(_setup()) == pytest.approx((0.0186, 0.0186))
    # 128 ranks of 16 nodes: 8.4 + 112 x 3.4 + 15 x 14 = 599.2 µs each (tests/test_x2nics.py)
    assert nccl_sms.fsdp2_latency_ms(_setup(dp=128)) == pytest.approx((0.5992, 0.5992))
    assert nccl_sms.fsdp2_latency_ms(_setup(zero=2)) == (0.0, 0.0)  # not resharded: no units charged per moment
    assert nccl_sms.fsdp2_latency_ms(_setup(runtime="deepspeed", runtime_version=None)) == (0.0, 0.0)


def test_a_block_at_128_ranks_loses_its_three_collectives_latency_beside_the_bytes():
    # 128 ranks of 8 a node, 16 CTAs (the network ring): bytes 127/128 of the 4-rank figures over 3/4 (31.75 ms of
    # the three collectives), and three ring latencies of 0.5992 ms, all inside the block's 40 and 80 ms
    p = _four_layers("h100-sxm")
    block = layer_costs(p)[1]
    s = _setup(dp=128)
    bytes_ms = 30 * (127 / 128) / (3 / 4)
    assert nccl_sms.layer_ms(block, p, s) == pytest.approx((bytes_ms + 3 * 0.5992) * 16 / 132)
