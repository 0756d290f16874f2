"""The routed experts' gradient reductions and weight gathers run in the expert-data-parallel group (dp / E ranks, E
apart: dataparallel.expert_setup), so their CTAs are that group's NCCL channels, not the dense data-parallel
group's (planner/cost/nccl_sms.py layers_shares): by hand on an H100 node (132 SMs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.cost import dataparallel as dp
from planner.cost import megatron_dp, nccl_sms
from planner.cost.layers import LayerCost
from planner.models.archs import gpu as gpu_by_name
from planner.schema import TrainSetup

H100 = SimpleNamespace(assumptions={"gpu": "h100-sxm"})  # what dataparallel.profile_gpu reads of a profile
DENSE, EXPERTS = 100_000_000, 800_000_000  # a block's dense parameters and its routed experts' (all E ranks')


def _layer() -> LayerCost:
    return LayerCost(name="l0", kind="block", fwd_ms=5.0, bwd_ms=10.0, act_bytes=0, input_bytes=0, output_bytes=0,
                     input_in_act_bytes=0, param_count=DENSE + EXPERTS, transient_bytes=0, expert_param_count=EXPERTS)


def _setup(**dp_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      precision="bf16-mixed", shard_gb_per_s=100.0, replica_gb_per_s=100.0, **dp_fields)


def test_ddps_all_reduce_dense_over_nvls_experts_over_a_two_rank_ring():
    # DDP (ZeRO 0) over 8 ranks of one node, EP 4: the dense all-reduce over 8 GPUs with multicast runs NVLS, 16
    # channels on SM90; each expert's replicas are dp / E = 2 ranks (4 apart, one node): no NVLS at two GPUs, the
    # ring's 24 channels
    setup = _setup(dp=8, ep=4)
    gpu = gpu_by_name("h100-sxm")
    held = EXPERTS // 4  # the rank's 1/E of the experts
    assert nccl_sms.gpu_share(gpu, 132, setup, "reduce", DENSE) == 16 / 132
    assert nccl_sms.gpu_share(gpu, 132, dp.expert_setup(setup), "reduce", held, stride=4) == 24 / 132
    dense_ms = dp.grad_reduce_ms(DENSE, setup)
    expert_ms = dp.grad_reduce_ms(held, dp.expert_setup(setup))
    assert dense_ms > 0 and expert_ms > 0
    _, reduce = nccl_sms.layers_shares(gpu, 132, setup, [_layer()])
    assert reduce == pytest.approx((dense_ms * 16 + expert_ms * 24) / (dense_ms + expert_ms) / 132, rel=1e-12)
    # the simulation's side stream (Megatron-LM's interleaved DDP) takes the same share
    assert megatron_dp.stage_shares([_layer()], H100, setup)[1] == reduce


def test_experts_spread_one_a_node_run_the_network_ring():
    # 32 ranks in 4 nodes, EP 8: the dense all-reduce spans nodes (NVLS_TREE: 32 channels on SM90 is SM100's; SM90's
    # across is NVLS_CHANNELS_MULTI_NODE); the experts' 4 replicas lie 8 apart: one a node, the network ring, 2 a NIC
    # doubled, 16 on an 8-NIC node (network_ring_channels)
    setup = _setup(dp=32, ep=8)
    gpu = gpu_by_name("h100-sxm")
    experts = dp.expert_setup(setup)
    assert experts.data_parallel.dp == 4
    assert nccl_sms.gpu_share(gpu, 132, experts, "reduce", EXPERTS // 8, stride=8) == 16 / 132
    # laid out as if contiguous (the share before this change) the 4 would sit in one node: NVLS's 16 too, but a
    # reduce-scatter (ZeRO 1) shows the difference: the ring's 24 in a node against the network ring's 16
    zero1 = dp.expert_setup(_setup(dp=32, ep=8, zero=1))
    assert nccl_sms.gpu_share(gpu, 132, zero1, "reduce", EXPERTS // 8) == 24 / 132
    assert nccl_sms.gpu_share(gpu, 132, zero1, "reduce", EXPERTS // 8, stride=8) == 16 / 132


def test_without_experts_the_share_is_the_dense_groups():
    setup = _setup(dp=8)
    gpu = gpu_by_name("h100-sxm")
    dense_only = LayerCost(name="l0", kind="block", fwd_ms=5.0, bwd_ms=10.0, act_bytes=0, input_bytes=0,
                           output_bytes=0, input_in_act_bytes=0, param_count=DENSE, transient_bytes=0)
    # DDP gathers nothing (ZeRO 0): no gather's CTAs; the all-reduce's NVLS 16
    assert nccl_sms.layers_shares(gpu, 132, setup, [dense_only]) == (0.0, 16 / 132)
