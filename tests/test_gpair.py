"""Megatron-LM's own cross-entropy chains at their published whole-chain rate on Hopper (issue 35, branch gpair;
planner/models/membound_published.py MEGATRON_CE_H100, planner/cost/megatron_loss.py `_chain_tbps`)."""

from __future__ import annotations

import pytest

from planner.cost import megatron_loss, runtimes
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

# Liger-Kernel all_benchmark_data.csv at 2120862b, megatron_cross_entropy "full" medians on NVIDIA H100 80GB HBM3,
# S 2048, B 4, TP 1: V 65,536 and 131,072 (ms)
UNFUSED_MS = (10.667474746704102, 21.245800018310547)
FUSED_MS = (8.980452537536621, 18.230487823486328)
MORE_LOGITS = 2048 * 4 * (131072 - 65536)


def _setup(**training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=4, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime="megatron", dp=2, zero=1, **training)


def _profile(gpu: str):
    arch = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=256, intermediate_size=1024, num_layers=2, num_heads=8,
                      num_kv_heads=8, vocab_size=384, tie_word_embeddings=False, max_position_embeddings=64)
    return analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=1), gpu=archs.gpu(gpu),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def test_the_fractions_rebuild_the_published_times_from_the_records_bytes():
    h100, record = archs.gpu("h100"), runtimes.facts("megatron")
    fractions = dict(h100.megatron_ce_efficiency)
    for kind, counted, (small, large) in (("unfused", record.vocab_parallel_ce_bytes, UNFUSED_MS),
                                          ("fused", record.fused_ce_bytes, FUSED_MS)):
        ms = MORE_LOGITS * counted / (fractions[kind] * h100.hbm_tbps * 1e12) * 1e3
        assert ms == pytest.approx(large - small, rel=1e-3)  # the fraction is rounded to three places
    assert (record.vocab_parallel_ce_bytes, record.fused_ce_bytes) == (52, 40)  # the counts the fractions are for


def test_hopper_reads_the_chain_and_other_gpus_have_none():
    assert dict(archs.gpu("h100").megatron_ce_efficiency) == {"fused": 0.693, "unfused": 0.788}
    assert archs.gpu("h200").megatron_ce_efficiency == archs.gpu("h100").megatron_ce_efficiency  # H100's assumed
    for name in ("a100-80g", "gb200", "b200", "mi300x"):
        assert archs.gpu(name).megatron_ce_efficiency == ()


def test_without_a_published_chain_the_bytes_run_at_the_loss_class_as_before():
    profile = _profile("a100-80g")
    logits = megatron_loss.runs_own_ce(profile, _setup())
    assert logits == 64 * 4 * 384
    loss_tbps = profile.assumptions["membound_tbps"]["by_class"]["loss"]
    assert loss_tbps == pytest.approx(0.436 * 2.039)
    by_hand = logits * (52 - 36) / (loss_tbps * 1e12) * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup()) == pytest.approx(by_hand, rel=1e-9)


def test_on_the_h100_the_chain_is_timed_whole_and_te_s_loss_is_not_touched():
    profile = _profile("h100")
    logits, loss_tbps = 64 * 4 * 384, profile.assumptions["membound_tbps"]["by_class"]["loss"]
    chain = logits * 52 / (0.788 * 3.35e12) * 1e3  # the chain's published ps a logit
    own = logits * 36 / (loss_tbps * 1e12) * 1e3  # the profile's eager loss, which the term replaces
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup()) == pytest.approx(chain - own, rel=1e-9)
    assert chain < logits * 52 / (loss_tbps * 1e12) * 1e3 / 2  # at the loss class it took over twice as long
    te = megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(te_cross_entropy=True))
    assert te == pytest.approx(logits * (10 - 36) / (loss_tbps * 1e12) * 1e3, rel=1e-9)
