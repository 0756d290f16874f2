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
    profile = Profile.model_construct(device=DeviceInfo(type="cuda", name="h100"), assumptions={"gpu_hbm_tbps": 2.0})
    for s, copies in ((setup(), 41_000 - 12_000), (setup(runtime="megatron"), 0)):
        others = layer_step_ms(layer, s) + step_checks_ms(layer, profile, s)
        assert layer_value("step", layer, 0, Context(profile, s)) == pytest.approx(others + copies / 2e12 * 1e3)
