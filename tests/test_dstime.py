"""DeepSpeed ZeRO 3's step beyond its collectives' bytes (docs/published-runs.md §35.dstime, framework-facts §175-§177):
the pre-divide of every gradient before its reduce-scatter, the persistent parameters gathered again after the step,
the step's two scalar all-reduces, and the host copies of GPUs sharing one PCIe switch's uplink (DeepSpeed v0.6.2;
Azure's NDm A100 v4)."""

from __future__ import annotations

import pytest
from fixtures.ds_gpt import H, tiny_gpt_profile

from planner.cost import deepspeed_step, deepspeed_zero3, runtimes, stepcomm
from planner.cost.layers import layer_costs


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    return tiny_gpt_profile(tmp_path_factory.mktemp("dstime"))


def _setup(profile, *, runtime="deepspeed", dp=8, zero=3, microbatches=1, host_bandwidth=None, **deepspeed):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    options = DataParallelOptions(dp=dp, zero=zero, host_bandwidth=host_bandwidth, deepspeed=deepspeed)
    return build_setup(profile, stages=1, mem="80GB", microbatches=microbatches, schedule="1F1B", optimizer="adam",
                       precision="bf16-mixed", parallel_stages=None, runtime=runtime, data_parallel=options)


def _layer(profile, kind):
    return next(layer for layer in layer_costs(profile) if layer.kind == kind)


def test_the_pre_divide_reads_and_writes_every_gradient_once_a_reduction(gpt_profile):
    block = _layer(gpt_profile, "decoder_block")
    assert block.param_count == 12 * H * H + 13 * H
    elementwise = gpt_profile.assumptions["membound_tbps"]["by_class"]["elementwise"]  # Liger's A100 eager mean
    one = 4 * block.param_count / (elementwise * 1e12) * 1e3  # div_ in place: read 2 B, write 2 B a parameter
    assert deepspeed_step.prepass_ms(block, gpt_profile, _setup(gpt_profile)) == pytest.approx(one, rel=1e-12)
    # ZeRO 3 reduces every microbatch's gradients
    assert deepspeed_step.prepass_ms(block, gpt_profile, _setup(gpt_profile, microbatches=3)) == \
        pytest.approx(3 * one, rel=1e-12)
    for other in (_setup(gpt_profile, zero=2), _setup(gpt_profile, runtime="torchtitan")):
        assert deepspeed_step.prepass_ms(block, gpt_profile, other) == 0.0


def test_the_tied_head_is_divided_once_on_the_embedding(gpt_profile):
    embedding, head = _layer(gpt_profile, "embedding"), _layer(gpt_profile, "norm+lm_head")
    assert deepspeed_step.own_param_count(embedding, gpt_profile) == embedding.param_count
    assert deepspeed_step.own_param_count(head, gpt_profile) == 2 * H  # the final norm: the tied weight is the embedding's


def test_the_persistent_parameters_are_those_under_the_threshold():
    # the Azure 175B's block (h 12,288): both norms' weight and bias, every bias: 8 tensors; the 1T's (h 25,600): its
    # dense_h_to_4h bias (4h = 102,400) is partitioned, 7
    assert deepspeed_step.persistent_of(deepspeed_zero3.gpt_block(12288, 4 * 12288)) == \
        [12288, 12288, 3 * 12288, 12288, 12288, 12288, 4 * 12288, 12288]
    assert len(deepspeed_step.persistent_of(deepspeed_zero3.gpt_block(25600, 4 * 25600))) == 7
    assert deepspeed_step.persistent_of([deepspeed_zero3.Submodule("x", (100_000, 99_999))]) == [99_999]  # `<`


def test_the_persistent_gathers_by_hand(gpt_profile):
    setup = _setup(gpt_profile)
    block, head = _layer(gpt_profile, "decoder_block"), _layer(gpt_profile, "norm+lm_head")
    assert deepspeed_step.persistent_numels(block, gpt_profile, setup) == [H, H, 3 * H, H, H, H, 4 * H, H]
    assert deepspeed_step.persistent_numels(head, gpt_profile, setup) == [H, H]
    assert deepspeed_step.persistent_numels(_layer(gpt_profile, "embedding"), gpt_profile, setup) == []
    # 8 ranks in one node: NCCL's LL ring, 6.6 µs + 7 steps x 0.6 µs over NVLink; each tensor's bytes over the link
    rate = setup.data_parallel.shard_gb_per_s
    by_hand = sum((6.6 + 7 * 0.6) / 1e3 + 7 / 8 * n * 2 / (rate * 1e9) * 1e3 for n in (H, H, 3 * H, H, H, H, 4 * H, H))
    assert deepspeed_step.persistent_gathers_ms(block, gpt_profile, setup) == pytest.approx(by_hand, rel=1e-12)
    assert deepspeed_step.persistent_gathers_ms(block, gpt_profile, _setup(gpt_profile, zero=2)) == 0.0


def test_the_persistent_gathers_across_nodes_take_the_ring_latency(gpt_profile):
    # 1,024 ranks on 128 nodes (the Azure 1T's): NCCL's LL ring, 6.6 + 896 steps in a node x 1 µs (the network post
    # overhead over NVLink's 0.6) + 127 across x 2.7 µs, a tensor (links.ring_latency_us)
    setup = _setup(gpt_profile, dp=1024)
    block = _layer(gpt_profile, "decoder_block")
    latency = (6.6 + 896 * 1.0 + 127 * 2.7) / 1e3
    rate = setup.data_parallel.shard_gb_per_s
    by_hand = sum(latency + 1023 / 1024 * n * 2 / (rate * 1e9) * 1e3 for n in (H, H, 3 * H, H, H, H, 4 * H, H))
    assert deepspeed_step.persistent_gathers_ms(block, gpt_profile, setup) == pytest.approx(by_hand, rel=1e-9)


def test_the_host_link_is_shared_by_the_gpus_behind_one_switch(gpt_profile):
    # the A100 record's host link, NDm A100 v4's measured pinned 25.9 GB/s (framework-facts §575), two GPUs a
    # switch's uplink in an 8-GPU node
    assert _setup(gpt_profile, checkpoint_in_cpu=True).data_parallel.host_gb_per_s == 12.95
    assert _setup(gpt_profile, dp=1, zero=0, checkpoint_in_cpu=True).data_parallel.host_gb_per_s == 25.9  # alone
    given = _setup(gpt_profile, checkpoint_in_cpu=True, host_bandwidth=20.0)
    assert given.data_parallel.host_gb_per_s == 20.0


def test_the_step_runs_two_scalar_all_reduces(gpt_profile):
    setup = _setup(gpt_profile)
    assert [what for what, ranks, _ in stepcomm.step_collectives(setup)] == ["overflow check", "gradient norm"]
    assert all(ranks == 8 for _, ranks, _ in stepcomm.step_collectives(setup))
    bloom = runtimes.facts("deepspeed", "56c52238")  # BLOOM's fork: none of them read
    assert not (bloom.step_collectives or bloom.regathers_persistent or bloom.reduce_scatter_prepass_bytes)
