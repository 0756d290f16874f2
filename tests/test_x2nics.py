"""NCCL's ring latency on FSDP2's exposed collectives (planner/cost/links.py ring_latency_us, group_nodes;
planner/cost/fsdp2work.py unit_latency_ms, edge_units_exposed_ms; docs/framework-facts.md §141): hand counts
of NVIDIA/nccl v2.21.5-1 src/graph/tuning.cc's model, and the first unit's collectives at 8 and 128 ranks."""

from __future__ import annotations

import pytest

from planner.cost import fsdp2work, links
from planner.cost.dataparallel import exposed_comm_ms
from planner.cost.layers import layer_costs
from planner.schema import TrainSetup


def test_a_ring_all_gather_over_16_nodes_crosses_the_network_15_times_and_nvlink_112():
    # 128 ranks, 8 a node: 127 steps, 15 across; Simple's network overhead 3 x 1 µs under NVLink's 3.4
    assert links.ring_latency_us("all-gather", 128, 16) == pytest.approx(8.4 + 112 * 3.4 + 15 * 14.0) == 599.2
    assert links.ring_latency_us("reduce-scatter", 128, 16) == pytest.approx(599.2)
    # one node: 7 NVLink steps, no overhead
    assert links.ring_latency_us("all-gather", 8, 1) == pytest.approx(8.4 + 7 * 3.4) == 32.2
    assert links.ring_latency_us("all-gather", 8, 1, intra="pcie") == pytest.approx(8.4 + 7 * 5.7)
    assert links.ring_latency_us("all-gather", 1, 1) == 0.0


def test_ll_takes_the_network_overhead_where_it_exceeds_nvlinks_step():
    # LL: base 6.6, NVLink 0.6 < the overhead 1.0 (not tripled), network 2.7
    assert links.ring_latency_us("all-gather", 128, 16, protocol="LL") == pytest.approx(6.6 + 112 * 1.0 + 15 * 2.7)


def test_an_all_reduce_across_nodes_counts_two_network_steps_a_node_at_2_21_5():
    # 16 ranks on 2 nodes: 30 steps, 2 x 2 of them across (v2.21.5's 2 * nNodes)
    assert links.ring_latency_us("all-reduce", 16, 2) == pytest.approx(8.4 + 26 * 3.4 + 4 * 14.0) == 152.8
    # one rank a node: 30 steps, 32 "across", as the code computes it
    assert links.ring_latency_us("all-reduce", 16, 16) == pytest.approx(8.4 - 2 * 3.4 + 32 * 14.0)


def test_unknown_collective_or_protocol_is_refused():
    with pytest.raises(ValueError):
        links.ring_latency_us("all-to-all", 8, 1)
    with pytest.raises(ValueError):
        links.ring_latency_us("all-gather", 8, 1, protocol="NVLS")


def test_a_groups_nodes_by_its_stride():
    assert links.group_nodes(128, 1, 8) == 16
    assert links.group_nodes(8, 1, 8) == 1
    assert links.group_nodes(4, 4, 8) == 2  # two ranks a node
    assert links.group_nodes(16, 8, 8) == 16  # one a node
    assert links.group_nodes(3, 1, 2) == 2


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=128, zero=3, shard_gb_per_s=100.0,
                replica_gb_per_s=100.0)
    return TrainSetup(**(base | fields))


def test_a_units_collectives_take_the_shard_groups_ring_latency_and_hsdps_replica_all_reduce():
    assert fsdp2work.unit_latency_ms(setup()) == pytest.approx((0.5992, 0.5992))
    assert fsdp2work.unit_latency_ms(setup(gpus_per_node=128)) == pytest.approx((0.4402, 0.4402))  # 8.4 + 127 x 3.4
    # HSDP: shards of 8 in a node (32.2 µs), then the 16 replicas, one a node, all-reduced (8.4 - 6.8 + 448)
    assert fsdp2work.unit_latency_ms(setup(shard_group=8)) == pytest.approx((0.0322, 0.0322 + 0.4496))


def _four_layers():
    from planner.models.synthetic import layer, profile_of

    return profile_of([layer("embed", "Embedding", fwd_ms=1.0, act_mib=0, input_mib=0, param_count=10**9),
                       layer("blocks.0", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                       layer("blocks.1", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                       layer("head", "Head", fwd_ms=30.0, act_mib=0, input_mib=0, param_count=10**9)],
                      name="edge_units")


def test_the_first_unit_and_the_block_after_it_expose_their_latency_at_128_ranks_of_16_nodes():
    p, s = _four_layers(), setup()
    embed, block, _, head = layer_costs(p)
    # bytes over 100 GB/s, 127/128 of them: the embedding's bf16 gather 19.84375 ms, its fp32 reduction 39.6875;
    # a block's 9.921875 and 19.84375. Charged already (exposed_comm_ms): the embedding's gather less its forward
    # (1 ms), its reduction less its backward (2 ms) twice over: 18.84375 + 17.84375 + 37.6875 = 74.375; a block's 0
    assert exposed_comm_ms(embed.param_count, s, fwd_ms=1.0, bwd_ms=2.0) == pytest.approx(74.375)
    lat = 0.5992
    first_unit = 19.84375 + 39.6875 + 2 * lat - 74.375  # the root unit gathered and reduced whole, one latency each
    second = (9.921875 + lat - 1.0) + (19.84375 + lat - 2.0)  # block 0 behind the embedding alone
    assert fsdp2work.edge_units_exposed_ms(embed, p, s) == pytest.approx(first_unit + second)
    # the head is the root unit's too: its bytes, no second latency
    assert fsdp2work.edge_units_exposed_ms(head, p, s) == pytest.approx(19.84375 + 39.6875)
    assert fsdp2work.edge_units_exposed_ms(block, p, s) == 0.0


def test_the_same_ranks_in_one_node_expose_nvlinks_latency_only():
    p = _four_layers()
    embed = layer_costs(p)[0]
    across = fsdp2work.edge_units_exposed_ms(embed, p, setup())
    inside = fsdp2work.edge_units_exposed_ms(embed, p, setup(gpus_per_node=128))
    assert across - inside == pytest.approx(4 * (0.5992 - 0.4402))  # four collectives: 15 steps at 14 µs, not 3.4
