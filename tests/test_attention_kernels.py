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
from planner.models.attention_rates import attention_efficiency

# a GPT-2 block: 2 heads of 32 at 16 tokens, one sequence
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 2, "vocab_size": 128, "n_positions": 16,
        "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
SEQ, HEADS, HEAD_DIM = 16, 2, 32


@pytest.mark.parametrize("name", ["a100-80g", "a100-40g"])
def test_each_kernel_at_its_own_published_fractions_on_a100(name):
    gpu = archs.gpu(name)
    # FlashAttention-2 on A100: forward up to 73%, backward up to 63% (FlashAttention-2 paper §1)
    assert attention_efficiency(kernel_gpu(gpu, FLASH2)[0], 65536) == (0.73, 0.63)
    # FlashAttention (1): forward 30-50%, backward 25-35%, each at the top of its range
    flash1, unmodelled = kernel_gpu(gpu, FLASH1)
    assert attention_efficiency(flash1, 65536) == (0.50, 0.35) and unmodelled == ""
    assert "FlashAttention (1)" in flash1.attention_source


def test_a_gpu_with_no_published_flash1_rate_keeps_its_own_and_says_so():
    h100 = archs.gpu("h100")
    kept, unmodelled = kernel_gpu(h100, FLASH1)
    assert kept is h100
    assert unmodelled.startswith("--attention-kernel flash1: no published rate for h100-sxm")


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
    fwd_extra = forward / peak * (1 / 0.50 - 1 / 0.73) * 1e3
    bwd_extra = 2.5 * forward / peak * (1 / 0.35 - 1 / 0.63) * 1e3
    assert runs[FLASH1][0] - runs[FLASH2][0] == pytest.approx(fwd_extra, rel=1e-6)
    assert runs[FLASH1][1] - runs[FLASH2][1] == pytest.approx(bwd_extra, rel=1e-6)


def test_the_profile_names_the_kernel_and_what_it_could_not_model(tmp_path):
    result, out = _profile(tmp_path, "--gpu", "h100", "--attention-kernel", "flash1")
    assert result.exit_code == 0, result.output
    assumptions = json.loads(out.read_text())["assumptions"]
    assert assumptions["attention_kernel"] == "flash1"
    assert "no published rate for h100-sxm" in assumptions["attention_kernel_not_modelled"]
    assert "no published rate for h100-sxm" in result.output
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
