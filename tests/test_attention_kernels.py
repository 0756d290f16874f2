"""The flash kernel a job ran (planner/models/attention_kernels.py, `ckplan profile --attention-kernel`): the rate
chosen per kernel and GPU, the causal FLOPs counted by hand at a tiny shape, and what a profile says where no rate
is published for the GPU."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.models import archs
from planner.models.attention_kernels import FLASH1, FLASH2, kernel_gpu
from planner.models.attention_published import split_fwd_bwd
from planner.models.attention_rates import attention_efficiency

# a GPT-2 block: 2 heads of 32 at 16 tokens, one sequence
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 2, "vocab_size": 128, "n_positions": 16,
        "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
SEQ, HEADS, HEAD_DIM = 16, 2, 32


# FlashAttention (1)'s forward + backward at 16,384 tokens, causal, head dim 128 (the FlashAttention-2 release's README
# figures, panel (d)): A100 83, H100 137 TFLOP/s; split with the forward 0.50 / 0.35 = 10/7 times the backward's rate:
# 3.5 / R = 1 / F + 2.5 / B, F = 10/7 B  ->  F = R (1 + 25/7) / 3.5 = 64/49 R, B = 7/10 F
A100_16K = (83 * 64 / 49, 83 * 64 / 49 * 0.7)  # 108.41, 75.89 TFLOP/s
H100_16K = (137 * 64 / 49, 137 * 64 / 49 * 0.7)  # 178.94, 125.26


def test_a_forward_and_backward_rate_split_by_hand():
    fwd, bwd = split_fwd_bwd(137.0, 0.50 / 0.35)
    assert (fwd, bwd) == pytest.approx(H100_16K, rel=1e-12)
    assert 3.5 / 137.0 == pytest.approx(1 / fwd + 2.5 / bwd, rel=1e-12)  # the two passes' time is the published one
    assert split_fwd_bwd(137.0, 1.0) == pytest.approx((137.0, 137.0))  # equal rates: both the combined one


@pytest.mark.parametrize("name", ["a100-80g", "a100-40g"])
def test_each_kernel_at_its_own_published_fractions_on_a100(name):
    gpu = archs.gpu(name)
    # FlashAttention-2 on A100: forward up to 73%, backward up to 63% (FlashAttention-2 paper §1)
    assert attention_efficiency(kernel_gpu(gpu, FLASH2)[0], 65536) == (0.73, 0.63)
    # FlashAttention (1): its 16,384-token figure past it (the nearest published length), 83 TFLOP/s forward + backward
    flash1, unmodelled = kernel_gpu(gpu, FLASH1)
    assert attention_efficiency(flash1, 65536) == pytest.approx((A100_16K[0] / 312, A100_16K[1] / 312), rel=1e-12)
    assert unmodelled == "" and "FlashAttention (1) on A100" in flash1.attention_source


def test_flash1_on_h100_at_its_published_figures_by_length():
    # was: no FlashAttention (1) rate for the H100, its FlashAttention-2 figures charged (303.6 / 296.5 TFLOP/s at 16k)
    flash1, unmodelled = kernel_gpu(archs.gpu("h100"), FLASH1)
    assert unmodelled == "" and "FlashAttention (1) on H100" in flash1.attention_source
    assert attention_efficiency(flash1, 65536) == pytest.approx((H100_16K[0] / 989.4, H100_16K[1] / 989.4), rel=1e-12)
    # 8,192 tokens: 135 TFLOP/s forward + backward
    assert attention_efficiency(flash1, 8192) == pytest.approx((135 * 64 / 49 / 989.4, 135 * 64 / 49 * 0.7 / 989.4))
    # 2,048 tokens: 108; between two published lengths log-linear (4,096: 126; 2,896 ~ halfway in log)
    fwd_2k, fwd_4k = 108 * 64 / 49 / 989.4, 126 * 64 / 49 / 989.4
    assert attention_efficiency(flash1, 2896)[0] == pytest.approx(fwd_2k + (fwd_4k - fwd_2k) * 0.5, rel=1e-3)


def test_a_gpu_with_no_published_flash1_rate_keeps_its_own_and_says_so():
    h200 = archs.gpu("h200")
    kept, unmodelled = kernel_gpu(h200, FLASH1)
    assert kept is h200
    assert unmodelled.startswith("--attention-kernel flash1: no published rate for h200")


def _profile(tmp_path, *args):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    result = CliRunner().invoke(cli, ["profile", "--arch-config", str(config), "--seq-len", str(SEQ),
                                      "--micro-batch-size", "1", "--out", str(out), *args])
    return result, out


def test_the_causal_kernel_time_by_hand_at_a_tiny_shape(tmp_path):
    # the kernel skips the blocks above the diagonal: forward 4 x (s^2 / 2) x head dim x heads FLOPs, backward 2.5 x
    forward = 4 * (SEQ * SEQ // 2) * HEAD_DIM * HEADS
    assert forward == 32_768
    peak = 312e12
    runs = {}
    for kernel in (FLASH2, FLASH1):
        result, out = _profile(tmp_path, "--gpu", "a100-80g", "--attention-kernel", kernel)
        assert result.exit_code == 0, result.output
        block = json.loads(out.read_text())["layers"][1]
        runs[kernel] = block["fwd_ms"], block["bwd_ms"]
    # FlashAttention (1) at 16 tokens: its 512-token figure (55 TFLOP/s forward + backward), split as above
    fwd_tflops = 55 * 64 / 49
    fwd_extra = (forward / (fwd_tflops * 1e12) - forward / (peak * 0.73)) * 1e3
    bwd_extra = (2.5 * forward / (fwd_tflops * 0.7 * 1e12) - 2.5 * forward / (peak * 0.63)) * 1e3
    assert runs[FLASH1][0] - runs[FLASH2][0] == pytest.approx(fwd_extra, rel=1e-6)
    assert runs[FLASH1][1] - runs[FLASH2][1] == pytest.approx(bwd_extra, rel=1e-6)


def test_the_profile_names_the_kernel_and_what_it_could_not_model(tmp_path):
    result, out = _profile(tmp_path, "--gpu", "h200", "--attention-kernel", "flash1")
    assert result.exit_code == 0, result.output
    assumptions = json.loads(out.read_text())["assumptions"]
    assert assumptions["attention_kernel"] == "flash1"
    assert "no published rate for h200" in assumptions["attention_kernel_not_modelled"]
    assert "no published rate for h200" in result.output
    result, out = _profile(tmp_path, "--gpu", "a100-80g", "--attention-kernel", "flash1")
    assumptions = json.loads(out.read_text())["assumptions"]
    assert "attention_kernel_not_modelled" not in assumptions
    assert assumptions["attention_source"].startswith("FlashAttention (1) on A100")


def test_a_flash_kernel_beside_eager_attention_is_refused_in_one_sentence(tmp_path):
    result, out = _profile(tmp_path, "--attention", "eager", "--attention-kernel", "flash1")
    assert result.exit_code == 1 and "--attention eager runs none" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_flash_kernel_under_mfu_is_refused_not_recorded_unused(tmp_path):
    # --mfu times every FLOP at one rate: the flash1 profile came out with flash2's times to the bit, yet recorded
    # attention_kernel flash1 and said nothing
    result, out = _profile(tmp_path, "--gpu", "a100-80g", "--mfu", "0.4", "--attention-kernel", "flash1")
    assert result.exit_code == 1 and "--mfu 0.4 times every FLOP at one rate" in result.output
    assert "Traceback" not in result.output and not out.exists()
    result, out = _profile(tmp_path, "--gpu", "a100-80g", "--mfu", "0.4", "--attention-kernel", "flash2")
    assert result.exit_code == 0, result.output


def test_the_remake_command_keeps_the_kernel(tmp_path):
    from planner import io
    from planner.commands.expert_options import remake_command

    result, out = _profile(tmp_path, "--gpu", "a100-80g", "--attention-kernel", "flash1")
    assert result.exit_code == 0, result.output
    assert "--attention-kernel flash1" in remake_command(io.load_profile(out), 2)
    result, out = _profile(tmp_path, "--gpu", "a100-80g")
    assert "--attention-kernel" not in remake_command(io.load_profile(out), 2)


def test_flash1_beside_a_sliding_window_shorter_than_the_sequence_is_refused(tmp_path):
    # flash-attn 1.x has no local attention (added in 2.3, §431): the profile would count windowed FLOPs at a kernel
    # that runs none; a window the sequence does not reach changes nothing and passes
    config = tmp_path / "windowed.json"
    config.write_text(json.dumps({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                  "vocab_size": 128, "max_position_embeddings": 64, "sliding_window": 8}))
    out = tmp_path / "w.json"
    args = ["profile", "--arch-config", str(config), "--micro-batch-size", "1", "--gpu", "a100-80g", "--out", str(out)]
    result = CliRunner().invoke(cli, [*args, "--seq-len", "16", "--attention-kernel", "flash1"])
    assert result.exit_code == 1 and "runs no sliding window" in result.output and "within 8 tokens" in result.output
    assert "Traceback" not in result.output and not out.exists()
    assert CliRunner().invoke(cli, [*args, "--seq-len", "16"]).exit_code == 0  # flash2 runs the window
    assert CliRunner().invoke(cli, [*args, "--seq-len", "8", "--attention-kernel", "flash1"]).exit_code == 0


def _search(tmp_path, config, *args):
    out = tmp_path / f"best{len(list(tmp_path.iterdir()))}.yaml"
    result = CliRunner().invoke(cli, ["search", "--arch-config", str(config), "--gpus", "1", "--global-batch", "1",
                                      "--micro-batch-sizes", "1", "--gpu", "a100-80g", "--out", str(out), *args])
    return result, out


def test_search_times_attention_with_the_kernel_it_is_told(tmp_path):
    # search had no --attention-kernel: its profiles were FlashAttention-2's whatever kernel the job ran. Its best
    # plan's profile now holds the block `ckplan profile --attention-kernel flash1` records, to the bit
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    blocks = {}
    for kernel in (FLASH2, FLASH1):
        result, out = _search(tmp_path, config, "--seq-len", str(SEQ), "--attention-kernel", kernel)
        assert result.exit_code == 0, result.output
        searched = json.loads(out.with_name(out.stem + ".profile.json").read_text())
        result, made = _profile(tmp_path, "--gpu", "a100-80g", "--attention-kernel", kernel, "--dtype", "bf16")
        assert result.exit_code == 0, result.output
        profiled = json.loads(made.read_text())
        assert searched["assumptions"]["attention_kernel"] == kernel
        blocks[kernel] = searched["layers"][1]["fwd_ms"], searched["layers"][1]["bwd_ms"]
        assert blocks[kernel] == (profiled["layers"][1]["fwd_ms"], profiled["layers"][1]["bwd_ms"])
    assert blocks[FLASH1][0] > blocks[FLASH2][0] and blocks[FLASH1][1] > blocks[FLASH2][1]


def test_search_refuses_a_kernel_its_profile_was_not_timed_with(tmp_path):
    result, made = _profile(tmp_path, "--gpu", "a100-80g", "--dtype", "bf16")
    assert result.exit_code == 0, result.output
    args = ["search", "--profile", str(made), "--gpus", "1", "--global-batch", "1", "--out", str(tmp_path / "b.yaml")]
    result = CliRunner().invoke(cli, [*args, "--attention-kernel", "flash1"])
    assert result.exit_code == 1 and "the profile's attention was timed with flash2" in result.output
    assert "Traceback" not in result.output
    assert CliRunner().invoke(cli, [*args, "--attention-kernel", "flash2"]).exit_code == 0


def test_search_refuses_flash1_beside_a_window_shorter_than_the_sequence(tmp_path):
    config = tmp_path / "windowed.json"
    config.write_text(json.dumps({"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                  "vocab_size": 128, "max_position_embeddings": 64, "sliding_window": 8}))
    result, out = _search(tmp_path, config, "--seq-len", "16", "--attention-kernel", "flash1")
    assert result.exit_code == 1 and "runs no sliding window" in result.output and not out.exists()
