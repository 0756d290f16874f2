"""float8_profile in two parts (planner/cost/float8.py): runtime_profile reads the training settings alone, so the
search makes it once a profile and applies the Float8 records once a shard group on it (jobsearch.Profiles.
for_setup; B4's 405B profile copied its 126 blocks' records once a shard group before, §44.searchbb). Every profile
the search applies is byte-equal to float8_profile's for its own setup."""

from __future__ import annotations

import pytest
from test_search import MINI, GiB, profile_for

from planner.cost import dataparallel
from planner.cost.float8 import float8_profile
from planner.solve import jobsearch
from planner.solve.degrees import Degrees


@pytest.mark.parametrize("runtime, training", [
    ("megatron", {"float8": True}),  # TE's weight cast once a step, times the shard group
    ("torchtitan", {"float8": True, "fp8_all_gather": True}),  # the float8 all-gather where FSDP shards
    ("megatron", {}),  # no Float8: the runtime's part alone
])
def test_the_search_applies_each_shard_group_byte_equal_to_float8_profile(runtime, training):
    written = profile_for(MINI)(1, False, 1)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8, runtime=runtime, training=training)
    profiles, made, sizes = jobsearch.Profiles(lambda *a, **k: written), [], set()
    layers = profiles.get(1, False, 1)[1]
    for shard_group in (None, 2, 4):
        setup = jobsearch.job_setup(written, Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=2,
                                                     schedule="1F1B", chunks=1, zero=3, shard_group=shard_group),
                                    options)
        sizes.add(dataparallel.shard_size(setup))
        applied, _ = profiles.for_setup(written, layers, setup)
        assert applied.model_dump_json() == float8_profile(written, setup).model_dump_json()
        made.append(applied)
    # the runtime's part made once for the three setups; the records applied once a shard size (three here);
    # without Float8 the runtime's profile serves all three
    assert len(profiles._runtime) == 1 and len(sizes) == 3
    assert len({id(p) for p in made}) == (3 if training else 1)


def test_te_fp8_weights_under_zero_1_and_megatron_fsdp_of_one_shard_size_are_applied_apart():
    # TE's FP8 weights cast from the master shard (float8.te_primary_weights) under the distributed optimizer and
    # under Megatron-FSDP, whose transposes differ (once a step, every pass on Hopper): ZeRO 1 and Megatron-FSDP's
    # ZeRO 3 over the same 8 ranks are two applications, each float8_profile's
    from planner.cost.float8 import te_primary_weights

    written = profile_for(MINI)(1, False, 1)
    training = {"float8": True, "fp8_all_gather": True, "fp8_current_scaling": True}
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8, runtime="megatron", training=training)
    profiles = jobsearch.Profiles(lambda *a, **k: written)
    layers = profiles.get(1, False, 1)[1]
    seen = []
    for zero in (1, 3):
        setup = jobsearch.job_setup(written, Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=2,
                                                     schedule="1F1B", chunks=1, zero=zero), options)
        assert dataparallel.shard_size(setup) == 8
        applied, _ = profiles.for_setup(written, layers, setup)
        assert applied.model_dump_json() == float8_profile(written, setup).model_dump_json()
        seen.append(te_primary_weights(setup))
    assert seen == ["zero1", "megatron-fsdp"]
