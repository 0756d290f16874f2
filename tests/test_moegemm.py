"""A Megatron-core MoE block's eager pieces around Transformer Engine's kernels (planner/profiler/te_moe_eager.py,
megatron-core 92c8482e, TE v2.9): GPT-OSS's clamp before the fused GLU, linear_fc2's weighted bias expert by expert,
FP8's row padding; the flags read; each figure against ckplan's op-by-op count of the code and each record's time
by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fixtures.scripts import load_script

from planner.cli import cli
from planner.errors import UserError
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic_time, te_fused, te_moe_eager
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms

ROWS = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"
TINY = [("--num-layers", ["2"]), ("--hidden-size", ["64"]), ("--num-attention-heads", ["4"]),
        ("--seq-length", ["512"]), ("--vocab-size", ["256"]), ("--quick-geglu", []), ("--num-experts", ["8"]),
        ("--moe-router-topk", ["2"]), ("--moe-ffn-hidden-size", ["32"])]


def _job(name: str):
    return megatron.read(ROWS / f"{name}.yaml")


def _shape(job) -> Shape:
    return Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                 ep=job.ep)


def test_the_figures_are_the_op_by_op_count_of_megatrons_code():
    script = load_script("megatron_moe_opbytes")
    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    rows, f = 256, 64
    fwd, bwd = script.counted(script.clamp_cat, torch.randn(rows, 2 * f, **bf16))
    assert fwd == te_moe_eager.CLAMP_FWD * rows * f
    assert 0 <= bwd - te_moe_eager.CLAMP_BWD * rows * f <= 8  # + clamp_backward's scalar zeros, a few bytes
    h, experts = 64, 4
    out, probs = torch.randn(rows, h, **bf16), torch.rand(rows, 1, **bf16)
    biases = [torch.randn(h, **bf16) for _ in range(experts)]
    fwd, bwd = script.counted(lambda o, p, *b: script.apply_bias(o, list(b), [rows // experts] * experts, p),
                              out, probs, *biases)
    # beyond the per-element figures: the probs read per row and the bias vectors (forward), their gradients (backward)
    assert 0 <= fwd - te_moe_eager.APPLY_BIAS_FWD * rows * h <= 2 * rows * experts + 2 * h * experts
    assert 0 <= bwd - te_moe_eager.APPLY_BIAS_BWD * rows * h <= 8 * rows * experts + 8 * h * experts


def test_the_gpt_oss_rows_read_the_clamp_and_the_experts_biases_and_qwen3_neither():
    for name in ("b200_gptoss_120b_bf16", "gb200_gptoss_120b_bf16", "h100_gptoss_120b_bf16"):
        arch = _job(name).arch
        assert (arch.swiglu_limit, arch.expert_bias) == (7.0, True)
    for name in ("h100_qwen3_30b_fp8cs", "gb200_qwen3_235b_bf16", "gb200_dsv3_bf16"):
        arch = _job(name).arch
        assert (arch.swiglu_limit, arch.expert_bias) == (None, False)


def test_biases_follow_megatrons_default_and_disable_bias_linear():
    assert megatron.from_pairs(TINY, "t.sh").arch.expert_bias  # add_bias_linear is Megatron-LM's default
    assert not megatron.from_pairs(TINY + [("--disable-bias-linear", [])], "t.sh").arch.expert_bias
    assert megatron.from_pairs(TINY + [("--add-bias-linear", [])], "t.sh").arch.expert_bias


@pytest.mark.parametrize("value", ["0", "-7"])
def test_a_clamp_that_is_not_positive_is_refused_in_one_sentence(value):
    with pytest.raises(UserError, match="not a positive number"):
        megatron.from_pairs(TINY + [("--activation-func-clamp-value", [value])], "t.sh")


def test_the_refusal_reaches_the_user_without_a_traceback(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                      + " --activation-func-clamp-value 0 --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code != 0 and "not a positive number" in result.output
    assert "Traceback" not in result.output


def test_e3s_block_gains_the_clamp_and_the_weighted_bias_at_the_eager_rate():
    job = _job("b200_gptoss_120b_bf16")
    shape, gpu = _shape(job), archs.gpu("b200")
    plain = dataclasses.replace(job.arch, swiglu_limit=None, expert_bias=False)

    def timed(arch):
        return te_fused.te_time(arch, shape, gpu, analytic_time.block_work(arch, shape, moe=True), moe=True)

    S = job.micro_batch_size * job.seq_len * 4  # 16,384 tokens x top-4: 65,536 copies on the rank's 2 experts (EP 64, framework-facts §157)
    f = h = 2880
    assert S == 65536 and te_moe_eager.eager_bytes(job.arch, shape) == (16 * S * f + 12 * S * h, 30 * S * f + 16 * S * h)
    before, after = timed(plain), timed(job.arch)
    # each at its class's rate (the clamp in the activation function, the bias's products and add elementwise:
    # te_moe_eager.eager_classes, tests/test_teclasses.py)
    assert after.fwd_ms - before.fwd_ms == pytest.approx(
        membound_ms(16 * S * f, gpu, "eager", "activation") + membound_ms(12 * S * h, gpu, "eager", "elementwise"), rel=1e-9)
    # moe_act's rerun: the compiled GLU's fused bytes and the clamp again, eager
    assert after.recompute_ms["mlp-act"] - before.recompute_ms["mlp-act"] == pytest.approx(
        membound_ms(16 * S * f, gpu, "eager", "activation"), rel=1e-9)


def test_e2s_fp8_block_pads_and_unpads_each_way_at_the_fused_rate(monkeypatch):
    job = _job("h100_qwen3_30b_fp8cs")
    shape, gpu = _shape(job), archs.gpu("h100")
    S, h = 4096 * 8, 2048  # MBS 1 (the preset's, framework-facts §171): 4,096 tokens x top 8
    assert te_moe_eager.fp8_padding_bytes(job.arch, shape) == (8 * S * h, 8 * S * h)

    def record():
        return te_fused.te_time(job.arch, shape, gpu, analytic_time.block_work(job.arch, shape, moe=True),
                                moe=True).float8

    padded = record()
    monkeypatch.setattr(te_moe_eager, "fp8_padding_bytes", lambda arch, shape: (0, 0))
    unpadded = record()
    one_way = membound_ms(8 * S * h, te_fused.te_attention_gpu(gpu), "fused")
    assert padded.fwd_ms - unpadded.fwd_ms == pytest.approx(one_way, rel=1e-9)
    assert padded.bwd_ms - unpadded.bwd_ms == pytest.approx(one_way, rel=1e-9)


def test_no_padding_without_local_experts_and_no_eager_bytes_on_qwen3():
    job = _job("h100_qwen3_30b_fp8cs")  # only its router's aux loss (tests/test_moe_aux_loss.py)
    assert te_moe_eager.eager_bytes(job.arch, _shape(job)) == te_moe_eager.aux_loss_bytes(job.arch, _shape(job))
    assert te_moe_eager.eager_expert_bias_bytes(job.arch, _shape(job)) == (0, 0)
    dense = dataclasses.replace(job.arch, num_experts=0)
    assert te_moe_eager.fp8_padding_bytes(dense, _shape(job)) == (0, 0)


def test_the_unfused_rotary_figures_are_the_op_by_op_count():
    script = load_script("megatron_moe_opbytes")
    seq, heads, dim = 64, 64, 64
    q = torch.randn(seq, 1, heads, dim, dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = script.counted(script.rotary_bshd, q, torch.randn(seq, 1, 1, dim, dtype=torch.float32))
    tables = 48 * seq * dim  # cos and sin per position, their mscale and cast: not charged (1/heads of Q's)
    assert 0 <= fwd - te_moe_eager.UNFUSED_ROPE_FWD * q.numel() <= tables
    assert 0 <= bwd - te_moe_eager.UNFUSED_ROPE_BWD * q.numel() <= 4 * seq * dim


def test_yarn_above_one_on_gpt_oss_runs_the_unfused_rotary_and_not_on_a_latent_attention():
    gpt_oss = _job("b200_gptoss_120b_bf16").arch
    assert gpt_oss.rope_scaling == ("yarn", 32.0, None) and te_moe_eager.unfused_rotary(gpt_oss)
    assert not te_moe_eager.unfused_rotary(_job("gb200_dsv3_bf16").arch)  # MLA: te_mla's rotary
    assert not te_moe_eager.unfused_rotary(_job("h100_qwen3_30b_fp8cs").arch)
    rope = [("--position-embedding-type", ["yarn"])]
    assert megatron.from_pairs(TINY + rope + [("--rotary-scaling-factor", ["1.0"])], "t.sh").arch.rope_scaling is None
    with pytest.raises(UserError, match="not a positive number"):
        megatron.from_pairs(TINY + rope + [("--rotary-scaling-factor", ["0"])], "t.sh")


def test_e3s_unfused_rotary_by_hand():
    job = _job("b200_gptoss_120b_bf16")
    shape, gpu = _shape(job), archs.gpu("b200")
    fused = dataclasses.replace(job.arch, rope_scaling=None)

    def fwd_ms(arch):
        return te_fused.te_time(arch, shape, gpu, analytic_time.block_work(arch, shape, moe=True), moe=True).fwd_ms

    rotated = 16384 * (64 * 64 + 8 * 64)  # Q's 64 heads and K's 8, head dim 64
    # the eager remainder gains Megatron's 24 B an element of Q and K (attention, rotary's class); the fused bytes
    # lose TE's rotary (4 B)
    expected = (membound_ms(te_moe_eager.UNFUSED_ROPE_FWD * rotated, gpu, "eager", "attention")
                - membound_ms(4 * rotated, te_fused.te_attention_gpu(gpu), "fused"))
    assert fwd_ms(job.arch) - fwd_ms(fused) == pytest.approx(expected, rel=1e-9)
