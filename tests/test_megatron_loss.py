"""Megatron-LM's own vocab-parallel cross-entropy in place of the profile's eager loss (planner/cost/megatron_loss.py),
counted by hand on a tiny GPT, and the two NaN fills deterministic mode adds to it watched as torch makes them."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from planner.cost import megatron_loss, runtimes
from planner.cost.chunked import schedule_of, stages_view
from planner.cost.terms import Context, stage_value
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

# per device: 64 tokens x 4 sequences, the vocabulary 384 (padded to 128 a TP rank: unchanged) over TP 2
LOGITS = 64 * 4 * 384 // 2
H100_LOSS_TBPS, H100_HBM_TBPS = 1.30985, 3.35  # Liger-Kernel's cross-entropy on H100 (the profile's loss class); datasheet
# Megatron's own chains timed whole on an H100 SXM (membound_published.MEGATRON_CE_H100): unfused 0.788, fused 0.693
H100_CHAIN_TBPS, H100_FUSED_CHAIN_TBPS = 0.788 * 3.35, 0.693 * 3.35


def _setup(runtime="megatron", stages=1, **training) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=max(stages, 1), micro_batch_size=4, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime=runtime, dp=2, zero=1, **training)


def _profile(gpu="h100"):
    arch = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=256, intermediate_size=1024, num_layers=2, num_heads=8,
                      num_kv_heads=8, vocab_size=384, tie_word_embeddings=False, max_position_embeddings=64)
    return analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=2), gpu=archs.gpu(gpu),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def test_megatrons_cross_entropy_beyond_the_eager_loss_by_hand():
    profile = _profile()
    assert megatron_loss.runs_own_ce(profile, _setup()) == LOGITS
    # 52 B a logit at the chain's published rate, less the profile's 2 x 2 + 32 at the loss rate
    plain = LOGITS * (52 / H100_CHAIN_TBPS - 36 / H100_LOSS_TBPS) / 1e12 * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup()) == pytest.approx(plain, rel=1e-9)
    # deterministic mode: the fp32 copy (4 B) and the cast back (2 B) NaN-filled first, at the HBM bandwidth
    filled = plain + LOGITS * 6 / (H100_HBM_TBPS * 1e12) * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(deterministic=True)) == pytest.approx(filled, rel=1e-9)


def test_only_the_last_stage_and_only_megatrons_own_loss():
    profile = _profile()
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(stages=2)) == 0.0
    assert megatron_loss.vocab_parallel_ce_ms(profile, 1, _setup(stages=2)) == pytest.approx(
        megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup()), rel=1e-9)  # negative on the H100: the chain's rate
    # Transformer Engine's fused cross-entropy: its own 10 B a logit (tests/test_te_cross_entropy.py); another
    # runtime's loss: the profile's as timed
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(te_cross_entropy=True)) == pytest.approx(
        LOGITS * (10 - 36) / (H100_LOSS_TBPS * 1e12) * 1e3, rel=1e-9)
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(runtime="torchtitan")) == 0.0
    assert runtimes.of(_setup(runtime="torchtitan").training).vocab_parallel_ce_bytes == 0


def test_the_stage_sums_carry_it_as_a_time_row():
    profile, setup = _profile(), _setup(deterministic=True)
    view = stages_view(setup, schedule_of(setup))
    with_ce = stage_value("time", 0, Context(profile, view))
    te = _setup(deterministic=True, te_cross_entropy=True)  # TE's loss in place of Megatron's own (10 B a logit)
    without = stage_value("time", 0, Context(profile, te))
    assert with_ce - without == pytest.approx(megatron_loss.vocab_parallel_ce_ms(profile, 0, setup)
                                              - megatron_loss.vocab_parallel_ce_ms(profile, 0, te), rel=1e-9)


class _VocabCE(torch.autograd.Function):
    """The op sequence of Megatron-LM 6e091e1b's _VocabParallelCrossEntropy at TP 1 (no all-reduce), as the
    module's docstring lists it."""

    @staticmethod
    def forward(ctx, logits, target):
        x = logits.float()
        x -= torch.max(x, dim=-1)[0].unsqueeze(-1)
        picked = x.gather(-1, target.unsqueeze(-1)).squeeze(-1).clone()
        torch.exp(x, out=x)
        total = x.sum(dim=-1)
        x.div_(total.unsqueeze(-1))
        ctx.save_for_backward(x, target)
        return torch.log(total) - picked

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target = ctx.saved_tensors
        rows = torch.arange(softmax.size(0))
        softmax[rows, target] -= 1.0
        softmax.mul_(grad_output.unsqueeze(-1))
        return softmax, None


def test_deterministic_mode_fills_the_fp32_copy_and_the_cast_back_and_nothing_else_of_the_logits_size():
    tokens, vocab = 16, 300
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            _VocabCE.apply(logits, target).sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)
    events = [e for e in prof.events() if e.input_shapes and e.input_shapes[0] == [tokens, vocab]]
    fills = [e for e in events if e.name == "aten::fill_"]
    copies = [e for e in events if e.name == "aten::_to_copy"]
    # .float() and autograd's cast of the fp32 gradient to the logits' bf16: each an empty_strided filled first
    assert len(copies) == 2 and len(fills) == 2
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
