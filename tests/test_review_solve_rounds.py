"""`ckplan solve`'s lowered-cap rounds end to end (planner/solve/search.py plan -> _within_replay): the solvers'
row admits a plan whose allocator replay fails under the cap even after torch's release-and-retry
(planner/cost/capped_reserve.py: "oom"); the search solves again under lowered caps and writes a plan that
the replay under the caps as given admits ("retried")."""

import json

from fixtures.cli import run_ok
from fixtures.tiny4 import tiny4_profile

from planner import io
from planner.cost import costmodel
from planner.schema import AllocRecord, TrainSetup

MIB = 1 << 20
BLOCK_PARAMS = 10_000_000  # fp32 + Adam: 16 B a parameter, 160,000,000 B of static a block
BLOCK_KEPT = 40 * MIB  # what a block keeps for its backward when it does not recompute
# Each parameter copy (weights, gradients, Adam's two states) in copies of 10 MiB + 512 B: a segment of its own
# (>= 10 MiB, kMinLargeAlloc) rounded up to 12 MiB, whose 2 MiB tail no later request of the step fits, and
# which no release frees while the copy lives: the replay reserves about 1.2x the static bytes, past the
# divisor's 1 / 0.85 that the solvers' row assumes.
RECORD = AllocRecord(forward=[30 * MIB, 4 * MIB, -2, 1 * MIB], backward=[1 * MIB, -1], output=3, input_grad=4,
                     params=[10 * MIB + 512])
# By hand: static 4 x 160,000,000 = 640,000,000 B; Adam's step scratch 160,000,000 B (static + step: 800,000,000);
# no recompute keeps 4 x 40 MiB = 167,772,160: peak 807,772,160. The row (assembly.limit_bytes, no NCCL buffers on
# one rank): floor(cap / 2 MiB) x 2 MiB x 0.85 >= peak + 4096 B (FIT_MARGIN_BYTES) first holds at 908 MiB
# (907 MiB rounds down to 906 MiB, and 906 MiB x 0.85 = 807,504,281 < 807,776,256).
# At 910 MiB the row admits no recompute at all, the fastest plan (4 x 60 ms); its replay fails under the cap.
CAP_MIB = 910


def _profile_path(tmp_path):
    return tiny4_profile(tmp_path, RECORD, act_mib=BLOCK_KEPT / MIB, param_count=BLOCK_PARAMS)


def test_a_first_round_plan_the_capped_replay_fails_gives_way_to_a_lowered_rounds_plan_that_fits(tmp_path):
    path, profile = _profile_path(tmp_path)
    setup = TrainSetup(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[CAP_MIB * MIB])
    # the first round's answer, by hand: no recompute, within the row, over the cap by the replay even after the retry
    first = costmodel.evaluate(costmodel.split_to_stages([0], [False] * 4, profile), profile, setup).stages[0]
    assert first.peak_bytes == 640_000_000 + 4 * BLOCK_KEPT == 807_772_160
    assert first.fits_allocated and first.limit_bytes == 455 * 2 * MIB * 85 // 100
    assert (first.cap_replay, first.fits) == ("oom", False)

    out = tmp_path / "plan.yaml"
    result = run_ok("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem", f"{CAP_MIB}MiB",
                    "--solver", "dp", "--out", out, "--json")
    summary = json.loads(result.stdout)
    stage = summary["stages"][0]
    # a lowered round's plan: one block recomputed (the first: each is alike, the DP takes the first), 20 ms more
    # (its forward again, 10 ms a microbatch); its peak is the Adam step's, 640,000,000 + 160,000,000
    assert stage["checkpointed"] == ["blocks.0"] and stage["recompute"] == {"blocks.0": "full"}
    assert summary["iteration_ms"] == 260.0
    assert stage["peak_bytes"] == 800_000_000
    # without a cap its replay passes the cap too; under it torch's release-and-retry keeps every request within
    assert (stage["cap_replay"], stage["fits"], stage["reserved_by"]) == ("retried", True, "replay")
    assert stage["uncapped_reserved_bytes"] > CAP_MIB * MIB >= stage["reserved_bytes"] + 4096
    # the baselines: only full recompute fits (320 ms), so without the lowered rounds the answer would be it
    assert [(b["name"], b["feasible"]) for b in summary["baselines"] if b["feasible"]] == [("full-ckpt", True)]
    plan = io.load_plan(out)
    assert [written.option(name) for written in plan.stages for name in written.layers] == ["full", "none", "none",
                                                                                            "none"]
