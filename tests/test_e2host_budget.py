"""Row E2's MoE block: the host's issue, with the per-expert calls Transformer Engine v2.9's GroupedLinear makes under
FP8 current scaling (each at one torch Linear forward: an upper bound), against the block's device time
(scripts/moe_host_budget.py, docs/published-runs.md §29.e2host)."""

from __future__ import annotations

from pathlib import Path

from fixtures.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
E2 = ROOT / "configs/megatron-bridge/h100_qwen3_30b_fp8cs.yaml"


def test_the_per_split_calls_counted_from_te():
    """Per split: forward a Float8Tensor made, amax / scale / cast, the GEMM, the weight's workspace (6); backward
    grad_output's tensor and three kernels, dgrad, wgrad, the wgrad buffer (7); two GroupedLinears."""
    script = load_script("moe_host_budget")
    assert script.per_split_calls(False) == 6 and script.per_split_calls(True) == 7
    assert script.fp8_calls(16) == (2 * 16 * 6, 2 * 16 * 7)  # E2: 128 experts over EP 8


def test_e2s_host_may_bind_at_the_presets_microbatch(capsys):
    """E2 on H100's host (13.48 µs a Linear): forward (77.10 + 192) Linears = 3.627 ms, backward (86.41 + 224) =
    4.184 ms. At the preset's MBS 1 (framework-facts §171; 4,096 tokens, half the table's MBS 2) the block's FP8
    device passes are below both, so the upper bound no longer rules the host out (at MBS 2 it did: 0.76 / 0.58)."""
    script = load_script("moe_host_budget")
    assert script.main([str(E2), "h100"]) == 0
    out = capsys.readouterr().out
    assert f"{(77.10 + 192) * 13.48e-3:.3f} ms at most -> may bind" in out
    assert f"{(86.41 + 224) * 13.48e-3:.3f} ms at most -> may bind" in out
    assert "16 local experts, FP8 True" in out


def test_bad_arguments_one_sentence(capsys, tmp_path):
    script = load_script("moe_host_budget")
    assert script.main([]) == 2
    assert script.main([str(ROOT / "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml"), "h100"]) == 2
    assert "not a mixture of experts" in capsys.readouterr().err
    assert script.main([str(tmp_path / "missing.yaml"), "h100"]) == 2
    assert "no such file" in capsys.readouterr().err
