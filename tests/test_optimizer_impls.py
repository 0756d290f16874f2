"""The kernels a job's Adam step runs (planner/models/optimizer_impls.py, `ckplan profile --optimizer-impl`):
Composer's DecoupledAdamW counted by hand, kernel by kernel, at a tiny GPT-2 block, and the fused default untouched."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.models import archs
from planner.models.membound_rate import achieved_tbps
from planner.models.optimizer_impls import DECOUPLED_ADAMW_BYTES

# a GPT-2 block of width 64 (4 x 64 MLP), one sequence of 16 tokens
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 2, "vocab_size": 128, "n_positions": 16,
        "activation_function": "gelu", "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
# ln_1 2·64; c_attn 64·192 + 192; attn c_proj 64·64 + 64; ln_2 2·64; c_fc 64·256 + 256; mlp c_proj 256·64 + 64
BLOCK_PARAMS = 128 + 12_288 + 192 + 4_096 + 64 + 128 + 16_384 + 256 + 16_384 + 64


def test_decoupled_adamw_moves_80_bytes_a_parameter_kernel_by_kernel():
    fp32 = 4
    kernels = {  # composer/optim/decoupled_weight_decay.py 251-263 at v0.16.3, weight_decay 0.0: (read, written)
        "exp_avg.mul_(beta1)": (1, 1), ".add_(grad, alpha)": (2, 1),
        "exp_avg_sq.mul_(beta2)": (1, 1), ".addcmul_(grad, grad, value)": (2, 1),  # grad twice, read once
        "exp_avg_sq.sqrt()": (1, 1), "/ sqrt(bias_correction2)": (1, 1), ".add_(eps)": (1, 1),
        "param.addcdiv_(exp_avg, denom, value)": (3, 1),
    }
    assert DECOUPLED_ADAMW_BYTES == fp32 * sum(read + written for read, written in kernels.values()) == 80


def _profile(tmp_path, *args):
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    result = CliRunner().invoke(cli, ["profile", "--arch-config", str(config), "--seq-len", "16",
                                      "--micro-batch-size", "1", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    # the report says which step the profile times, only where it is not the fused default
    assert ("optimizer step: Adam: decoupled-adamw, 80 bytes" in result.output) == ("decoupled-adamw" in args)
    return json.loads(out.read_text()), out


@pytest.mark.parametrize("gpu", ["h100", "a100-80g"])
def test_the_block_steps_its_parameters_at_80_bytes_at_the_elementwise_rate(tmp_path, gpu):
    fused, _ = _profile(tmp_path, "--gpu", gpu)
    looped, _ = _profile(tmp_path, "--gpu", gpu, "--optimizer-impl", "decoupled-adamw")
    block, fused_block = looped["layers"][1], fused["layers"][1]
    assert block["param_count"] == BLOCK_PARAMS == 49_984
    rate = achieved_tbps(archs.gpu(gpu), "eager", "elementwise") * 1e12
    assert block["step_ms"]["adam"] == pytest.approx(49_984 * 80 / rate * 1e3, rel=1e-12)
    # the fused step it replaces: 28 B a parameter at the datasheet's bandwidth; SGD's is kept
    assert fused_block["step_ms"]["adam"] == pytest.approx(49_984 * 28 / (archs.gpu(gpu).hbm_tbps * 1e12) * 1e3)
    assert block["step_ms"]["sgd"] == fused_block["step_ms"]["sgd"]
    assert block["fwd_ms"] == fused_block["fwd_ms"] and block["bwd_ms"] == fused_block["bwd_ms"]
    assert looped["assumptions"]["optimizer_impl"] == "decoupled-adamw"
    assert "optimizer_impl" not in fused["assumptions"]


def test_the_remake_command_keeps_the_optimizer(tmp_path):
    from planner import io
    from planner.commands.expert_options import remake_command

    _, out = _profile(tmp_path, "--optimizer-impl", "decoupled-adamw")
    assert "--optimizer-impl decoupled-adamw" in remake_command(io.load_profile(out), 2)
    _, out = _profile(tmp_path)
    assert "--optimizer-impl" not in remake_command(io.load_profile(out), 2)


def test_a_measured_profile_refuses_it_in_one_sentence(tmp_path):
    out = tmp_path / "m.json"
    result = CliRunner().invoke(cli, ["profile", "tests/fixtures/llama_style.py", "--fake", "--optimizer-impl",
                                      "decoupled-adamw", "--out", str(out)])
    assert result.exit_code != 0 and "--optimizer-impl applies to --arch/--arch-config profiles only" in result.output
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.parametrize("command", ["evaluate", "solve"])
def test_evaluate_and_solve_say_the_profiles_optimizer_in_place_of_the_runtimes(tmp_path, command):
    """A step the runtime does not run is charged, and said: the option names the job's optimizer (the profile's),
    and `--runtime megatron` steps its own FusedAdam; a fused profile says nothing."""
    args = {"evaluate": ["--layers-per-stage", "3", "--ckpt-per-stage", "0"],
            "solve": ["--stages", "1", "--out", str(tmp_path / "plan.json")]}[command]
    for impl, said in (("decoupled-adamw", True), ("fused", False)):
        _, out = _profile(tmp_path, "--optimizer-impl", impl)
        result = CliRunner().invoke(cli, [command, "--profile", str(out), "--microbatches", "2", "--precision",
                                          "bf16-mixed", "--runtime", "megatron", *args])
        assert result.exit_code == 0, result.output
        assert ("--optimizer-impl decoupled-adamw (the profile's): each layer's Adam step is timed as Composer"
                in result.output) is said
        assert ("in place of the Adam step --runtime megatron runs" in result.output) is said


def test_export_says_the_file_cannot_select_the_profiles_optimizer(tmp_path):
    """No exported file selects Composer's DecoupledAdamW: the framework steps its own Adam, said as what it cannot
    express (the figures beside it keep the profile's step); a fused profile's export says nothing of it."""
    for impl, said in (("decoupled-adamw", True), ("fused", False)):
        _, out = _profile(tmp_path, "--optimizer-impl", impl)
        plan = tmp_path / f"plan-{impl}.json"
        solved = CliRunner().invoke(cli, ["solve", "--profile", str(out), "--stages", "1", "--microbatches", "2",
                                          "--precision", "bf16-mixed", "--runtime", "torchtitan", "--out", str(plan)])
        assert solved.exit_code == 0, solved.output
        result = CliRunner().invoke(cli, ["export", str(plan), "--to", "deepspeed",
                                          "--out", str(tmp_path / f"{impl}.json")])
        assert result.exit_code == 0, result.output
        assert ("DeepSpeed cannot express: the profile's Adam step (--optimizer-impl decoupled-adamw: Composer"
                in result.output) is said
        assert ("the file steps DeepSpeed's own Adam" in result.output) is said
