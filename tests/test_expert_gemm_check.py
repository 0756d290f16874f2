"""scripts/expert_gemm_check.py: a Megatron MoE row's expert GEMMs at their shapes, as the TE record charges them
(docs/published-runs.md §35.e4moe, framework-facts §169)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fixtures.scripts import load_script

from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic_time, te_fused
from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel, kernel_ms

ROOT = Path(__file__).resolve().parents[1]
E4 = ROOT / "configs/megatron-bridge/h100_gptoss_120b_bf16.yaml"


def _e4():
    job = megatron.read(E4)
    return job, Shape(
        seq_len=job.seq_len,
        micro_batch_size=job.micro_batch_size,
        tp=job.tp,
        sp=job.sp,
        cp=job.cp,
        ep=job.ep,
    )


def test_e4s_expert_gemms_by_hand():
    """GPT-OSS 120B at EP 8, MBS 1, 4,096 tokens: 128 / 8 = 16 local experts, each over 4,096 x 4 / 128 x 8 = 1,024
    rows; linear_fc1 2 x 2,880 wide (the gated unit), linear_fc2 2,880 -> 2,880."""
    job, shape = _e4()
    local, gemms = load_script("expert_gemm_check").expert_gemms(job.arch, shape)
    assert local == 16
    assert gemms == [
        ("fc1 fprop", 1024, 5760, 2880),
        ("fc2 fprop", 1024, 2880, 2880),
        ("fc2 dgrad", 1024, 2880, 2880),
        ("fc2 wgrad", 2880, 2880, 1024),
        ("fc1 dgrad", 1024, 2880, 5760),
        ("fc1 wgrad", 5760, 2880, 1024),
    ]


def test_the_table_is_what_the_te_record_runs():
    """The record's forward holds the 16 experts' fc1 as one GEMM of 2 x 1,024 x 5,760 x 2,880 FLOPs each and their
    fc2 of half that (with the attention's none of either size); its backward twice each: the table's GEMMs."""
    job, shape = _e4()
    fwd, bwd, _ = te_fused.moe_passes(
        job.arch, shape, analytic_time.block_work(job.arch, shape, moe=True)
    )
    fc1, fc2 = Kernel("matmul", 2 * 1024 * 5760 * 2880), Kernel("matmul", 2 * 1024 * 2880 * 2880)
    assert Counter(dict(fwd.kernels))[fc1] == 16 and Counter(dict(fwd.kernels))[fc2] == 16
    assert Counter(dict(bwd.kernels))[fc1] == 32 and Counter(dict(bwd.kernels))[fc2] == 32


def test_the_charged_totals(capsys):
    """Forward 16 x (fc1 + fc2), backward twice that, each GEMM at its FLOPs' rate on the H100."""
    gpu = archs.gpu("h100")
    fc1, fc2 = (kernel_ms(Kernel("matmul", 2 * 1024 * n * 2880), gpu) for n in (5760, 2880))
    assert load_script("expert_gemm_check").main([str(E4), "h100"]) == 0
    out = capsys.readouterr().out
    assert "16 local experts of 1024 rows, h 2880, BF16" in out
    assert f"forward {16 * (fc1 + fc2):.3f} ms, backward {32 * (fc1 + fc2):.3f} ms" in out


@pytest.mark.parametrize(
    "argv, said",
    [
        ([], "usage: expert_gemm_check.py"),
        (
            [str(ROOT / "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml"), "h100"],
            "not a mixture of experts",
        ),
    ],
)
def test_bad_arguments_one_sentence(argv, said, capsys):
    assert load_script("expert_gemm_check").main(argv) == 2
    assert said in capsys.readouterr().err


def test_device_refused_without_cuda(capsys, monkeypatch):
    script = load_script("expert_gemm_check")
    monkeypatch.setattr(script, "_cuda", lambda: False)
    assert script.main([str(E4), "h100", "--device"]) == 2
    assert "--device needs a CUDA GPU" in capsys.readouterr().err


def _table(points: dict) -> str:
    """A header in XLA's text format: one GPU key, its entries (b, m, n, k) -> {dtype: TFLOP/s}."""
    entries = "".join(
        f"entries {{\n b: {b}\n m: {m}\n n: {n}\n k: {k}\n"
        + "".join(f' flops {{ key: "{dtype}" value: {int(tflops * 1e12)} }}\n' for dtype, tflops in rates.items())
        + "}\n"
        for (b, m, n, k), rates in points.items()
    )
    return f'entries {{\n    key: "sm_90"\n    value {{\n{entries}    }}\n}}\n'


# a 2 x 2 x 2 grid (256 and 1,024 on each side): BF16 rates 100 x (1 + the number of 1,024 sides); FP8 twice that, one
# point above the H100's dense FP8 peak
GRID = {(1, m, n, k): {"bf16xbf16->bf16": 100.0 * (1 + [m, n, k].count(1024)),
                       "f8e4m3fnxf8e4m3fn->bf16": 2000.0 if (m, n, k) == (1024, 1024, 1024) else 200.0}
        for m in (256, 1024) for n in (256, 1024) for k in (256, 1024)}


def test_the_xla_grid_read_by_hand():
    """512 is halfway between 256 and 1,024 in log2: each side's weight 1/2, so 512^3 reads the corners' mean
    (100 + 3 x 200 + 3 x 300 + 400) / 8 = 250; a side at 1,024 weighs the upper corners alone; below 256 and above
    1,024 the grid's edge."""
    table = load_script("xla_gemm_table")
    grid = table.read(_table(GRID), "sm_90")
    assert len(grid) == 8 and table.read(_table(GRID), "sm_100_B200") == {}
    assert table.rate(grid, 512, 512, 512) == pytest.approx(250.0)
    assert table.rate(grid, 1024, 512, 512) == pytest.approx((200 + 2 * 300 + 400) / 4)
    assert table.rate(grid, 64, 8192, 256) == pytest.approx(200.0)  # clamped to (256, 1024, 256)
    assert table.above(grid, table.FP8, 1978.9) == 1


def test_the_xla_grid_beside_ckplans_charge(tmp_path, capsys):
    header = tmp_path / "matmul_interpolator_data.h"
    header.write_text(_table(GRID))
    script = load_script("expert_gemm_check")
    assert script.main([str(E4), "h100", "--xla", str(header)]) == 0
    out = capsys.readouterr().out
    # every E4 GEMM has a side at or above 1,024 on each axis: the grid's 1,024^3 corner, 400 TFLOP/s at the burst
    # plateau, scaled to the H100's sustained one as roofline.py scales its curve
    h100 = archs.gpu("h100")
    scaled = 400.0 * h100.matmul_efficiency / script._TABLE_PLATEAU
    assert f"{scaled:16.1f}" in out and "1 of 8 above the dense FP8 peak" in out
    assert script.main([str(E4), "b200", "--xla", str(header)]) == 2
    assert "not an H100-family GPU" in capsys.readouterr().err
    assert script.main([str(E4), "h100", "--xla", str(tmp_path / "none.h")]) == 2
    assert "cannot read" in capsys.readouterr().err
