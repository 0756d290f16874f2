"""The 500 W, 96 GB HBM2e H100 of torchtitan's benchmark hosts (`h100-96g`): its peak is the SXM's, the upper end of
the range its benchmark states ("between SXM and NVL"), each end's rated clock is its datasheet's arithmetic, and
scripts/gpu_whatif.py scores rows at another figure without shipping it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from fixtures.scripts import load_script

from planner.models import gpus
from planner.models.gpus import (
    H100_NVL_BF16_TFLOPS,
    H100_NVL_FP8_TFLOPS,
    HOPPER_BF16_FLOP_PER_SM_CLOCK,
    gpu,
    rated_clock_mhz,
)


def test_a_hopper_sm_does_4096_dense_bf16_flop_a_clock():
    # 4 tensor cores x 512 FMA x 2; the SXM's 132 SMs: 540,672 a clock (glennklockwood.com's count)
    assert HOPPER_BF16_FLOP_PER_SM_CLOCK == 4096
    assert 132 * HOPPER_BF16_FLOP_PER_SM_CLOCK == 540_672


def test_each_datasheet_peak_is_its_rated_clock():
    # SXM: 989.4 TFLOP/s = 540,672 FLOP x 1.830 GHz (NVIDIA's compute clock for H100 SXM, 1,830 MHz)
    assert rated_clock_mhz(gpu("h100-sxm").bf16_tflops, 132) == pytest.approx(1830.0, abs=0.1)
    # NVL: 1,671 sparse / 2 = 835.5 dense on 132 SMs: 835.5e12 / 540,672 = 1,545.30 MHz
    assert H100_NVL_BF16_TFLOPS == 835.5 and H100_NVL_FP8_TFLOPS == 1670.5
    assert rated_clock_mhz(H100_NVL_BF16_TFLOPS, 132) == pytest.approx(835.5e12 / 540_672 / 1e6)
    assert rated_clock_mhz(H100_NVL_BF16_TFLOPS, 132) == pytest.approx(1545.3, abs=0.05)
    # PCIe: 756.5 on 114 SMs: 1,620.1 MHz (the same arithmetic, another SM count)
    assert rated_clock_mhz(gpu("h100-pcie").bf16_tflops, 114) == pytest.approx(1620.1, abs=0.05)
    # FP8 runs at the same clock: twice the BF16 work a clock
    assert H100_NVL_FP8_TFLOPS / 2 == pytest.approx(H100_NVL_BF16_TFLOPS, rel=1e-3)


def test_the_500w_part_reads_the_upper_end_of_its_range():
    part, sxm = gpu("h100-96g"), gpu("h100-sxm")
    assert part.bf16_tflops == sxm.bf16_tflops == 989.4 > H100_NVL_BF16_TFLOPS
    assert part.fp8_tflops == sxm.fp8_tflops
    assert part.matmul_efficiency == sxm.matmul_efficiency == pytest.approx(708.5 / 989.4)  # the 700 W MSMF
    assert part.hbm_tbps == 2.4 and part.memory_bytes == 96 * 10**9
    assert "835.5 (1545 MHz at 400 W)" in part.source and "989.4 (1830 MHz)" in part.source


def test_the_whatif_replaces_the_record_here_and_in_the_harness_children(tmp_path):
    whatif = load_script("gpu_whatif")
    key, changes = whatif.parse_changes("h100-96g", ["bf16_tflops=835.5", "fp8_tflops=1670.5"])
    assert (key, changes) == ("h100-96g", {"bf16_tflops": 835.5, "fp8_tflops": 1670.5})
    shipped = gpus.GPUS[key]
    try:
        harness = whatif.load_harness(str(tmp_path), key, changes)
        assert gpu("h100-96g").bf16_tflops == 835.5  # this process: `one` and `split` evaluate in it
        env = harness._env()  # what the harness gives its `ckplan profile` and `one` children
        assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(ROOT)]
    finally:
        gpus.GPUS[key] = shipped
        sys.modules.pop("published_rows", None)
    code = ("from planner.models.gpus import gpu; a = gpu('h100-96g'); b = gpu('h100-sxm'); "
            "print(a.bf16_tflops, a.fp8_tflops, a.matmul_efficiency == b.matmul_efficiency, b.bf16_tflops)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["835.5", "1670.5", "True", "989.4"]  # only that record, only those fields
    assert gpu("h100-96g").bf16_tflops == 989.4  # the shipped record back


def test_the_whatif_refuses_what_it_cannot_do():
    whatif = load_script("gpu_whatif")
    with pytest.raises(SystemExit, match="FIELD=NUMBER"):
        whatif.parse_changes("h100-96g", ["source=x"])
    with pytest.raises(SystemExit, match="not a number"):
        whatif.parse_changes("h100-96g", ["bf16_tflops=fast"])
    with pytest.raises(SystemExit, match="at least one"):
        whatif.parse_changes("h100-96g", [])
    with pytest.raises(SystemExit, match="after `--`"):
        whatif.main(["--gpu", "h100-96g", "--set", "bf16_tflops=835.5"])
    with pytest.raises(SystemExit, match="--work folder of the what-if's own"):
        whatif.main(["--gpu", "h100-96g", "--set", "bf16_tflops=835.5", "--", "run", "--out", "x"])
    with pytest.raises(SystemExit, match="shipped figures' profiles"):
        whatif.main(["--gpu", "h100-96g", "--set", "bf16_tflops=835.5", "--", "profiles", "--work",
                     str(ROOT / ".published-rows" / "profiles")])
    with pytest.raises(SystemExit, match="unknown --gpu"):
        whatif.parse_changes("h100-700g", ["bf16_tflops=1"])
