"""NCCL's tuner on a sized all-reduce (planner/cost/nccltuner.py tuned_sized_all_reduce) and its use for the
data-parallel group's all-reduce across nodes (planner/cost/sizedreduce.py): hand counts of tuning.cc's model."""

import math

import pytest

from planner.cost import dataparallel, nccl_buffers, nccltuner, sizedreduce
from planner.schema import TrainSetup

# an H100 node of 8 GPUs and 8 NICs: the ring's bus rate min(8 x 46.08, 354.9) = 354.9 GB/s over 8 NICs
H100_RING, H100_NICS = 354.9, 8


def test_graph_channels_follow_dup_channels():
    # 8 NICs at 44.4 GB/s on Hopper: under 50 with more than 4 channels, not doubled
    assert nccltuner.graph_channels(H100_RING, H100_NICS, 90) == (8, pytest.approx(44.3625))
    # on Ampere (cc 80, not > 80) 25 GB/s or more doubles: 16 channels at half
    assert nccltuner.graph_channels(H100_RING, H100_NICS, 80) == (16, pytest.approx(22.18125))
    # one NIC (one rank a node): 46.08 doubled into two channels of 23.04
    assert nccltuner.graph_channels(46.08, 1, 90) == (2, pytest.approx(23.04))
    # under 25 GB/s: kept
    assert nccltuner.graph_channels(12.5, 2, 80) == (2, pytest.approx(6.25))


def test_bandwidths_by_hand_two_nodes():
    ch, speed = 8, H100_RING / 8
    bw = lambda a, p: nccltuner.all_reduce_bandwidth_gbps(a, p, 16, 2, ch, speed, "hopper")  # noqa: E731
    assert bw("Ring", "Simple") == pytest.approx(354.9 * 16 / 30)
    assert bw("Ring", "LL") == pytest.approx(min(39.0, 354.9 * .5) * 16 / 30)  # llMaxBws Intel, 2 nodes
    assert bw("Ring", "LL128") == pytest.approx(min(354.9 * .92, 8 * 36.7) * 16 / 30)
    tree = min(354.9 * .92, 8 * 41.4)  # perChMaxTreeBws Hopper, 2 nodes
    assert bw("Tree", "Simple") == pytest.approx(tree * .5)
    assert bw("Tree", "LL") == pytest.approx(min(tree / 3.8, 39.0) * .5)
    assert bw("Tree", "LL128") == pytest.approx(min(tree * 120 / 128, 8 * 36.7) * .5)


def test_small_all_reduce_across_two_nodes_is_tree_ll():
    # Tree / LL: 6.8 + 2 x ((8 - 1) x 0.6 + log2(2) x 5.0) = 25.2 µs, 4 B over 19.5 GB/s
    algorithm, protocol, us = nccltuner.tuned_sized_all_reduce(4, 16, 2, 8, H100_RING / 8, "hopper")
    assert (algorithm, protocol) == ("Tree", "LL")
    assert us == pytest.approx(25.2 + 4 / (1000 * 19.5))


def test_large_all_reduce_across_two_nodes_is_ring_simple():
    # Ring / Simple: (8.4 + (30 - 2) x 3.4 + 2 x 14) x 1.4 (the plateau) + 1 GiB / (354.9 x 16 / 30 GB/s)
    algorithm, protocol, us = nccltuner.tuned_sized_all_reduce(2**30, 16, 2, 8, H100_RING / 8, "hopper")
    assert (algorithm, protocol) == ("Ring", "Simple")
    assert us == pytest.approx(131.6 * 1.4 + 2**30 / (1000 * 354.9 * 16 / 30))


def _picks(ranks, nodes, version=nccltuner.V2_27):
    ch, speed = nccltuner.graph_channels(H100_RING, H100_NICS, 90)
    return {2**e: nccltuner.tuned_sized_all_reduce(2**e, ranks, nodes, ch, speed, "hopper", version=version)[:2]
            for e in range(2, 34)}


def test_crossovers_sixteen_nodes():
    picks = _picks(128, 16)
    assert picks[2**17] == ("Tree", "LL") and picks[2**18] == ("Tree", "LL128")
    assert picks[2**26] == ("Tree", "LL128") and picks[2**27] == ("Tree", "Simple")
    assert picks[2**30] == ("Tree", "Simple") and picks[2**31] == ("Ring", "Simple")
    # at v2.21.5 Tree / Simple's 28 µs a hop loses it to Ring / LL128, then Ring / Simple from 1 GiB
    old = _picks(128, 16, nccltuner.V2_21)
    assert old[2**27] == ("Tree", "LL128") and old[2**28] == ("Ring", "LL128") and old[2**30] == ("Ring", "Simple")


def test_one_node_small_ring_ll_large_ring_simple():
    picks = _picks(8, 1)
    assert picks[4] == ("Ring", "LL") and picks[2**22] == ("Ring", "LL128") and picks[2**24] == ("Ring", "Simple")


def test_v2_21_latencies():
    # Tree / Simple: 0 + 2 x ((8 - 1) x 28 + 1 x 28); the ring's network steps 2 x nodes
    assert nccltuner.all_reduce_latency_us("Tree", "Simple", 16, 2, version=nccltuner.V2_21) == pytest.approx(448)
    assert nccltuner.all_reduce_latency_us("Ring", "LL", 16, 2, version=nccltuner.V2_21) == pytest.approx(
        6.6 + 26 * 1.0 + 4 * 2.7)
    assert nccltuner.all_reduce_latency_us("Ring", "LL", 16, 2) == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)
    with pytest.raises(ValueError):
        nccltuner.all_reduce_latency_us("Ring", "LL", 16, 2, version="2.18")


def _setup(**fields):
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                dp=16, zero=0, shard_gb_per_s=46.08, gpus_per_node=8, tp=8)
    return TrainSetup(**(base | fields))


def test_inside_one_node_keeps_the_ring():
    s = _setup(dp=8, tp=1, shard_gb_per_s=H100_RING, nccl_capability=90, nccl_nics_per_gpu=1)
    assert sizedreduce.tuned_all_reduce(2**30, 8, s, H100_RING) == ("Ring", "Simple", 2 * 7 / 8 * 2**30 / 354.9e9 * 1e3)


def test_unknown_gpu_keeps_the_ring():
    s = _setup()
    assert sizedreduce.all_reduce_ms(2**30, 16, s, 46.08) == pytest.approx(2 * 15 / 16 * 2**30 / 46.08e9 * 1e3)


def test_across_nodes_tuned_one_rank_a_node():
    # tp 8: the 16 data-parallel ranks one a node; 2 channels of 23.04 GB/s (one NIC doubled), v2.27.7
    s = _setup(nccl_capability=90, nccl_nics_per_gpu=1)
    algorithm, protocol, ms = sizedreduce.tuned_all_reduce(2**30, 16, s, 46.08)
    lat = (8.4 + 30 * 14.0) * 1.4  # ppn 1: every step crosses the network, Tree's network figure
    assert (algorithm, protocol) == ("Ring", "Simple")
    assert ms == pytest.approx((lat + 2**30 / (1000 * 46.08 * 16 / 30)) / 1000)
    small = sizedreduce.tuned_all_reduce(4096, 16, s, 46.08)
    assert small[:2] == ("Tree", "LL") and small[2] > 2 * 15 / 16 * 4096 / 46.08e9 * 1e3


def test_ring_simple_forced():
    s = _setup(nccl_capability=90, nccl_nics_per_gpu=1, nccl_ring_simple=True)
    algorithm, protocol, ms = sizedreduce.tuned_all_reduce(1024, 16, s, 46.08)
    assert (algorithm, protocol) == ("Ring", "Simple")  # 1 KB over 2 channels x 16 ranks: 32 B each, no plateau
    assert ms == pytest.approx(((8.4 + 30 * 14.0) + 1024 / (1000 * 46.08 * 16 / 30)) / 1000)
    plateau = sizedreduce.tuned_all_reduce(2048, 16, s, 46.08)[2]  # 64 B each: x1.4
    assert plateau == pytest.approx(((8.4 + 30 * 14.0) * 1.4 + 2048 / (1000 * 46.08 * 16 / 30)) / 1000)


def test_grad_reduce_uses_the_tuner_across_nodes():
    params = 10_000_000
    plain, tuned = _setup(), _setup(nccl_capability=90, nccl_nics_per_gpu=1)
    grads = params * dataparallel.param_bytes(tuned).grads  # in the dtype accumulated
    expected = sizedreduce.tuned_all_reduce(grads, 16, tuned, 46.08)[2]
    assert dataparallel.grad_reduce_ms(params, tuned) == pytest.approx(expected)
    assert dataparallel.grad_reduce_ms(params, plain) == pytest.approx(2 * 15 / 16 * grads / 46.08e9 * 1e3)
    assert not math.isclose(expected, dataparallel.grad_reduce_ms(params, plain))


def test_torchtitan_runs_v2_21():
    assert sizedreduce.nccl_version(_setup(runtime="torchtitan", runtime_version="9dec370")) == nccltuner.V2_21
    assert sizedreduce.nccl_version(_setup(runtime="torchtitan")) == nccltuner.V2_27  # the newest: not read
    assert sizedreduce.nccl_version(_setup()) == nccltuner.V2_27


class _Device:
    def __init__(self, kind):
        self.type = kind


class _Profile:
    def __init__(self, kind="cuda"):
        self.device = _Device(kind)


def test_gpu_fields_from_the_gpu_record():
    from planner.models import archs

    h100 = archs.gpu("h100-sxm")
    assert nccl_buffers.gpu_fields(_Profile(), h100) == {"nccl_capability": 90, "nccl_nics_per_gpu": h100.nics_per_gpu}
    assert nccl_buffers.gpu_fields(_Profile(), h100, 2.0)["nccl_nics_per_gpu"] == 2.0  # --nics-per-gpu
    assert nccl_buffers.gpu_fields(_Profile(), archs.gpu("mi300x")) == {}  # RCCL: not read
    assert nccl_buffers.gpu_fields(_Profile("cpu"), h100) == {}
