"""NCCL's CTAs beside the compute a hidden data-parallel collective runs with (planner/cost/nccl_sms.py), counted by
hand: the CTAs from NCCL v2.27.7-1's channel counts, the window arithmetic, and a four-layer model's charge.

The model (test_fsdp2work's): embedding and head 1e9 parameters, two blocks of 0.5e9; forward 1, 40, 40, 30 ms,
backward twice that. Over 4 ranks at 100 GB/s a block's all-gather moves 3/4 of its bf16 weights (7.5 ms) and its
reduce-scatter 3/4 of its fp32 gradients (15 ms); the head's 15 and 30 ms.
"""

from __future__ import annotations

import pytest

from planner.cost import dataparallel, nccl_sms
from planner.cost.layers import layer_costs
from planner.cost.terms import TERMS
from planner.models import archs
from planner.models.gpu_sms import sm_count
from planner.schema import TrainSetup

GB = 10**9


@pytest.mark.parametrize("gpu, kind, ranks, local, ctas", [
    ("h100-96g", "all-gather", 8, 8, 24),  # 6 rings at 60 GB/s, doubled twice (nccl_buffers.ring_channels)
    ("h200", "reduce-scatter", 32, 8, 16),  # across nodes: a ring a NIC, doubled (NVLS off without CollNet)
    ("a100-80g", "all-reduce", 8, 8, 24),  # no multicast: the ring
    ("h100-sxm", "all-reduce", 8, 8, 16),  # NVLS_NCHANNELS_SM90
    ("h100-sxm", "all-reduce", 2, 2, 24),  # two GPUs: no NVLS
    ("b200", "all-gather", 8, 8, 32),  # 8 rings at 90 GB/s, doubled twice
    ("b200", "all-reduce", 8, 8, 24),  # NVLS_NCHANNELS_SM100_NVL
    ("gb200", "all-reduce", 144, 72, 32),  # NVLS_NCHANNELS_SM100 across domains
    ("mi300x", "all-gather", 8, 8, 56),  # RCCL rome_model_79: 28 rings, doubled
    ("mi300x", "all-gather", 16, 8, 0),  # not read across nodes
    ("h100-pcie", "all-gather", 8, 8, 0),  # no NVLink graph read
    ("h100-sxm", "all-gather", 1, 1, 0),
])
def test_ctas_a_large_collective_launches(gpu, kind, ranks, local, ctas):
    assert nccl_sms.collective_ctas(gpu, kind, 1 * GB, ranks=ranks, local_ranks=local) == ctas


@pytest.mark.parametrize("nics, capability, channels", [(8, 90, 16), (8, 100, 16), (4, 90, 16), (2, 90, 8),
                                                        (4, 80, 8), (8, 80, 16)])
def test_a_ring_across_nodes_takes_a_ring_a_nic_and_the_postsets_doubling(nics, capability, channels):
    assert nccl_sms.network_ring_channels(nics, capability) == channels


def test_a_small_collective_drops_channels_below_32_kib_each():
    # nBytes < nc x 512 threads x 64 B: one channel fewer (enqueue.cc topoGetAlgoInfo)
    assert nccl_sms.collective_ctas("h100-sxm", "all-gather", 100 * 1024, ranks=8, local_ranks=8) == 3
    assert nccl_sms.collective_ctas("h100-sxm", "all-gather", 24 * 32768, ranks=8, local_ranks=8) == 24
    assert nccl_sms.collective_ctas("h100-sxm", "all-gather", 24 * 32768 - 1, ranks=8, local_ranks=8) == 23
    assert nccl_sms.collective_ctas("h100-sxm", "all-gather", 10, ranks=8, local_ranks=8) == 1


def test_sm_counts_with_the_records_own_first():
    assert [sm_count(archs.gpu(n)) for n in ("h100-sxm", "h100-pcie", "h200", "a100-80g", "b200", "gb200",
                                             "mi300x")] == [132, 114, 132, 108, 148, 152, 304]


@pytest.mark.parametrize("collective, compute, lost, added", [
    (10.0, 40.0, 2.0, 2.0),  # the collective inside the compute: every lost ms added
    (10.0, 9.0, 2.0, 1.0),  # the compute, slowed, ends 1 ms past the collective
    (10.0, 4.0, 2.0, 0.0),  # slowed, still inside the collective: nothing
])
def test_the_window_adds_what_the_slowed_compute_ends_past_the_collective(collective, compute, lost, added):
    assert nccl_sms.slowed_ms(collective, compute, lost) == pytest.approx(added)


def _four_layers(gpu: str):
    from planner.models.synthetic import layer, profile_of

    p = profile_of([layer("embed", "Embedding", fwd_ms=1.0, act_mib=0, input_mib=0, param_count=10**9),
                    layer("blocks.0", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                    layer("blocks.1", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                    layer("head", "Head", fwd_ms=30.0, act_mib=0, input_mib=0, param_count=10**9)], name="ncclsm")
    return p.model_copy(update={"assumptions": {"gpu": gpu}})


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3, shard_gb_per_s=100.0,
                replica_gb_per_s=100.0)
    return TrainSetup(**(base | fields))


def _charged(s: TrainSetup, gpu: str = "h100-sxm") -> list[float]:
    p = _four_layers(gpu)
    return [nccl_sms.layer_ms(x, p, s) for x in layer_costs(p)]


def test_fsdp2_blocks_lose_their_gathers_and_reduction_times_24_of_132_and_the_root_unit_nothing():
    # a block: forward gather 7.5 behind 40, backward gather 7.5 behind 80, the reduction 15 behind 80, each
    # whole inside its compute: (7.5 + 7.5 + 15) x 24 / 132. The root unit (embedding, head at 9dec370) is
    # gathered and reduced exposed (fsdp2work.edge_units_exposed_ms): nothing runs beside compute. Each of the
    # three collectives also holds its CTAs through NCCL's ring latency, 4 ranks of one node: 8.4 + 3 x 3.4 = 18.6 µs
    block = (30 + 3 * 0.0186) * 24 / 132
    assert _charged(setup()) == pytest.approx([0.0, block, block, 0.0])
    # per-layer units (2c8b5947): the head hidden as any other, 15 + 15 + 30 behind 30, 60, 60
    assert _charged(setup(runtime_version="2c8b5947")) == pytest.approx([0.0, block, block,
                                                                          (60 + 3 * 0.0186) * 24 / 132])


def test_other_gpus_take_their_own_ctas_over_their_own_sms():
    assert _charged(setup(), "a100-80g")[1] == pytest.approx((30 + 3 * 0.0186) * 24 / 108)
    assert _charged(setup(), "b200")[1] == pytest.approx((30 + 3 * 0.0186) * 32 / 148)
    assert _charged(setup(), "h100-pcie") == [0.0] * 4


def test_a_shard_group_across_nodes_takes_the_network_rings_channels():
    # 16 ranks of 8 a node, one NIC a GPU: 16 CTAs; the collectives' times at the same 100 GB/s scale as 15/16,
    # each's ring latency over 2 nodes 8.4 + 14 x 3.4 + 1 x 14 = 70 µs
    s = setup(dp=16)
    assert _charged(s)[1] == pytest.approx(((7.5 + 7.5 + 15) * (15 / 16) / (3 / 4) + 3 * 0.070) * 16 / 132)


def test_two_microbatches_gather_twice_each_and_reduce_each_beside_the_backward():
    # per microbatch: gather 7.5 behind 40; gather 7.5 + reduction 15 behind 80 (reduced every microbatch), each
    # with its 18.6 µs of ring latency
    assert _charged(setup(microbatches=2))[1] == pytest.approx(2 * (30 + 3 * 0.0186) * 24 / 132)


def test_an_all_reduce_beside_the_backward_takes_nvls_channels():
    s = setup(zero=0)
    p = _four_layers("h100-sxm")
    block = layer_costs(p)[1]
    _, reduce = dataparallel.collectives_ms(block.param_count, s)
    assert reduce > 0
    assert nccl_sms.layer_ms(block, p, s) == pytest.approx(reduce * 16 / 132)


@pytest.mark.parametrize("fields", [dict(dp=1), dict(runtime="megatron", runtime_version=None, zero=1, stages=2,
                                                        chunks=2, schedule="interleaved-1F1B", microbatches=4,
                                                        mem_caps_bytes=[2**50] * 2)])
def test_nothing_where_nothing_is_hidden_here(fields):
    assert _charged(setup(**fields)) == [0.0] * 4


def test_the_term_is_one_step_row():
    rows = [t for t in TERMS if t.name.startswith("NCCL's CTAs beside the compute")]
    assert len(rows) == 1 and rows[0].quantity == "step" and rows[0].where == "layer"
