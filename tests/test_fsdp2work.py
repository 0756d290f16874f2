"""FSDP2's copies around its collectives (planner/cost/fsdp2work.py) and torchtitan's step beside the
optimizer (its record's step_shard_bytes), counted by hand on 1,000 parameters.

torchtitan under bf16-mixed: an fp32 shard (S 4), bf16 gathered weights and gradients (w 2), fp32
reduce dtype (g 4). Per all-gather over K ranks: cast (S + w) / K, copy-in 2 w / K, copy-out 2 w;
per reduce-scatter: the copy-in read w, written g.
"""

from __future__ import annotations

import pytest

from planner.cost import fsdp2work, runtimes
from planner.cost.layers import LayerCost
from planner.cost.terms import Context, layer_value
from planner.schema import DeviceInfo, Profile, TrainSetup

P = 1000


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="torchtitan", dp=4, zero=3)
    return TrainSetup(**(base | fields))


def test_zero3_per_microbatch_gathers_twice_and_reduces_once_a_microbatch():
    gather = P * (4 + 2) / 4 + 2 * P * 2 / 4 + 2 * P * 2  # 1,500 + 1,000 + 4,000
    reduce = P * (2 + 4)
    added = P * 3 * 4 / 4  # the second microbatch's reduced shard added into .grad
    assert fsdp2work.fsdp2_copy_bytes(P, setup()) == 4 * gather + 2 * reduce + added == 41_000


def test_kept_whole_beside_a_pipeline_gathers_once_and_accumulates_the_unsharded_gradient_in_fp32():
    s = setup(stages=2, microbatches=4, zero_gather="per-iteration", mem_caps_bytes=[2**50] * 2)
    gather = P * (4 + 2) / 4 + 2 * P * 2 / 4 + 2 * P * 2
    accumulate = P * (2 + 4) + 3 * P * (2 + 4 + 4)  # the first upcast, then three adds
    assert fsdp2work.fsdp2_copy_bytes(P, s) == gather + accumulate + P * (4 + 4) == 50_500


def test_float8_weights_are_gathered_in_one_byte_without_fsdp2s_cast():
    s = setup(microbatches=1, float8=True, fp8_all_gather=True)
    gathered = 400 * 2 + 600 * 1
    gather = 400 * (4 + 2) / 4 + 2 * gathered / 4 + 2 * gathered
    assert fsdp2work.fsdp2_copy_bytes(P, s, fp8_count=600) == 2 * gather + P * (2 + 4)


@pytest.mark.parametrize("fields", [dict(runtime="megatron"), dict(runtime="ckplan"), dict(dp=1), dict(zero=0)])
def test_nothing_where_fsdp2_does_not_shard(fields):
    assert fsdp2work.fsdp2_copy_bytes(P, setup(**fields)) == 0.0


def test_the_copies_at_the_hbm_bandwidth_less_the_profiles_grad_accumulation_and_nothing_without_one():
    # the profile's backward added each gradient into .grad (3 x 2 B a parameter, each of 2 microbatches):
    # FSDP2's .grad is None at every backward, so that kernel never runs
    unrun = 2 * 3 * 2 * P
    assert fsdp2work.unrun_accumulate_bytes(P, setup()) == unrun
    assert fsdp2work.fsdp2_copies_ms(P, setup(), 2.0) == pytest.approx((41_000 - unrun) / 2e12 * 1e3)
    assert fsdp2work.fsdp2_copies_ms(P, setup(), None) == 0.0
    assert fsdp2work.unrun_accumulate_bytes(P, setup(runtime="megatron")) == 0.0


def test_torchtitans_step_reads_clipping_and_at_9dec370_foreach_adamw_beyond_the_fused_step():
    # clipping: _foreach_norm reads the fp32 gradient (4), _foreach_mul_ reads and writes it (8);
    # foreach AdamW moves 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 = 80 B where the fused kernel moves 28
    assert runtimes.facts("torchtitan", "9dec370").step_shard_bytes == 12 + (80 - 28)
    assert runtimes.facts("torchtitan", "bbb1b616").step_shard_bytes == 12
    assert runtimes.facts("torchtitan").step_shard_bytes == 12


def test_the_step_rows_charge_the_copies_of_a_torchtitan_layer_beside_its_step_and_checks():
    from planner.cost.rules import layer_step_ms, step_checks_ms

    layer = LayerCost(name="l", kind="block", fwd_ms=1.0, bwd_ms=2.0, act_bytes=0, input_bytes=0, output_bytes=0,
                      input_in_act_bytes=0, param_count=P, transient_bytes=0, step_ms=(("adam", 0.5),))
    # a middle layer of four: FSDP2's first unit and the layer after it are test_the_root_unit_...'s
    middle = [LayerCost(name=n, kind="block", fwd_ms=1.0, bwd_ms=2.0, act_bytes=0, input_bytes=0, output_bytes=0,
                        input_in_act_bytes=0, param_count=P, transient_bytes=0) for n in ("a", "b", "l", "c")]
    profile = Profile.model_construct(device=DeviceInfo(type="cuda", name="h100"), assumptions={"gpu_hbm_tbps": 2.0},
                                      layers=middle)
    for s, copies in ((setup(), 41_000 - 12_000), (setup(runtime="megatron"), 0)):
        others = layer_step_ms(layer, s) + step_checks_ms(layer, profile, s)
        assert layer_value("step", layer, 0, Context(profile, s)) == pytest.approx(others + copies / 2e12 * 1e3)


# FSDP2's first unit and the layer after it (fsdp2work.edge_units_exposed_ms), on a four-layer model:
# embedding and head 1e9 parameters each, two blocks of 0.5e9; forward 1, 40, 40, 30 ms, backward twice
# that. Over 4 ranks at 100 GB/s one all-gather moves 3/4 of the bf16 weights, one reduce-scatter 3/4
# of the fp32 gradients: the embedding or head 15 and 30 ms, a block 7.5 and 15 ms.
def _four_layers():
    from planner.models.synthetic import layer, profile_of

    return profile_of([layer("embed", "Embedding", fwd_ms=1.0, act_mib=0, input_mib=0, param_count=10**9),
                       layer("blocks.0", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                       layer("blocks.1", "Block", fwd_ms=40.0, act_mib=0, input_mib=0, param_count=5 * 10**8),
                       layer("head", "Head", fwd_ms=30.0, act_mib=0, input_mib=0, param_count=10**9)],
                      name="edge_units")


def _edges(s: TrainSetup) -> list[float]:
    from planner.cost.layers import layer_costs

    p = _four_layers()
    return [fsdp2work.edge_units_exposed_ms(x, p, s) for x in layer_costs(p)]


LINKS = dict(shard_gb_per_s=100.0, replica_gb_per_s=100.0)
# and each exposed collective NCCL's ring latency over 4 ranks of one node, 8.4 + 3 x 3.4 = 18.6 µs (links.py
# ring_latency_us): the root unit's gather and reduction, block 0's gather and reduction, 4 x 0.0186 ms
LAT = 4 * 0.0186


def test_the_root_unit_is_gathered_and_reduced_exposed_and_the_first_block_hides_behind_the_embedding_alone():
    s = setup(microbatches=1, runtime_version="9dec370", **LINKS)
    # charged before: the embedding's two gathers less its forward and backward, and its reduction
    # less its backward, (15 - 1) + (15 - 2) + (30 - 2) = 55; every other layer hidden by its own
    # compute (0). FSDP2 at 9dec370 (the root holds embedding, norm and head, never resharded after
    # forward): the root gathered once before any compute and reduced after the last backward,
    # whole: embedding 15 + 30 = 45, head 45; block 0 gathers behind the root and reduces before
    # it, hidden only by the embedding: (7.5 - 1) + (15 - 2) = 19.5, charged on the embedding (the blocks
    # stay alike)
    assert _edges(s) == pytest.approx([45 - 55 + 19.5 + LAT, 0.0, 0.0, 45.0])


def test_per_layer_units_expose_the_embedding_and_hide_the_head_as_every_other_unit():
    # 2c8b5947, b5bcd76c: [norm, output] its own unit, gathered behind the last block's forward
    for version in ("2c8b5947", "b5bcd76c"):
        assert _edges(setup(microbatches=1, runtime_version=version, **LINKS)) == pytest.approx([45 - 55 + 19.5 + LAT, 0, 0, 0])


def test_each_microbatch_exposes_the_first_units_collectives():
    # two microbatches, each gathering and reducing the root (45 each); charged before per microbatch
    # (15 - 1) + (15 + 30 - 2) for the embedding: 2 x 57; block 0 unchanged before (hidden), after
    # 2 x 19.5
    assert _edges(setup(microbatches=2, runtime_version="9dec370", **LINKS)) == pytest.approx(
        [2 * 45 - 2 * 57 + 39.0 + 2 * LAT, 0.0, 0.0, 90.0])


@pytest.mark.parametrize("fields", [dict(runtime="ckplan", runtime_version=None), dict(runtime="megatron", runtime_version=None),
                                    dict(dp=1), dict(zero=2),
                                    dict(stages=2, microbatches=4, zero_gather="per-iteration",
                                         mem_caps_bytes=[2**50] * 2)])
def test_nothing_moves_where_units_are_not_read_or_weights_stay_whole(fields):
    assert _edges(setup(**({"microbatches": 1, "runtime_version": "9dec370", **LINKS} | fields))) == [0.0] * 4
