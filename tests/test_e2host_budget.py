"""Row E2's MoE block: the host's issue, with the per-expert calls Transformer Engine v2.9's GroupedLinear makes under
FP8 current scaling (each at one torch Linear forward: an upper bound), against the block's device time
(scripts/moe_host_budget.py, docs/published-runs.md §29.e2host)."""

from __future__ import annotations

from pathlib import Path

from fixtures.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
E2 = ROOT / "configs/megatron-bridge/h100_qwen3_30b_fp8cs.yaml"


def test_the_per_split_calls_counted_from_te():
    """Per split: forward a Float8Tensor made, zero-amax / amax / scale / cast, the GEMM, the weight's workspace (7);
    backward grad_output's tensor and four kernels, dgrad, wgrad, the wgrad buffer (8); two GroupedLinears."""
    script = load_script("moe_host_budget")
    assert script.per_split_calls(False) == 7 and script.per_split_calls(True) == 8
    assert script.fp8_calls(16) == (2 * 16 * 7, 2 * 16 * 8)  # E2: 128 experts over EP 8


def test_the_experts_kernels_counted_from_te():
    """TE v2.9's current-scaling quantize launches four kernels a split (zero_amax, amax, scale, cast:
    current_scaling.cu 72-107, 258; quantizer.cpp 516-535), then the split's GEMM (forward) or its dgrad and wgrad
    GEMMs (backward): E2's 16 local experts x 2 GroupedLinears = 2 x 16 x 5 = 160 forward, 2 x 16 x 6 = 192
    backward; a tiny block of 2 local experts 20 and 24."""
    script = load_script("moe_host_budget")
    assert sum(script.QUANTIZE_KERNELS.values()) == 4
    assert script.fp8_kernels(16) == (160, 192)
    assert script.fp8_kernels(2) == (20, 24)


def test_e2s_host_may_bind_at_the_presets_microbatch(capsys):
    """E2 on H100's host (13.48 µs a Linear): forward (77.10 + 224) Linears = 4.059 ms, backward (86.41 + 256) =
    4.616 ms. At the preset's MBS 1 (framework-facts §171; 4,096 tokens, half the table's MBS 2) the block's FP8
    device passes are below both, so the upper bound no longer rules the host out (at MBS 2 it did: 0.76 / 0.58)."""
    script = load_script("moe_host_budget")
    assert script.main([str(E2), "h100"]) == 0
    out = capsys.readouterr().out
    assert f"{(77.10 + 224) * 13.48e-3:.3f} ms at most -> may bind" in out
    assert f"{(86.41 + 256) * 13.48e-3:.3f} ms at most -> may bind" in out
    assert "launch 160 kernels" in out and "launch 192 kernels" in out
    assert "16 local experts, FP8 True" in out


def test_bad_arguments_one_sentence(capsys, tmp_path):
    script = load_script("moe_host_budget")
    assert script.main([]) == 2
    assert script.main([str(ROOT / "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml"), "h100"]) == 2
    assert "not a mixture of experts" in capsys.readouterr().err
    assert script.main([str(tmp_path / "missing.yaml"), "h100"]) == 2
    assert "no such file" in capsys.readouterr().err
