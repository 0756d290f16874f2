"""Defects a user's pass over models and configs no test used found (docs/published-runs.md §37.usertrial2):
each test fails on the commit before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run, run_ok

from planner.measure import fromlog

FIXTURES = Path(__file__).parent / "fixtures"
GIB = 1 << 30
ESC = "\x1b"


def _titan_line(step: int, memory: str, tps: str, mfu: str) -> str:
    """One line as torchtitan b5bcd76c's MetricsProcessor.log prints it (metrics.py 526-535), colours included."""
    return (f"[rank0]:[titan] 2026-11-30 10:00:{step:02d},000 - root - INFO - {ESC}[31mstep: {step:2}  "
            f"{ESC}[32mloss:  3.21000  {ESC}[38;2;180;60;0mgrad_norm:  1.2000  {ESC}[38;2;54;234;195mmemory: "
            f"{memory}GiB(52.22%)  {ESC}[34mtps: {tps}  {ESC}[36mtflops: 141.20  {ESC}[35mmfu: {mfu}{ESC}[39m")


def test_a_quantized_torchtitan_runs_log_is_read_its_mfu_left_to_the_tokens():
    """torchtitan prints `mfu: N/A` when a Float8 or MX converter is on (f113706c4, 2026-02-28): every step line
    of such a run failed the step pattern, and calibrate --from-log refused the log as in neither format."""
    text = "\n".join(_titan_line(step, memory, tps, "N/A")
                     for step, memory, tps in ((1, "40.10", "9,000"), (10, "41.30", "11,850"), (20, "41.00", "11,950")))
    log = fromlog.parse(text)
    assert log is not None and log.framework == "torchtitan" and log.steps == 3
    assert log.ranks[0].reserved_bytes == round(41.30 * GIB)
    assert log.tokens_per_s_per_gpu == pytest.approx((11_850 + 11_950) / 2) and log.mfu is None
    prediction = fromlog.Prediction(static_bytes=[2 * GIB], peak_bytes=[40 * GIB], reserved_bytes=[44 * GIB],
                                    iteration_ms=1000.0, tokens_per_s_per_gpu=10_000.0, mfu=0.4, world=8,
                                    tokens_per_gpu_step=10_000.0)
    mfu = next(r for r in fromlog.residuals(log, prediction) if r.term == "MFU")
    assert mfu.logged == pytest.approx(0.4 * 11_900 / 10_000)  # derived from the logged tokens/s, as Megatron's


def test_a_line_with_its_mfu_still_reads_it():
    log = fromlog.parse(_titan_line(10, "41.30", "11,850", "45.30%"))
    assert log.mfu == pytest.approx(0.453) and log.tokens_per_s_per_gpu == 11_850


def test_calibrate_from_log_takes_a_float8_runs_log(tmp_path):
    config = tmp_path / "llama3_8b_float8.toml"
    shipped = (FIXTURES / "configs" / "torchtitan_llama3_8b.toml").read_text()
    assert "[model]" in shipped
    config.write_text(shipped.replace("[model]", '[model]\nconverters = ["float8"]', 1))
    path = tmp_path / "train.log"
    path.write_text("\n".join(_titan_line(step, "60.00", "5,400", "N/A") for step in (1, 10, 20)) + "\n")
    report = json.loads(run_ok("calibrate", "--from-log", path, "--from-torchtitan", config, "--gpus", "8",
                               "--json").stdout)
    by = {(r["rank"], r["term"]): r for r in report["residuals"]}
    assert by[(0, "reserved peak")]["logged"] == 60 * GIB
    assert by[(None, "tokens/s per GPU")]["logged"] == 5400


HYBRID_YAML = """MODEL_ARGS:
  --hidden-size: 1024
  --num-attention-heads: 16
  --hybrid-layer-pattern: M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-
  --spec: "[megatron.core.models.hybrid.hybrid_layer_specs hybrid_stack_spec]"
  --micro-batch-size: 4
  --global-batch-size: 32
  --seq-length: 1024
  --max-position-embeddings: 1024
  --vocab-size: 32000
  --tensor-model-parallel-size: 2
"""


@pytest.mark.parametrize("num_layers", ["", "  --num-layers: 24\n"])
def test_a_hybrid_models_yaml_is_refused_as_its_script_is(tmp_path, num_layers):
    """Megatron-LM's hybrid functional tests (tests/functional_tests/test_cases/hybrid/*/model_config.yaml at
    d98e8a64) give --hybrid-layer-pattern and no --num-layers (the pattern sets it): the reader asked for
    --num-layers, and with it given scored the Mamba stack as 24 GPT blocks, the pattern listed "unknown".
    A script running pretrain_hybrid.py was already refused; the YAML names no trainer."""
    path = tmp_path / "model_config.yaml"
    path.write_text(HYBRID_YAML + num_layers)
    result = run("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "a100-80g")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and result.output.strip().count("\n") == 0
    assert "gives --hybrid-layer-pattern M-M-M-M*-" in said and "a hybrid of Mamba, attention and MoE layers" in said
    assert "--num-layers" not in said


GPT_YAML = """MODEL_ARGS:
  --num-layers: 4
  --hidden-size: 256
  --num-attention-heads: 4
  --ffn-hidden-size: 1024
  --seq-length: 512
  --max-position-embeddings: 512
  --micro-batch-size: 1
  --global-batch-size: 8
  --vocab-size: 1024
"""


@pytest.mark.parametrize("precision, status", [("", ("not given", "not modelled")),
                                               ("  --bf16: false\n", ("false", "not modelled")),
                                               ("  --bf16: true\n", ("", "modelled")),
                                               ("  --fp16: true\n", None)])
def test_a_megatron_fp32_run_says_its_activations_and_matmuls_are_scored_as_bf16(tmp_path, precision, status):
    """Without --bf16 or --fp16 Megatron-LM trains fp32 (arguments.py 1194-1206 at d98e8a64): the reader set fp32
    weights, gradients and Adam state, and the analytic profile, always bfloat16, timed the matmuls at 16-bit
    tensor-core rates and kept 2-byte activations, with no word that the run's are fp32."""
    path = tmp_path / "model_config.yaml"
    path.write_text(GPT_YAML + precision)
    report = json.loads(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--json").stdout)
    said = {s["name"]: (s["value"], s["status"]) for s in report["settings"]}
    assert said.get("--bf16") == status
    assert [s["name"] for s in report["settings"]].count("--bf16") == (status is not None)
    # fp16mp: --fp16 is fp16-mixed, a precision of its own (it was read as bf16-mixed)
    assert report["precision"] == ("fp32" if precision in ("", "  --bf16: false\n") else
                                   "fp16-mixed" if "--fp16" in precision else "bf16-mixed")
    if status and status[1] == "not modelled":
        what = next(s["what"] for s in report["settings"] if s["name"] == "--bf16")
        assert "activations and matmuls as bf16" in what


@pytest.mark.parametrize("param, status", [('"float32"', "not modelled"), ('"bfloat16"', "modelled")])
def test_a_torchtitan_fp32_run_says_its_activations_and_matmuls_are_scored_as_bf16(tmp_path, param, status):
    """training.mixed_precision_param = "float32": FSDP2 computes in fp32, which the bf16 analytic profile times and
    sizes as bf16; it was listed "modelled"."""
    shipped = (FIXTURES / "configs" / "torchtitan_llama3_8b.toml").read_text()
    assert "[training]" in shipped and "mixed_precision_param" not in shipped
    config = tmp_path / "llama3_8b.toml"
    config.write_text(shipped.replace("[training]", f"[training]\nmixed_precision_param = {param}", 1))
    report = json.loads(run_ok("evaluate", "--from-torchtitan", config, "--gpus", "8", "--json").stdout)
    said = {s["name"]: s for s in report["settings"]}
    assert said["training.mixed_precision_param"]["status"] == status
    assert report["precision"] == ("fp32" if status == "not modelled" else "bf16-mixed")
    assert ("activations and matmuls as bf16" in said["training.mixed_precision_param"]["what"]) == (
        status == "not modelled")


def test_a_known_torchtitan_base_beside_a_profile_without_model_dimensions_is_said_checked_by_depth_only(tmp_path):
    """A --fake (or measured) profile records no model dimensions: export --to torchtitan --torchtitan-base
    ...llama3.config_registry:llama3_8b wrote a Llama-3-8B config for a phi-3-mini plan (32 layers of 3072, both
    32 deep) without a word, _check_base_model having nothing to compare. Here an analytic profile with its model
    record dropped stands for one (a fake profile at full size takes minutes)."""
    profile, plan = tmp_path / "p.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", "qwen3-0.6b", "--seq-len", "64", "--gpu", "h100", "--out", profile)
    module = "torchtitan.models.qwen3.config_registry"
    run_ok("solve", "--profile", profile, "--stages", "1", "--mem", "80GB", "--runtime", "torchtitan", "--out", plan)
    said = " ".join(run_ok("export", plan, "--to", "torchtitan", "--torchtitan-base", f"{module}:qwen3_0_6b",
                           "--out", tmp_path / "a.py").output.split())
    assert "records no model dimensions" not in said
    data = json.loads(profile.read_text())
    del data["assumptions"]["model"]
    profile.write_text(json.dumps(data))
    run_ok("solve", "--profile", profile, "--stages", "1", "--mem", "80GB", "--runtime", "torchtitan", "--out", plan)
    said = " ".join(run_ok("export", plan, "--to", "torchtitan", "--torchtitan-base", f"{module}:qwen3_0_6b",
                           "--out", tmp_path / "b.py").output.split())
    assert (f"--torchtitan-base {module}:qwen3_0_6b builds qwen3-0.6b, and the plan's profile (a model file's, "
            "measured or --fake) records no model dimensions: only its depth was checked") in said
