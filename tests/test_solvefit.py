"""solve judges fit by the allocator replay, both ways (planner/solve/replayfit.py, docs/published-runs.md
§37.solvefit): where the replay reserves less than the divisor's row assumes, the plan evaluate() admits is
found (before, the rows refused every plan); where it reserves more, no plan the replay puts over is returned,
and the cap solve names is the replay's need, under which it plans."""

from __future__ import annotations

import json
import re

from fixtures.cli import run, run_ok
from fixtures.tiny4 import tiny4_profile

from planner import io
from planner.cost import costmodel
from planner.schema import AllocRecord, DeviceInfo, TrainSetup
from planner.solve import bounds, replayfit, search

MIB = 1 << 20
# Four blocks whose parameters are one fp32 tensor of 10 MiB (2,621,440 parameters): weights, gradients and Adam's
# two states are 16 segments of exactly 10 MiB (>= 10 MiB: a segment of the request rounded to 2 MiB, no tail);
# Adam's scratch four more. Their activations are 2 MiB a block: the step sets the peak under every option.
EXACT = 10 * MIB
# the other way: copies of 10 MiB + 512 B, each a 12 MiB segment whose 2 MiB tail nothing later fits
# (tests/test_review_solve_rounds.py's parameter): the replay reserves about 1.26x the allocated peak
TAILED = 10 * MIB + 512


def _profile(tmp_path, param_bytes: int, act_mib: int = 2):
    """Four blocks keeping `act_mib` each; at 2 MiB the step sets the peak under every option."""
    record = AllocRecord(forward=[2 * MIB, 1 * MIB, -2], backward=[1 * MIB, -1], output=1, input_grad=3,
                         params=[param_bytes])
    if act_mib != 2:  # tests/test_review_solve_rounds.py's record
        record = AllocRecord(forward=[30 * MIB, 4 * MIB, -2, 1 * MIB], backward=[1 * MIB, -1], output=3, input_grad=4,
                             params=[param_bytes])
    return tiny4_profile(tmp_path, record, act_mib=act_mib, param_count=param_bytes // 4)


def _setup(cap_mib: int, **extra) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=2, micro_batch_size=1, mem_caps_bytes=[cap_mib * MIB], **extra)


def _stage(profile, setup, checkpointed):
    return costmodel.evaluate(costmodel.split_to_stages([0], checkpointed, profile), profile, setup).stages[0]


def test_solve_finds_the_plan_the_replay_admits_where_the_divisor_row_refuses_every_plan(tmp_path):
    path, profile = _profile(tmp_path, EXACT)
    setup = _setup(220)
    # by hand: static 4 x 2,621,440 x 16 B = 167,772,160; Adam's scratch one fp32 copy, 41,943,040: the step's peak
    # 209,715,200, under every option. The row at 220 MiB: 110 segments of 2 MiB x 0.85 = 196,083,712 < peak + 4 KiB
    for checkpointed in ([False] * 4, [True] * 4):
        stage = _stage(profile, setup, checkpointed)
        assert stage.peak_bytes == 167_772_160 + 41_943_040 == 209_715_200
        assert stage.limit_bytes == 196_083_712 and not stage.fits_allocated
        # the replay reserves its 20 segments of 10 MiB and the activations' few: within 220 MiB with the margin
        assert (stage.reserved_by, stage.fits) == ("replay", True)
        assert stage.peak_bytes <= stage.reserved_bytes <= 220 * MIB - 4096
    out = tmp_path / "plan.yaml"
    summary = json.loads(run_ok("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem", "220MiB",
                                "--solver", "dp", "--out", out, "--json").stdout)
    # the fastest plan of all, no recompute (4 blocks x 10 ms forward + 20 ms backward, 2 microbatches), as
    # evaluate scores it: it fits by the replay, and the rows that admit every such plan gave it: "optimal"
    assert (summary["status"], summary["replay"], summary["iteration_ms"]) == ("optimal", "relaxed", 240.0)
    stage = summary["stages"][0]
    assert stage["checkpointed"] == [] and (stage["fits"], stage["reserved_by"]) == (True, "replay")
    plan = io.load_plan(out)
    assert _stage(profile, setup, [False] * 4).fits and plan.solver.replay == "relaxed"
    told = run_ok("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem", "220MiB",
                  "--solver", "dp", "--out", out).output
    assert "holds against the replay" in " ".join(told.split())


def test_solve_finds_a_faster_plan_the_replay_admits_than_the_rows_as_given(tmp_path):
    """Blocks keeping 40 MiB each: the fewer recomputed, the higher the peak. At 310 MiB the row (155 segments x
    2 MiB x 0.85 = 276,299,776 B) admits two blocks recomputed (280 ms), not one (260 ms); the replay admits one."""
    path, profile = _profile(tmp_path, EXACT, act_mib=40)
    setup = _setup(310)
    one, two = _stage(profile, setup, [True, False, False, False]), _stage(profile, setup, [True, True, False, False])
    assert one.limit_bytes == 155 * 2 * MIB * 85 // 100 == 276_299_776
    assert (one.fits_allocated, one.fits, two.fits_allocated, two.fits) == (False, True, True, True)
    assert not _stage(profile, setup, [False] * 4).fits  # none recomputed: over by the replay too
    summary = json.loads(run_ok("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem", "310MiB",
                                "--solver", "dp", "--out", tmp_path / "plan.yaml", "--json").stdout)
    assert summary["iteration_ms"] == 260.0 and summary["stages"][0]["checkpointed"] == ["blocks.0"]
    assert summary["stages"][0]["fits"] and summary["replay"] in ("relaxed", "searched")


def test_relaxed_caps_admit_the_cap_less_the_buffers_and_only_where_a_replay_judges(tmp_path):
    _, profile = _profile(tmp_path, EXACT)
    setup = _setup(220)
    # one rank, no NCCL buffers: ceil(220 MiB / 0.85 / 2 MiB) = 130 segments, one more against the float product
    assert replayfit.relaxed_caps(profile, setup) == [131 * 2 * MIB]
    relaxed = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": [131 * 2 * MIB]})})
    assert costmodel.limit_bytes(0, costmodel.Context(profile, relaxed)) >= 220 * MIB
    # the whole-job search's memory bound reads the same rows: 131 segments x 0.85, whatever the cuBLAS workspaces
    assert bounds.setup_bounds(profile, setup).limit_bytes == int(131 * 2 * MIB * 0.85)
    assert replayfit.relaxed_caps(profile, _setup(220, fragmentation=0.15)) is None  # the divisor stated: its rows
    cpu = profile.model_copy(update={"device": DeviceInfo(type="cpu", name="cpu")})
    assert replayfit.relaxed_caps(cpu, setup) is None


def test_no_plan_the_replay_puts_over_and_the_cap_named_is_the_replays_need(tmp_path):
    path, profile = _profile(tmp_path, TAILED)
    setup = _setup(250)
    # the other way: the row admits every plan (peak 209,725,440 + 4 KiB within 125 segments x 2 MiB x 0.85), the
    # replay (12 MiB segments) none, even after torch's release-and-retry
    for checkpointed in ([False] * 4, [True] * 4):
        stage = _stage(profile, setup, checkpointed)
        assert stage.peak_bytes == 209_725_440 and stage.fits_allocated
        assert (stage.reserved_by, stage.cap_replay, stage.fits) == ("replay", "oom", False)
        assert stage.reserved_bytes > 250 * MIB
    assert isinstance(search.plan(profile, setup, solver="dp"), search.NoFit)
    refused = run("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem", "250MiB",
                  "--solver", "dp", "--out", tmp_path / "plan.yaml")
    assert refused.exit_code != 0
    found = re.search(r"the smallest cap that works with 1 stages is ([0-9.]+) MiB", " ".join(refused.output.split()))
    assert found, refused.output
    need = _stage(profile, setup, [False] * 4).device_need_bytes  # the replay's reserve, the margin
    assert need / MIB <= float(found.group(1)) < need / MIB + 1
    summary = json.loads(run_ok("solve", "--profile", path, "--stages", "1", "--microbatches", "2", "--mem",
                                f"{found.group(1)}MiB", "--solver", "dp", "--out", tmp_path / "plan.yaml",
                                "--json").stdout)
    assert summary["stages"][0]["fits"] and summary["stages"][0]["reserved_by"] == "replay"


def test_the_sweep_calls_a_point_the_cuts_proved_optimal(tmp_path):
    """`solve --sweep`'s last two caps on the 40 MiB blocks (up to --mem 400MiB): at 317 MiB the relaxed rows
    refuse no recompute (320 MiB + 4 KiB allocated) and their plan, one block recomputed, fits: "optimal"; at
    336 MiB they admit no recompute, whose replay (338 MiB) is over: the lazy cuts exclude it and the DP's next
    plan, the same 260 ms, fits: "optimal" too (planner/solve/replaycuts.py; the search over caps, before them,
    gave it as "searched")."""
    from planner.commands.sweep import sweep_points

    _, profile = _profile(tmp_path, EXACT, act_mib=40)
    rows, statuses = sweep_points(profile, _setup(400), time_limit_s=60)
    assert [row["cap_bytes"] >> 20 for row in rows[-2:]] == [317, 336]
    assert [row["ckplan"] for row in rows[-2:]] == [260.0, 260.0] and statuses[-2:] == ["optimal", "optimal"]
