"""Megatron-LM launch scripts users have (examples/gptoss/02_train.sh at d98e8a64): a quick-GeGLU MLP
is gated as SwiGLU is, and a distributed optimizer over one data-parallel rank gathers nothing."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner.errors import UserError
from planner.models.configs import megatron

# a tiny GPT: h 64, 4 heads, ffn 96, vocab 256 (a multiple of 128: no padding)
TINY = ("--num-layers 2 --hidden-size 64 --ffn-hidden-size 96 --num-attention-heads 4 --seq-length 32 "
        "--vocab-size 256 --disable-bias-linear --position-embedding-type rope --bf16")


def _job(tmp_path, flags: str):
    path = tmp_path / "train.sh"
    path.write_text(f"torchrun --nproc_per_node 1 pretrain_gpt.py {flags}\n")
    return megatron.read(path)


def test_quick_geglu_is_gated_as_swiglu_is(tmp_path):
    # argument_utils.py 323-326 at d98e8a64: --quick-geglu sets gated_linear_unit=True, fc1 2 x ffn wide
    swiglu, geglu = _job(tmp_path, TINY + " --swiglu"), _job(tmp_path, TINY + " --quick-geglu")
    plain = _job(tmp_path, TINY)
    assert geglu.arch.style == swiglu.arch.style == "llama" and plain.arch.style == "gpt"
    assert geglu.arch.intermediate_size == swiglu.arch.intermediate_size == 96
    assert any("--quick-geglu" in note for note in geglu.notes)


def test_quick_geglu_keeps_megatrons_default_width(tmp_path):
    # arguments.py 1320-1329: the 8h/3 default is --swiglu's alone; --quick-geglu keeps 4 x hidden
    flags = TINY.replace("--ffn-hidden-size 96 ", "")
    assert _job(tmp_path, flags + " --quick-geglu").arch.intermediate_size == 4 * 64
    assert _job(tmp_path, flags + " --swiglu").arch.intermediate_size == 128  # int(4 x 64 x 2/3 / 64) x 64


def test_quick_geglu_experts_are_read(tmp_path):
    job = _job(tmp_path, TINY + " --quick-geglu --num-experts 4 --moe-router-topk 2")
    assert job.arch.num_experts == 4 and job.arch.style == "llama"


def test_swiglu_and_quick_geglu_together_are_refused(tmp_path):
    with pytest.raises(UserError, match="both --swiglu and --quick-geglu"):
        _job(tmp_path, TINY + " --swiglu --quick-geglu")


def test_the_distributed_optimizer_on_one_data_parallel_rank_gathers_nothing(tmp_path):
    # 02_train.sh: PP = the world size, so one data-parallel rank, with --use-distributed-optimizer and
    # --overlap-param-gather: Megatron-LM runs it; the evaluation says so instead of refusing it
    script = tmp_path / "train.sh"
    script.write_text(f"torchrun --nproc_per_node 2 pretrain_gpt.py {TINY} --swiglu --pipeline-model-parallel-size 2 "
                      "--micro-batch-size 1 --global-batch-size 4 --use-distributed-optimizer --overlap-grad-reduce "
                      "--overlap-param-gather\n")
    result = run_ok("evaluate", "--from-megatron", script, "--json")
    summary = json.loads(result.stdout)
    assert summary["dp"] == 1 and summary["zero"] == 0
    text = run("evaluate", "--from-megatron", script).output
    assert "--overlap-param-gather gathers nothing" in text
