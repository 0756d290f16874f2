"""A replayed stage's fit is its replay under the cap with torch's out-of-memory path
(planner/cost/capped_reserve.py): where the uncapped replay passes the cap but the release-and-retry keeps every
request within it, the stage fits and its reserved peak is the capped replay's; where a request fails even then, it
does not and the uncapped figure is reported. cpu has no cap replay (no caching allocator)."""

import json

from fixtures.cli import run

from planner import io
from planner.cost import allocator, capped_reserve, costmodel, reserve, reserve_fsdp2
from planner.cost.allocator import Alloc, Free
from planner.cost.assembly import FIT_MARGIN_BYTES, StageCost
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

MIB = 1 << 20
GIB = 1 << 30
# 20 and 30 MiB segments; the 20 freed and cached; 24 MiB more: 74 MiB reserved without a cap, 54 allocated at most
WHOLE = [Alloc("a", 20 * MIB), Alloc("b", 30 * MIB), Free("a"), Alloc("c", 24 * MIB)]


def _stage(cap_mib: int, peak_mib: int = 54) -> StageCost:
    return StageCost(static_bytes=0, kept_bytes=0, in_flight=0, activation_bytes=0, buffer_bytes=0, transient_bytes=0,
                     peak_bytes=peak_mib * MIB, time_ms=0.0, cap_bytes=cap_mib * MIB, reserved_bytes=0,
                     workspace_bytes=6 * MIB)  # NCCL's buffers beside the allocator


def _under_cap(stage: StageCost) -> StageCost:
    def play(cap_bytes):
        return allocator.replay(WHOLE, cap_bytes=cap_bytes)
    return capped_reserve.under_cap(stage, play(None), play=play,
                                    reserved_of=lambda replayed: reserve.reserved_bytes(replayed, stage.peak_bytes))


def test_the_uncapped_replay_within_the_cap_is_the_reserve():
    got = _under_cap(_stage(90))  # 74 + 6 MiB of NCCL's: within 90
    assert (got.reserved_bytes, got.uncapped_reserved_bytes, got.cap_replay, got.fits) == (74 * MIB, 74 * MIB, "fits", True)


def test_past_the_cap_the_retry_keeps_the_stage_under_it_and_its_reserve_is_the_capped_replays():
    # 74 + 6 > 70: the allocator may reserve 70 - 6 MiB (less the fit margin); the release frees a's segment: 30 + 24
    got = _under_cap(_stage(70))
    assert (got.reserved_bytes, got.uncapped_reserved_bytes, got.cap_replay, got.fits) == \
        (54 * MIB, 74 * MIB, "retried", True)
    assert got.device_need_bytes == 60 * MIB + FIT_MARGIN_BYTES


def test_a_request_that_fails_after_the_release_is_no_fit_and_the_uncapped_reserve_is_reported():
    got = _under_cap(_stage(60))  # 54 + 6 + the margin > 60
    assert (got.reserved_bytes, got.uncapped_reserved_bytes, got.cap_replay, got.fits) == (74 * MIB, 74 * MIB, "oom", False)


def test_the_bytes_the_reserve_holds_past_the_replay_come_off_what_the_allocator_may_reserve():
    # the cost model's allocated peak 4 MiB above the replay's: the reserve is the replay's + 4 MiB, so the allocator
    # may reserve 70 - 6 - 4 MiB (less the margin): 54 fits, 58 reported
    got = _under_cap(_stage(70, peak_mib=58))
    assert (got.reserved_bytes, got.uncapped_reserved_bytes, got.cap_replay) == (58 * MIB, 78 * MIB, "retried")
    got = _under_cap(_stage(64, peak_mib=58))  # 64 - 6 - 4 - margin < 54
    assert (got.reserved_bytes, got.cap_replay, got.fits) == (78 * MIB, "oom", False)


def _cuda_profile():
    base = uniform_blocks(4)
    return base.model_copy(update={"device": base.device.model_copy(update={"type": "cuda"}),
                                   "assumptions": {**base.assumptions, "gpu": "h100"}})


def _titan(cap: int) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[cap], precision="bf16-mixed",
                      runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3)


def test_fsdp2s_replay_under_a_cap_below_its_uncapped_reserve_is_the_capped_replay():
    profile = _cuda_profile()
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    free = costmodel.evaluate(stages, profile, _titan(80 * GIB)).stages[0]
    assert (free.cap_replay, free.uncapped_reserved_bytes) == ("fits", free.reserved_bytes)
    # a cap 2 MiB short of the uncapped reserve and the buffers
    cap = free.reserved_bytes + free.workspace_bytes + FIT_MARGIN_BYTES - 2 * MIB
    tight = costmodel.evaluate(stages, profile, _titan(cap)).stages[0]
    assert tight.uncapped_reserved_bytes == free.reserved_bytes
    setup = _titan(cap)
    stage = reserve_fsdp2.stage_of(stages[0], tight, stage=0, profile=profile, setup=setup)
    capped = reserve_fsdp2.replay(stage, expandable=reserve_fsdp2.expandable_segments(profile, setup),
                                  cap_bytes=cap - tight.workspace_bytes - FIT_MARGIN_BYTES)
    # uniform_blocks(4): the release of the cached segments makes room (1842 MiB uncapped, 1742 under the cap)
    assert capped.oom is None and capped.retries > 0
    assert (tight.cap_replay, tight.reserved_bytes, tight.fits) == \
        ("retried", reserve_fsdp2.reserved_bytes(capped, tight.peak_bytes), True)
    assert tight.reserved_bytes < free.reserved_bytes


def test_cpu_has_no_cap_replay_and_its_verdict_is_the_peaks(tmp_path):
    profile = uniform_blocks(4)
    path = tmp_path / "cpu.json"
    io.save_profile(profile, path)
    args = ["evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
            "--microbatches", "1", "--json"]
    for mem in ("80GB", "1MB"):
        out = run(*args, "--mem", mem)
        stage = json.loads(out.stdout)["hand"]["stages"][0]
        assert (stage["cap_replay"], stage["uncapped_reserved_bytes"], stage["reserved_bytes"]) == (None, None, None)
        assert stage["fits"] == (stage["peak_bytes"] + FIT_MARGIN_BYTES <= stage["cap_bytes"]) == (mem == "80GB")


def test_the_harness_fit_column_says_where_the_retry_or_an_out_of_memory_decided():
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("table", ROOT / "scripts" / "published_rows_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    stage = {"peak_bytes": 50 * GIB, "reserved_bytes": 60 * GIB, "workspace_bytes": 2 * GIB, "cap_bytes": 64 * GIB,
             "fits": True, "cap_replay": "retried", "uncapped_reserved_bytes": 66 * GIB}
    assert table.fits_text({"stages": [stage]}) == "yes, retried (50.0 / 60.0 (uncapped 66.0) + 2.0 of 64.0)"
    oom = stage | {"reserved_bytes": 66 * GIB, "fits": False, "cap_replay": "oom"}
    assert table.fits_text({"stages": [oom]}) == "**no**, OOM (50.0 / 66.0 + 2.0 of 64.0)"
    assert table.fits_text({"stages": [stage | {"cap_replay": "fits"}]}) == "yes (50.0 / 60.0 + 2.0 of 64.0)"
