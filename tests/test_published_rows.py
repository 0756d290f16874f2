"""The published-runs harness (scripts/published_rows.py): its rows table parses, every row's arguments are
ones `ckplan evaluate` (and each profile's `ckplan profile`) accepts, every row names its published figures
and a source, and the tables it prints say the right ratios and verdicts on hand-made results."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from fixtures.scripts import load_script

rows_mod = load_script("published_rows")
table_mod = load_script("published_rows_table")
GIB = 2**30


@pytest.fixture(scope="module")
def table():
    return rows_mod.load_table()


def test_the_table_holds_every_scored_row_of_section_18(table):
    main = [r for r in table.rows if r.group == "main"]
    # every row §18 scores on time, §21.newrows' 16, §33.ubmem's G10, §35.newrows' G11-G18, §37.newrows' G19-G42,
    # §37.fp8delayed's G43, P1-P12 (llm-foundry's MPT tables, time only), N1 and §45.newrows63's G44-G57
    assert len(main) == 112
    assert sum(r.memory_bytes is not None for r in main) == 89  # and on memory (§21.newrows: F1, F2, G1-G9; G10-G57; N1)
    assert [r.id for r in main if r.id[0] in "AFG"] == ["F1", "F2"] + [f"A{i}" for i in range(1, 6)] + \
        [f"G{i}" for i in range(1, 58)]
    assert [r.id for r in main if r.id[0] in "NP"] == [f"P{i}" for i in range(1, 13)] + ["N1"]
    # §23.moerows' MoE rows, §23.dsv3rows' DeepSeek-V3, §35.newrows' two 26.02 rows, §45.newrows63's three
    assert [r.label for r in table.rows if r.group == "bridge"] == ["T22", "T23", "B1", "B2", "B3", "B4", "B5", "B6",
                                                                    "E1", "E2", "E3", "E4", "E5", "D1", "B7", "B8",
                                                                    "E6", "E7", "E8"]
    assert [r.id for r in main if r.id.startswith("C")] == [f"C{i}" for i in range(1, 9)]


def test_every_row_names_a_source_and_its_published_figures(table):
    for row in table.rows:
        assert row.source.strip() and "{" not in row.source, row.id
        assert row.time_s > 0, row.id
        assert (row.memory_bytes is None) == (row.memory_kind is None), row.id
    by_id = {row.id: row for row in table.rows}
    assert by_id["M19"].memory_kind == "allocated" and by_id["M8"].memory_kind == "reserved"
    assert by_id["T15"].static_bytes == 24_808_996_864 and by_id["T15"].label == "M1/T15"
    assert by_id["B2"].time_s == pytest.approx(128 * 8192 / (64 * 1602))  # tokens/s/GPU turned into seconds
    assert by_id["B7"].time_s == pytest.approx(256 * 8192 / (64 * 1621))  # 26.02: B2's recipe at GBS 256
    assert by_id["A4"].time_s == pytest.approx(16 * 32 * 8192 / (256 * 809.8))  # local batch 16 x FSDP 32
    assert by_id["F1"].time_s == pytest.approx(8192 / 7689.5)  # batch 1 a GPU
    assert (by_id["G1"].static_bytes, by_id["G1"].memory_bytes) == (688_128_512, 2_415_566_336)
    assert (by_id["G10"].static_bytes, by_id["G10"].memory_bytes) == (476_258_816, 883_747_328)  # rank 7's, §158
    assert (by_id["G43"].static_bytes, by_id["G43"].memory_bytes) == (302_059_008, 428_052_992)  # delayed scaling
    assert (by_id["G15"].static_bytes, by_id["G15"].memory_bytes) == (1_259_751_936, 2_561_334_272)  # §35.newrows
    # §37.newrows: G11's test on GB200 (93ebf8d7) and on A100 (adc69dba, its own config)
    assert (by_id["G19"].static_bytes, by_id["G19"].memory_bytes) == (762_837_504, 2_235_816_960)
    assert (by_id["G26"].static_bytes, by_id["G26"].memory_bytes) == (717_288_960, 2_194_839_040)
    assert "configs/megatron-lm/a100/" in " ".join(by_id["G26"].args)
    assert (by_id["G40"].static_bytes, by_id["G40"].memory_bytes) == (465_773_056, 876_407_296)  # G10's test on GB200
    assert by_id["P3"].time_s == pytest.approx(504 * 2048 / (8 * 2002))  # GBS 504 x 2048 over 8 H100s
    assert by_id["P7"].time_s == pytest.approx(16 * 65536 / (8 * 1956))  # MPT-7B at 65,536 tokens
    assert by_id["N1"].time_s == pytest.approx(32 * 2048 / 21919) and by_id["N1"].memory_kind == "reserved"
    # §45.newrows63: a resume test's step-50 static and steps 2-50's peak; G49's static once Adam's state exists
    assert (by_id["G44"].static_bytes, by_id["G44"].memory_bytes) == (517_243_392, 1_427_384_832)
    assert by_id["G49"].static_bytes == 417_037_824
    assert (by_id["G54"].static_bytes, by_id["G54"].memory_bytes) == (466_256_384, 1_789_536_768)  # G48's test, GB200
    assert "--gpu gb200" in " ".join(by_id["G54"].args) and "--nvlink-domain" in by_id["G54"].args
    assert by_id["E6"].time_s == pytest.approx(1280 * 4096 / (64 * 5993))  # 26.02: E4's recipe at GBS 1280
    assert by_id["E8"].time_s == pytest.approx(1280 * 4096 / (64 * 15784))  # the GB200 V2 preset at seq 4096


def test_every_rows_arguments_are_accepted_by_ckplan_evaluate(table):
    from planner.cli import cli

    evaluate, profile = cli.commands["evaluate"], cli.commands["profile"]
    for row in table.rows:
        args = row.args + (["--profile", str(rows_mod.TABLE)] if row.profile else [])
        ctx = evaluate.make_context("evaluate", args)  # raises on an unknown option or a bad value
        assert ctx.params["from_megatron"] is not None or ctx.params["layers_per_stage"], row.id
        for given in (row.args[row.args.index(flag) + 1] for flag in ("--from-megatron",) if flag in row.args):
            assert (ROOT / given).is_file(), f"{row.id} reads {given}, not in the repository"
    for name, args in table.profiles.items():
        profile.make_context("profile", [*args, "--out", "x.json"])
        for given in args:
            if given.endswith((".json", ".yaml")):
                assert (ROOT / given).is_file(), f"profile {name} reads {given}, not in the repository"


def test_macros_expand_and_a_missing_one_is_one_sentence():
    macros = {"A": "--x {B}", "B": "{blocks:3}", "LOOP": "{LOOP}"}
    assert rows_mod.expand("{A} --y", macros, "t") == "--x layers.0,layers.1,layers.2 --y"
    with pytest.raises(rows_mod.HarnessError, match="does not define"):
        rows_mod.expand("{C}", macros, "t")
    with pytest.raises(rows_mod.HarnessError, match="loop"):
        rows_mod.expand("{LOOP}", macros, "t")


def test_a_row_without_a_published_time_or_source_is_refused(tmp_path):
    path = tmp_path / "rows.toml"
    path.write_text('[[row]]\nid = "Z1"\nsource = "s"\nargs = "--dp 8"\n')
    with pytest.raises(rows_mod.HarnessError, match="names no published time"):
        rows_mod.load_table(path)
    path.write_text('[[row]]\nid = "Z1"\ntime_s = 1.0\nargs = "--dp 8"\n')
    with pytest.raises(rows_mod.HarnessError, match="gives no source"):
        rows_mod.load_table(path)
    path.write_text('[[row]]\nid = "Z1"\nsource = "s"\ntime_s = 1.0\nargs = "--dp 8"\nmemory_gib = 80\n')
    with pytest.raises(rows_mod.HarnessError, match="needs memory_kind"):
        rows_mod.load_table(path)


def test_only_picks_ids_before_labels(table):
    assert [r.id for r in table.select("T22")] == ["T22"]  # the hand row, not the Bridge recipe labelled T22
    assert [r.id for r in table.select("BT22,M1")] == ["T15", "BT22"]
    with pytest.raises(rows_mod.HarnessError, match="not a row"):
        table.select("Q9")


def test_a_profile_made_by_this_tree_is_kept(tmp_path, monkeypatch, table):
    name = "l8_mbs2_96"
    (tmp_path / f"{name}.json").write_text("{}")
    stamp = rows_mod._stamp(table.profiles[name], rows_mod.tree_id())
    (tmp_path / f"{name}.stamp.json").write_text(json.dumps(stamp))

    def never(*args, **kwargs):
        raise AssertionError("a kept profile was made again")

    monkeypatch.setattr(rows_mod.subprocess, "run", never)
    rows_mod.make_profiles(table, table.select("M8,M9"), tmp_path, remake=False, jobs=1)


def _stage(peak_gib: float, reserved_gib: float, *, after_step_gib: float = 0.0, fits: bool = True,
           cap_gib: float = 80.0) -> dict:
    return {"peak_bytes": int(peak_gib * GIB), "reserved_bytes": int(reserved_gib * GIB),
            "after_step_bytes": int(after_step_gib * GIB), "cap_bytes": int(cap_gib * GIB), "fits": fits}


def _write(folder, results: dict) -> None:
    folder.mkdir()
    for row_id, (iteration_s, stages, args) in results.items():
        (folder / f"{row_id}.json").write_text(json.dumps({"id": row_id, "iteration_s": iteration_s,
                                                           "stages": stages, "args": args}))


def _row(**fields):
    base = dict(label=fields["id"], group="main", source="s", memory_bytes=None, memory_kind=None,
                static_bytes=None, profile=None, args=[])
    return rows_mod.Row(**{**base, **fields})


def test_the_tables_ratios_and_verdicts_on_two_hand_made_folders(tmp_path):
    rows = [
        _row(id="A", time_s=2.0, memory_bytes=80 * GIB, memory_kind="reserved"),
        _row(id="B", time_s=4.0),
        _row(id="C", label="M1/C", time_s=1.0, memory_bytes=50 * GIB, memory_kind="allocated", static_bytes=20 * GIB),
        _row(id="D", label="B9", group="bridge", time_s=2.0, tokens_per_s_per_gpu=1000.0, gpus=4),
    ]
    bridge_args = ["--from-megatron", "configs/x/h100_8b.yaml", "--gpus", "4", "--gpu", "h100"]
    _write(tmp_path / "before", {
        "A": (1.6, [_stage(60, 70), _stage(60, 68)], []),
        "B": (4.4, [_stage(10, 12)], []),
        "C": (0.8, [_stage(30, 35), _stage(49, 60, after_step_gib=20.4)], []),
        "D": (2.5, [_stage(70, 90, fits=False)], bridge_args),
    })
    _write(tmp_path / "after", {
        "A": (2.2, [_stage(60, 72), _stage(60, 76)], []),
        "B": (4.4, [_stage(10, 12)], []),
        "C": (0.9, [_stage(30, 35), _stage(56, 60, after_step_gib=21.0)], []),
        "D": (2.0, [_stage(50, 64)], bridge_args),
    })
    text = table_mod.tables(rows, [tmp_path / "before", tmp_path / "after"])
    assert text.splitlines() == [
        "| row | published (GiB; s) | ckplan memory (ratio) | ckplan time, s (ratio) | memory goal | time within 15% | "
        "fits (allocated / reserved peak + NCCL buffers, GiB, worst rank, of the cap) |",
        "|---|---|---|---|---|---|---|",
        "| A | 80; 2 | 70.00 (0.875) → 76.00 (0.950) | 1.600 (0.800) → 2.200 (1.100) | yes | yes | "
        "yes (60.0 / 70.0 + 0.0 of 80.0) → yes (60.0 / 76.0 + 0.0 of 80.0) |",
        "| B | —; 4 | — | 4.400 (1.100) | — | yes | yes (10.0 / 12.0 + 0.0 of 80.0) |",
        "| M1/C | static 20.00, peak 50 allocated; 1 | static 20.40 (1.020), peak 49.00 (0.980) → "
        "static 21.00 (1.050), peak 56.00 (1.120) | 0.800 (0.800) → 0.900 (0.900) | **no** | yes | "
        "yes (49.0 / 60.0 + 0.0 of 80.0) → yes (56.0 / 60.0 + 0.0 of 80.0) |",
        "",
        "Time: 3 of 3 rows within 15%. Memory: 1 of 2 rows meet the goals.",
        "",
        "| row | recipe | GPUs | published tok/s/GPU → s | ckplan s (tok/s/GPU) | ratio | within 15% | "
        "fits (ckplan's allocated / reserved peak + NCCL buffers, GiB, worst rank, of the cap) |",
        "|---|---|---|---|---|---|---|---|",
        "| B9 | h100_8b | 4 x H100 | 1,000 → 2.000 | 2.500 → 2.000 (1,000) | 1.000 | yes | yes (50.0 / 64.0 + 0.0 of 80.0) |",
        "",
        "Time: 1 of 1 rows within 15%. Fit by ckplan's reckoning: 1 of 1.",
    ]


def test_the_fit_column_says_what_ckplan_sets_against_the_cap_nccl_s_buffers_too():
    """ckplan's fit test takes the reserved peak and the communication buffers (StageCost.device_need_bytes): the
    column shows both, for the rank nearest its cap with them (B6: 169.4 / 171.3 of 172.4 read as a near fit
    while ckplan's "no" was its 2.41 GiB of NCCL buffers)."""
    inner = {**_stage(160, 161, fits=False, cap_gib=172), "workspace_bytes": int(2.5 * GIB)}
    outer = {**_stage(160, 162, cap_gib=172), "workspace_bytes": int(1.0 * GIB)}
    assert table_mod.fits_text({"stages": [outer, inner]}) == "**no** (160.0 / 161.0 + 2.5 of 172.0)"
    assert table_mod.fits_text({"stages": [_stage(50, 64)]}) == "yes (50.0 / 64.0 + 0.0 of 80.0)"  # older results


def test_table_says_what_is_wrong_in_one_sentence(tmp_path, capsys):
    assert rows_mod.main(["table", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "is not a folder of results" in err and len(err.splitlines()) == 1


def test_a_row_refuses_a_profile_another_tree_made(tmp_path, table):
    """`run` reads a row's profile only where this tree's planner/ made it: one copied from another tree (or
    made before a change) would score the old code under the new one's name."""
    row = next(r for r in table.rows if r.profile)
    (tmp_path / f"{row.profile}.json").write_text("{}")
    with pytest.raises(rows_mod.HarnessError, match="another planner/"):
        rows_mod.evaluate_args(row, tmp_path)
    stamp = rows_mod._stamp(table.profiles[row.profile], "0" * 16)
    (tmp_path / f"{row.profile}.stamp.json").write_text(json.dumps(stamp))
    with pytest.raises(rows_mod.HarnessError, match="another planner/"):
        rows_mod.evaluate_args(row, tmp_path)
    stamp["tree"] = rows_mod.tree_id()
    (tmp_path / f"{row.profile}.stamp.json").write_text(json.dumps(stamp))
    assert rows_mod.evaluate_args(row, tmp_path)[:2] == ["--profile", str(tmp_path / f"{row.profile}.json")]


def test_the_7b_a100_rows_read_the_a100_runs_own_vocabulary(table):
    """§291: T16 and T19's golden values are 2795ebde's A100 runs, whose model_config.yaml gave --vocab-size
    131072 (a multiple of 128 x TP: no padding); the H100 and GB200 runs (6e091e1b, 7e6a045a) gave 131073,
    padded to 131,200 at TP 1 and 131,584 at TP 4."""
    from pathlib import Path

    from planner.models.configs import megatron

    by_id = {row.id: row for row in table.rows}

    def vocab(row_id: str) -> int:
        args = by_id[row_id].args
        return megatron.read(Path(args[args.index("--from-megatron") + 1])).arch.vocab_size

    assert [vocab(r) for r in ("T15", "T16", "T17")] == [131_200, 131_072, 131_200]
    assert [vocab(r) for r in ("T18", "T19", "T20")] == [131_584, 131_072, 131_584]


def test_a_compiled_blocks_record_is_part_of_what_makes_a_profile(tmp_path, monkeypatch):
    # a profile's compiled records are read from planner/profiler/compiled_blocks/*.json when it is made: a record
    # remade with no .py changed must make the harness's profiles stale (§43.m17mem)
    (tmp_path / "planner" / "profiler" / "compiled_blocks").mkdir(parents=True)
    (tmp_path / "planner" / "a.py").write_text("x = 1\n")
    record = tmp_path / "planner" / "profiler" / "compiled_blocks" / "r.json"
    record.write_text('{"record": [1]}\n')
    monkeypatch.setattr(rows_mod, "ROOT", tmp_path)
    first = rows_mod.tree_id.__wrapped__()
    record.write_text('{"record": [2]}\n')
    assert rows_mod.tree_id.__wrapped__() != first
