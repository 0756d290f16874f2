"""`ckplan profile --fused-softmax`: eager attention's causal softmax as Megatron's FusedScaleMaskSoftmax runs it
(docs/framework-facts.md §894), by hand."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.models import archs
from planner.profiler import analytic_time
from planner.profiler.formulas import Shape

SCORES = 96 * 512 * 512 * 2  # GPT-3 175B's heads x s² x micro-batch 2: 50,331,648 scores a block


def _attention_bytes(fused: bool) -> tuple[int, int, int]:
    shape = Shape(seq_len=512, micro_batch_size=2, attention="eager", dtype="float16", fused_softmax=fused)
    return tuple(dict(work.classed)["attention"] for work in analytic_time.block_work(archs.ARCHS["gpt3-175b"], shape))


def test_the_fused_kernel_and_its_dropout_move_8_and_9_bytes_a_score():
    # forward: the lower triangle read (1 B) and the row written (2 B), then the dropout's 2 + 2 + 1;
    # backward: gradient and output over the triangle (2 B), the row written (2 B), the dropout's 2 + 1 + 2
    assert (analytic_time.FUSED_SCORES_FWD, analytic_time.FUSED_SCORES_BWD) == (8, 9)
    qkv_cat = 4 * 1024 * 3 * 12288  # the backward's Q/K/V gradients concatenated (T = 1,024 tokens): 150,994,944
    assert _attention_bytes(True) == (8 * SCORES, 9 * SCORES + qkv_cat, 8 * SCORES)  # forward, backward, rerun
    assert _attention_bytes(True) == (402_653_184, 603_979_776, 402_653_184)
    # Hugging Face's op-by-op softmax, unchanged: 20 and 30 B a score
    assert _attention_bytes(False) == (20 * SCORES, 30 * SCORES + qkv_cat, 20 * SCORES)


def _config(folder):
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 1024, "n_layer": 2, "n_head": 8,
                                  "vocab_size": 1024, "n_positions": 4096,
                                  "activation_function": "gelu_pytorch_tanh"}))
    return config


def test_the_profile_charges_the_kernel_and_says_so(tmp_path):
    config = _config(tmp_path)
    common = ("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
              "--dtype", "fp16", "--attention", "eager")
    run_ok(*common, "--out", tmp_path / "eager.json")
    run_ok(*common, "--fused-softmax", "--out", tmp_path / "fused.json")
    eager, fused = io.load_profile(tmp_path / "eager.json"), io.load_profile(tmp_path / "fused.json")
    assert fused.assumptions["fused_softmax"] is True and "fused_softmax" not in eager.assumptions
    block_e, block_f = eager.layers[1], fused.layers[1]
    assert block_e.kind == "decoder_block"
    # 8 heads x 256² x 2 = 1,048,576 scores; 12 B a score less forward, 21 less backward, at the attention class's rate
    rate = eager.assumptions["membound_tbps"]["by_class"]["attention"] * 1e12
    scores = 8 * 256 * 256 * 2
    assert block_e.fwd_ms - block_f.fwd_ms == pytest.approx(12 * scores / rate * 1e3, rel=1e-9)
    assert block_e.bwd_ms - block_f.bwd_ms == pytest.approx(21 * scores / rate * 1e3, rel=1e-9)
    assert block_e.recompute_ms - block_f.recompute_ms == pytest.approx(12 * scores / rate * 1e3, rel=1e-9)
    assert block_f.act_bytes == block_e.act_bytes  # what it keeps is unchanged (Korthikanti's 5 B a score already)


@pytest.mark.parametrize("extra, said", [
    (("--attention", "flash"), "give --attention eager"),
    (("--attention", "eager", "--seq-len", 4096), "16 < --seq-len <= 2048"),
    (("--attention", "eager", "--seq-len", 258), "multiple of 4"),
])
def test_where_megatron_runs_no_fused_kernel_the_flag_is_refused(tmp_path, extra, said):
    args = ["profile", "--arch-config", _config(tmp_path), "--micro-batch-size", 2, "--gpu", "a100-80g",
            "--fused-softmax", "--out", tmp_path / "p.json"]
    if "--seq-len" not in extra:
        args += ["--seq-len", 256]
    result = run(*args, *extra)
    assert result.exit_code != 0 and said in result.output
    assert not (tmp_path / "p.json").exists()


def test_a_measured_model_refuses_the_flag(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("def build_model():\n    return None\n")
    result = run("profile", model, "--fused-softmax")
    assert result.exit_code != 0 and "--fused-softmax applies to --arch/--arch-config profiles only" in result.output
