"""scripts/gpu_soak.py: its arithmetic on a fake timing and telemetry (hand counts), and that it skips without CUDA
(docs/gpu-check.md, "The sustained matmul soak"; docs/published-runs.md §35.gb200sus)."""

from __future__ import annotations

import itertools

import pytest

from scripts import gpu_soak


def test_tflops_of_the_h200_msmf_shape_by_hand():
    # 2 x 8192 x 8448 x 20480 = 2,834,678,415,360 FLOP; in 4.0 ms: 708.67 TFLOP/s (the H200's MSMF is 708.5)
    assert gpu_soak.matmul_tflops((8192, 8448, 20480), 4.0) == pytest.approx(708.669603840)
    assert gpu_soak.matmul_tflops((1024, 1024, 1024), 1.0) == pytest.approx(2.147483648)


def test_trimmed_median_drops_one_each_end_from_five():
    # five or more: the lowest and the highest dropped (1 and 100: the median of 2, 3, 4; 1 and 10: of 2 ... 5)
    assert gpu_soak.trimmed_median([1.0, 100.0, 3.0, 2.0, 4.0]) == 3.0
    assert gpu_soak.trimmed_median([10.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == 3.5
    assert gpu_soak.trimmed_median([1.0, 100.0, 3.0]) == 3.0  # under five: the plain median


def test_parse_shape_and_bad_input():
    assert gpu_soak.parse_shape("8192x8448x20480") == (8192, 8448, 20480)
    for bad in ("8192x8448", "8192xAx1", "0x1x1", "1x1x1x1"):
        with pytest.raises(ValueError, match="three positive integers"):
            gpu_soak.parse_shape(bad)


def test_bad_shape_is_one_sentence_and_a_nonzero_exit(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_soak.main(["--shape", "8192x8448"])
    assert exit_.value.code == 2
    assert "three positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_soak.main(["--gpu", "no-such-gpu"])
    assert "no GPU record named 'no-such-gpu'" in capsys.readouterr().err


def _fake(clocks: list[float], ms: list[float]):
    """A soak of windows 1 s apart on a fake clock: the n-th window takes ms[n] a matmul at clocks[n] MHz."""
    ticks = itertools.count()
    timing, telemetry = iter(ms), iter(clocks)
    return (
        lambda: ((8192, 8448, 20480), next(timing)),
        lambda: (next(telemetry), 700.0, 60.0),
        lambda: float(next(ticks)),
    )


def test_soak_settles_on_its_last_third_by_hand():
    # nine windows at t = 1 ... 9 s; the clock falls from 1,980 to 1,465 MHz and stays; the last third (windows
    # 7, 8, 9) runs 4.0, 4.2, 4.0 ms: under five values the plain median, 4.0 ms
    clocks = [1980, 1800, 1600, 1500, 1465, 1465, 1465, 1470, 1465]
    ms = [3.4, 3.6, 3.8, 3.9, 4.0, 4.0, 4.0, 4.2, 4.0]
    run, telemetry, now = _fake(clocks, ms)
    windows = gpu_soak.soak(run, telemetry, 9.0, now=now)
    assert [w.t_s for w in windows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    held = gpu_soak.settled(windows)
    assert held["windows"] == 3
    assert held["tflops"] == pytest.approx(708.669603840)
    assert (
        held["clock_mhz"] == 1465.0 and held["clock_spread_mhz"] == 5.0 and held["power_w"] == 700.0
    )


def test_summary_burst_against_sustained_by_hand():
    run, telemetry, now = _fake([1980.0] * 3, [3.6, 3.4, 3.5])
    burst = gpu_soak.soak(run, telemetry, 0.0, count=3, now=now)
    assert len(burst) == 3
    run, telemetry, now = _fake([1465.0] * 3, [4.0, 4.0, 4.0])
    found = gpu_soak.summary(burst, gpu_soak.soak(run, telemetry, 3.0, now=now), peak_tflops=989.4)
    assert found["burst"]["ms_per_matmul"] == 3.4  # the best window
    assert found["sustained_over_burst"] == pytest.approx(3.4 / 4.0)
    assert found["sustained_of_peak"] == pytest.approx(708.669603840 / 989.4)


def test_without_cuda_it_skips_and_writes_nothing(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_soak.main(["--gpu", "gb200", "--out", str(tmp_path / "soak")]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    assert not (tmp_path / "soak").exists()
