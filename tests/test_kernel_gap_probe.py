"""scripts/kernel_gap_probe.py, the device check of the GPU's own time between back-to-back kernels
(docs/published-runs.md §35.kgap): its arithmetic by hand, its table, its refusal of bad input, and its clean skip on
a machine without CUDA."""

from __future__ import annotations

import pytest
from fixtures.scripts import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("kernel_gap_probe")


def refusal(main, argv: list[str], capsys) -> str:
    """What `main(argv)` says on stderr as argparse refuses it (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_period_is_the_span_over_the_kernels(probe):
    assert probe.period_us(1.25, 500) == pytest.approx(2.5)  # 1,250 µs / 500


def test_gaps_are_each_start_less_the_previous_end_in_the_order_run(probe):
    # given out of order: the trace's records need not come sorted
    spans = [(5.5, 7.0), (0.0, 2.0), (3.0, 5.0)]
    assert probe.gaps_us(spans) == pytest.approx([1.0, 0.5])  # 3.0 - 2.0, 5.5 - 5.0
    assert probe.gaps_us([(0.0, 2.0)]) == []


def test_the_host_is_ahead_only_if_it_queued_everything_within_the_sleep(probe):
    assert probe.host_ahead(4.0, 10.0)
    assert not probe.host_ahead(12.0, 10.0)


def test_summary_splits_the_period_into_kernel_and_gap(probe):
    # 500 kernels in 1.25 ms: 2.5 µs a kernel; the trace's kernels 1.4 µs (median of 1.2, 1.4, 1.6): a 1.1 µs gap
    row = probe.summary("eager", 1.25, 500, [1.2, 1.6, 1.4], [1.0, 1.2, 0.9], True)
    assert row["period_us"] == pytest.approx(2.5)
    assert row["kernel_us"] == pytest.approx(1.4)
    assert row["gap_us"] == pytest.approx(1.1)
    assert row["trace_gap_us"] == pytest.approx(1.0)
    untraced = probe.summary("graph", 0.5, 500, [], [], False)
    assert untraced["period_us"] == pytest.approx(1.0) and untraced["gap_us"] is None
    lines = probe.report([row, untraced])
    assert lines[2] == "| eager | 500 | 2.500 | 1.400 | 1.100 | 1.000 | yes |"
    assert lines[3] == "| graph | 500 | 1.000 | — | — | — | NO |"


def test_the_arithmetic_a_block_microbatch_needs(probe, capsys):
    """E4's published gap, 4.53 ms a block-microbatch (§35.e4moe), over a MoE block's 300 kernels: 15.1 µs each;
    at 1.3 µs a kernel the 300 add 0.39 ms, 8.6% of it."""
    assert probe.needed_gap_us(4.53, 300) == pytest.approx(15.1)
    assert probe.added_ms(300, 1.3) == pytest.approx(0.39)
    assert probe.main(["--missing-ms", "4.53", "--block-kernels", "300", "--gap-us", "1.3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "a block-microbatch of 300 kernels missing 4.530 ms: 15.100 µs a kernel would carry it",
        "at 1.300 µs a kernel: 0.390 ms a block-microbatch, 8.6% of what is missing",
    ]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--kernels", "0"], "--kernels must be a positive integer, got 0"),
        (["--kernels", "5000"], "--kernels 5000 is past the launch queue's depth (1000)"),
        (["--hold-ms", "-1"], "--hold-ms must be positive, got -1.0"),
        (["--missing-ms", "4.5"], "--missing-ms and --block-kernels go together"),
        (["--gap-us", "1.3"], "--gap-us needs --missing-ms and --block-kernels"),
    ],
)
def test_bad_input_is_one_sentence_and_a_nonzero_exit(probe, capsys, argv, said):
    err = refusal(probe.main, argv, capsys)
    assert said in err and "Traceback" not in err


def test_it_skips_cleanly_where_it_cannot_time(probe, capsys, monkeypatch):
    monkeypatch.setattr(probe, "unavailable", lambda: "no CUDA device")
    assert probe.main([]) == 0
    assert capsys.readouterr().out == "kernel_gap_probe: skipped: no CUDA device\n"


@pytest.fixture(scope="module")
def share():
    return load_script("kernel_gap_share")


def test_a_blocks_share_by_hand(probe, share):
    # 100 kernels at 1.3 µs: 0.13 ms on a 0.547 ms block-microbatch (G8's): 23.8%
    assert probe.block_share(100, 1.3, 0.547) == pytest.approx(0.13 / 0.547)
    assert share.line("G8", "h100-sxm", "decoder_block", 0.547, 100, [0.58, 1.3]) == (
        "| G8 | h100-sxm | decoder_block | 0.547 | 100 | 10.6% / 23.8% |"
    )


def test_the_share_scripts_arguments(share):
    assert share.parse_rows("E4=300,M8=150") == {"E4": 300, "M8": 150}
    assert share.parse_gaps("0.58,1.3") == [0.58, 1.3]
    for bad, said in (("E4", "ID=KERNELS"), ("E4=0", "ID=KERNELS"), ("=3", "ID=KERNELS")):
        with pytest.raises(ValueError, match=said):
            share.parse_rows(bad)
    with pytest.raises(ValueError, match="non-negative"):
        share.parse_gaps("-1")
    with pytest.raises(ValueError, match="separated by commas"):
        share.parse_gaps("1;2")


def test_the_share_script_refuses_bad_rows_in_one_sentence(share, capsys):
    err = refusal(share.main, ["--rows", "E4=many"], capsys)
    assert (
        "--rows takes ID=KERNELS pairs (a positive kernel count), got 'E4=many'" in err
        and "Traceback" not in err
    )


def test_the_share_script_names_an_unknown_row(share, capsys):
    assert share.main(["--rows", "ZZ9=10"]) == 2
    assert "kernel_gap_share: no row ZZ9 in scripts/published_rows.toml" in capsys.readouterr().err
