"""The matmul plateau a training step holds (issue 35, docs/published-runs.md §33.bias): a GPU's sustained,
power-saturated matmul rate (MSMF) where one is measured, its burst MAMF where none is, the XLA shape curve scaled to
it as a whole; and scripts/time_bias.py's shares of a row's step by kernel class."""

import json

import pytest
from fixtures.scripts import load_script

from planner.models import archs, matmul_ceilings
from planner.profiler.roofline import MATMUL_TABLE, matmul_efficiency


def test_a_gpu_with_a_sustained_row_reads_it_and_one_without_its_burst_figure():
    # stas00/ml-engineering 082816f's MSMF rows: the H200's (the H100's chip at 700 W) and the B200's, BF16 and FP8
    for name in ("h100-sxm", "h100-96g", "h200"):
        gpu = archs.gpu(name)
        assert gpu.matmul_efficiency == 708.5 / 989.4
        assert gpu.fp8_matmul_efficiency == 1288.7 / 1978.9
        assert gpu.matmul_source.startswith("MSMF 708.5 of 989.4") and "MAMF 794.5" in gpu.matmul_source
    b200 = archs.gpu("b200")
    assert (b200.matmul_efficiency, b200.fp8_matmul_efficiency) == (1456.3 / 2250, 2795.7 / 4500)
    # none measured sustained: GH200 (900 W), MI300X keep MAMF, and say so
    for name, mamf, peak in (("gh200", 828.6, 989.4), ("mi300x", 668.4, 1307.4)):
        gpu = archs.gpu(name)
        assert gpu.matmul_efficiency == mamf / peak
        assert "no sustained figure measured" in gpu.matmul_source
    # a sustained figure is below its burst one on every GPU with both (the settled clock under the power limit)
    for key, (sustained, _, _) in matmul_ceilings.SUSTAINED.items():
        assert sustained < matmul_ceilings.MAMF_TFLOPS[key]
    for key, (sustained, _, _) in matmul_ceilings.SUSTAINED_FP8.items():
        assert sustained < matmul_ceilings.MAMF_FP8_TFLOPS[key]


def test_the_a100_and_gb200_read_soaked_figures_and_the_gb200_bf16_its_settled_clock():
    # Azure/AI-benchmarking-guide's GEMM CuBLASLt after 10,000 warm-up calls (docs/framework-facts.md §190): the A100's
    # FP16 16384^3 (its BF16 the same rate a clock), the GB200's FP8 16384^3; the L4 reads the A100's fraction
    for name in ("a100-80g", "a100-40g"):
        assert archs.gpu(name).matmul_efficiency == 256.5 / 312
        assert archs.gpu(name).matmul_source.startswith("soaked 256.5 of 312")
    assert archs.gpu("l4").matmul_efficiency == 256.5 / 312
    gb200 = archs.gpu("gb200")
    assert gb200.fp8_matmul_efficiency == 2906.9 / 5000
    # BF16: the B200's MSMF a SM and clock (1,456.3 / (148 x 1,339 MHz)) on 152 SMs at the GB200's settled clock, its
    # FP8 2,906.9 over the B200's FP8 rate (2,795.7 / (148 x 1,331 MHz)) x 152: 1,347.5 MHz; the 152s and 148s cancel
    settled_mhz = 2906.9 * 148 * 1331 / (152 * 2795.7)
    assert settled_mhz == pytest.approx(1347.52, abs=0.01)
    assert gb200.matmul_efficiency * 2500 == pytest.approx(1456.3 * 2906.9 * 1331 / (2795.7 * 1339))  # 1,505.18
    assert gb200.matmul_efficiency * 2500 == pytest.approx(1505.18, abs=0.01)
    # inside §164's range: above the B200's rate and clock on 152 SMs, below the GB200's burst
    assert 1456.3 * 152 / 148 < gb200.matmul_efficiency * 2500 < 1822.0
    assert gb200.matmul_source.startswith("derived 1505.2 of 2500") and "1347.5 MHz" in gb200.matmul_source


def test_every_size_slows_by_the_same_factor_under_the_settled_clock():
    h100, gh200 = archs.gpu("h100-sxm"), archs.gpu("gh200")
    settled = 708.5 / 794.5  # the H100's plateau over the table's own (its largest shapes sit at MAMF)
    for batch, m, n, k, _ in MATMUL_TABLE[:-2]:  # below the plateau: each point at the settled clock
        flops = 2 * batch * m * n * k
        same = [tf for b, mm, nn, kk, tf in MATMUL_TABLE if 2 * b * mm * nn * kk == flops]
        assert matmul_efficiency(flops, h100) == pytest.approx(sum(same) / len(same) / 989.4 * settled)
    # the GH200 (no MSMF) reads the same table at its own MAMF: the two differ by their plateaus' ratio at every size
    for flops in (2 * 256 * 1024 * 256, 2 * 1024 * 4096 * 512, 2 * 8192**3):
        ratio = matmul_efficiency(flops, h100) / matmul_efficiency(flops, gh200)
        assert ratio == pytest.approx(708.5 / 828.6)


def _record(folder, row, mode, seconds, published):
    (folder / f"{row}.{mode}.json").write_text(json.dumps(
        {"id": row, "mode": mode, "iteration_s": seconds, "published_s": published, "group": "main"}))


def _row(folder, row, published, base, matmul, attention, membound):
    """A row's four modes: its base iteration and the iteration with each class stretched."""
    for mode, seconds in zip(("base", "matmul", "attention", "membound"), (base, matmul, attention, membound)):
        _record(folder, row, mode, seconds, published)


def test_time_bias_shares_are_each_class_growth_over_the_stretch(tmp_path):
    time_bias = load_script("time_bias")
    # row A: 10 s; matmul +10% adds 0.5 s (half the step), attention 0.2 s, memory-bound 0.1 s: the rest 0.2
    _row(tmp_path, "A", 12.5, 10.0, 10.5, 10.2, 10.1)
    _row(tmp_path, "B", 4.0, 4.0, 4.1, 4.1, 4.04)
    _record(tmp_path, "C", "base", 1.0, 1.0)  # a row with a mode missing is left out
    rows = {r["id"]: r for r in time_bias.shares(tmp_path)}
    assert set(rows) == {"A", "B"}
    assert rows["A"]["ratio"] == 0.8 and rows["B"]["ratio"] == 1.0
    assert (rows["A"]["matmul"], rows["A"]["attention"], rows["A"]["membound"]) == pytest.approx((0.5, 0.2, 0.1))
    assert rows["A"]["rest"] == pytest.approx(0.2)
    assert (rows["B"]["matmul"], rows["B"]["membound"], rows["B"]["rest"]) == pytest.approx((0.25, 0.1, 0.4))
    assert time_bias.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert time_bias.pearson([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    printed = time_bias.table(tmp_path)
    assert "| A | 10.000 | 0.800 | 0.500 | 0.200 | 0.100 | 0.200 |" in printed


def test_time_bias_gaps_are_the_factor_each_class_alone_would_need(tmp_path):
    time_bias = load_script("time_bias")
    # row A: 10 s of a published 12.5 (gap 2.5 s); matmul 5 s, attention 2 s, memory-bound 1 s, the rest 2 s
    _row(tmp_path, "A", 12.5, 10.0, 10.5, 10.2, 10.1)
    _row(tmp_path, "B", 4.0, 4.0, 4.1, 4.0, 4.04)  # on its published time, and no attention at all
    rows = {r["id"]: r for r in time_bias.shares(tmp_path)}
    a = time_bias.closing_factors(rows["A"])
    assert (a["matmul"], a["attention"], a["membound"], a["rest"]) == pytest.approx((1.5, 2.25, 3.5, 2.25))
    b = time_bias.closing_factors(rows["B"])
    assert b["attention"] is None and (b["matmul"], b["membound"], b["rest"]) == pytest.approx((1.0, 1.0, 1.0))
    printed = time_bias.gaps(tmp_path)
    assert "| A | 10.000 | 12.500 | +2.500 | x1.500 of 5.000 s | x2.250 of 2.000 s | x3.500 of 1.000 s |" in printed
    assert "| B | 4.000 | 4.000 | +0.000 | x1.000 of 1.000 s | - |" in printed
