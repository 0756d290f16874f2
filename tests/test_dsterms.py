"""DeepSpeed ZeRO 3's backward under the optimizer's offload (docs/published-runs.md §37.dsterms, framework-facts
§255-§257): each weight's reduce-scatter is issued at the next parameter's gradient hook, whose blocking copy of the
reduced partition to the host keeps the host from issuing more until it is done; the GPU has only the kernels issued
between the two hooks (DeepSpeed v0.6.2, Megatron-DeepSpeed 62bc4562's GPT block)."""

from __future__ import annotations

import pytest
from fixtures.ds_gpt import MBS, SEQ, VOCAB, H, tiny_gpt_profile

from planner.cost import dataparallel, deepspeed_waits, runtimes
from planner.cost.layers import layer_costs

T, F = SEQ * MBS, 4 * H


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    return tiny_gpt_profile(tmp_path_factory.mktemp("dsterms"))


def _setup(profile, *, runtime="deepspeed", dp=8, zero=3, offload=True, microbatches=1, **deepspeed):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    if runtime == "deepspeed" and zero == 3:  # every weight of the tiny block (H x H and up) over the bucket
        deepspeed = {"reduce_bucket_size": H * H, **deepspeed}
    options = DataParallelOptions(dp=dp, zero=zero, offload_optimizer=offload, deepspeed=deepspeed)
    return build_setup(profile, stages=1, mem="80GB", microbatches=microbatches, schedule="1F1B", optimizer="adam",
                       precision="bf16-mixed", parallel_stages=None, runtime=runtime, data_parallel=options)


def _block(profile):
    return next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")


def _ms(num_bytes, tbps):
    return num_bytes / (tbps * 1e12) * 1e3


def test_the_kernels_queued_behind_each_weight_by_hand(gpt_profile):
    setup, rates = _setup(gpt_profile), gpt_profile.assumptions["membound_tbps"]["by_class"]
    # dense_4h_to_h's reduce-scatter waits behind bias_gelu_back (6 B an element of T x f) and dense_h_to_4h's bias
    # sum (2 B); dense_h_to_4h's and query_key_value's behind a LayerNorm's backward and the residual's add (6 + 6 B
    # an element of T x h, the layer_norm class as the analytic profile charges both)
    gelu = _ms(6 * T * F, rates["activation"]) + _ms(2 * T * F, rates["elementwise"])
    norm = _ms(12 * T * H, rates["layer_norm"])
    assert deepspeed_waits.queued_ms("dense_4h_to_h", gpt_profile, setup) == pytest.approx(gelu, rel=1e-12)
    assert deepspeed_waits.queued_ms("dense_h_to_4h", gpt_profile, setup) == pytest.approx(norm, rel=1e-12)
    assert deepspeed_waits.queued_ms("query_key_value", gpt_profile, setup) == pytest.approx(norm, rel=1e-12)


def test_the_waits_by_hand_on_one_node(gpt_profile):
    setup = _setup(gpt_profile)
    rate, host = setup.data_parallel.shard_gb_per_s, setup.data_parallel.host_gb_per_s
    assert host == 12.95  # the A100 record's 25.9 GB/s (NDm A100 v4's pinned rate, §575), two GPUs an uplink (§175)
    latency = (8.4 + 7 * 3.4) / 1e3  # NCCL's Simple ring over 8 ranks on NVLink (links.ring_latency_us)

    def wait(numel):  # the reduce-scatter (2 B a gradient), its latency, and three copies of the rank's 1/8 in 2 B
        return 7 / 8 * 2 * numel / (rate * 1e9) * 1e3 + latency + 3 * 2 * numel / 8 / (host * 1e9) * 1e3

    by_hand = sum(max(0.0, wait(numel) - deepspeed_waits.queued_ms(name, gpt_profile, setup))
                  for name, numel in (("query_key_value", 3 * H * H), ("dense_h_to_4h", H * F),
                                      ("dense_4h_to_h", F * H)))
    assert by_hand > 0
    assert deepspeed_waits.offload_waits_ms(_block(gpt_profile), gpt_profile, setup) == pytest.approx(by_hand, rel=1e-12)


def test_once_an_iteration_whatever_the_microbatches(gpt_profile):
    # the blocking fp32 copy runs at the accumulation boundary only (stage3.py 1690-1706 at v0.6.2)
    block = _block(gpt_profile)
    one = deepspeed_waits.offload_waits_ms(block, gpt_profile, _setup(gpt_profile))
    assert deepspeed_waits.offload_waits_ms(block, gpt_profile, _setup(gpt_profile, microbatches=4)) == \
        pytest.approx(one, rel=1e-12)


def test_weights_under_the_bucket_are_not_charged(gpt_profile):
    # at DeepSpeed's default 5e8 every weight of the tiny block shares a bucket: flushed where the sum crosses it
    block = _block(gpt_profile)
    assert deepspeed_waits.offload_waits_ms(block, gpt_profile, _setup(gpt_profile, reduce_bucket_size=500_000_000)) == 0
    # at 4h^2 the MLP's two weights are alone in theirs, query_key_value's 3h^2 is not
    setup, whole = _setup(gpt_profile, reduce_bucket_size=4 * H * H), _setup(gpt_profile)
    mlp = sum(max(0.0, deepspeed_waits.weight_wait_ms(F * H, whole) - deepspeed_waits.queued_ms(name, gpt_profile, whole))
              for name in ("dense_h_to_4h", "dense_4h_to_h"))
    assert deepspeed_waits.offload_waits_ms(block, gpt_profile, setup) == pytest.approx(mlp, rel=1e-12)


def test_the_step_copies_no_gradient_to_the_host(gpt_profile):
    from planner.cost import dataparallel

    block = _block(gpt_profile)
    d2h, _, h2d = dataparallel.offload_phases_ms(block.param_count, _setup(gpt_profile))
    assert d2h == 0.0 and h2d > 0  # copied in the backward's hooks instead
    d2h, _, _ = dataparallel.offload_phases_ms(block.param_count, _setup(gpt_profile, runtime="torchtitan", dp=8))
    assert d2h > 0


def test_nothing_without_the_blocking_copy(gpt_profile):
    block = _block(gpt_profile)
    for setup in (_setup(gpt_profile, offload=False), _setup(gpt_profile, zero=2),
                  _setup(gpt_profile, runtime="torchtitan")):
        assert deepspeed_waits.offload_waits_ms(block, gpt_profile, setup) == 0.0
    embedding = next(layer for layer in layer_costs(gpt_profile) if layer.kind == "embedding")
    assert deepspeed_waits.offload_waits_ms(embedding, gpt_profile, _setup(gpt_profile)) == 0.0
    assert runtimes.facts("deepspeed", "edaa7221").waits_offloaded_grad_copy
    assert not runtimes.facts("deepspeed", "56c52238").waits_offloaded_grad_copy  # BLOOM's fork: not read


def test_the_queued_bytes_are_the_analytic_profiles():
    from planner.profiler import analytic_time

    assert analytic_time.ACT_BYTES["gelu_kernel"][1] == 6 and analytic_time.BIAS_SUM == 2
    assert analytic_time.LAYERNORM_BWD == 6 and analytic_time.ADD == 6
    assert deepspeed_waits.QUEUED_BEHIND["dense_4h_to_h"] == (("activation", 6, "f"), ("elementwise", 2, "f"))


def test_nccls_ctas_slow_no_gemm_beside_the_waited_reduce_scatters(gpt_profile):
    from planner.cost import nccl_sms
    from planner.models.gpu_sms import sm_count

    block, setup, kept = _block(gpt_profile), _setup(gpt_profile), _setup(gpt_profile, offload=False)
    rate = setup.data_parallel.shard_gb_per_s
    waited = sum(7 / 8 * 2 * numel / (rate * 1e9) * 1e3 for numel in (3 * H * H, H * F, F * H))  # one reduction's
    assert deepspeed_waits.waited_reduce_ms(block, gpt_profile, setup) == pytest.approx(waited, rel=1e-12)
    assert deepspeed_waits.waited_reduce_ms(block, gpt_profile, kept) == 0.0
    gpu = dataparallel.profile_gpu(gpt_profile)
    _, share = nccl_sms.layers_shares(gpu, sm_count(gpu), setup, [block])
    # the reductions' window (one microbatch): its CTAs' share of the time they run beside the backward, less the
    # waited weights', which run beside no GEMM
    assert nccl_sms.layer_ms(block, gpt_profile, kept) - nccl_sms.layer_ms(block, gpt_profile, setup) == \
        pytest.approx(waited * share, rel=1e-9)


def test_the_embeddings_copies_after_the_last_backward_by_hand(gpt_profile):
    # §293: the epilogue reduces the last bucket (the word embedding and the positions, made by the backward's last
    # kernels), copies its partition three times and synchronizes: nothing left on the GPU to hide the copies
    embedding = next(layer for layer in layer_costs(gpt_profile) if layer.kind == "embedding")
    assert embedding.param_count == (VOCAB + SEQ) * H
    setup = _setup(gpt_profile)
    assert setup.data_parallel.host_gb_per_s == 12.95
    by_hand = 3 * 2 * (VOCAB + SEQ) * H / 8 / 12.95e9 * 1e3
    assert deepspeed_waits.embedding_copies_ms(embedding, setup) == pytest.approx(by_hand, rel=1e-12)
    assert deepspeed_waits.embedding_copies_ms(embedding, _setup(gpt_profile, microbatches=4)) == \
        pytest.approx(by_hand, rel=1e-12)  # at the accumulation boundary, once an iteration
    assert deepspeed_waits.embedding_copies_ms(_block(gpt_profile), setup) == 0.0  # the blocks: their own waits
    for other in (_setup(gpt_profile, offload=False), _setup(gpt_profile, zero=2),
                  _setup(gpt_profile, runtime="torchtitan")):
        assert deepspeed_waits.embedding_copies_ms(embedding, other) == 0.0


def test_the_embeddings_copies_are_a_term_of_the_split(gpt_profile):
    from planner.cost import terms

    names = [term.name for term in terms.TERMS]
    assert "the offloaded optimizer's copies of the embedding's gradient partitions after the last backward" in names
