"""Defects found in stop 55's merge (docs/published-runs.md §35.review), each pinned by hand counts on tiny cases."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost.float8 import float8_profile
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.profiler.membound import membound_ms
from planner.schema import FileRef, TrainSetup

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 query heads and 2 K/V heads of 16, SwiGLU width 160, untied vocabulary of 128
TINY = archs.Arch(name="tiny-llama-r56", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=1024)
SHAPE = Shape(seq_len=128, micro_batch_size=2)
BLOCK_PARAMS = 64 * (64 + 2 * 32) + 64 * 64 + 3 * 64 * 160 + 2 * 64  # qkv, o, gate/up/down, two norms
HEAD_WEIGHT = 128 * 64  # the output layer's weight (the final norm's 64 take the DDP hook)


def _setup(**fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                      runtime="megatron", **fields)


def _eager(num_params: int) -> float:
    """The eager .grad accumulation's pass over `num_params` bf16 gradients (3 x 2 B each, class elementwise)."""
    return membound_ms(6 * num_params, H100, "eager", "elementwise")


def _by_name(profile):
    return {layer.name: layer for layer in profile.layers}


def test_megatrons_output_layer_accumulates_its_weight_gradient_in_the_gemm():
    """Megatron-core's output layer is its own ColumnParallelLinear, built with gradient_accumulation_fusion: its
    wgrad runs fused_weight_gradient_mlp_cuda into main_grad (layers.py), no eager .grad pass."""
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    head = profile.layers[-1]
    assert head.wgrad_accumulate_ms == pytest.approx(_eager(HEAD_WEIGHT), rel=1e-12)
    fused = float8_profile(profile, _setup()).layers[-1]
    unfused = float8_profile(profile, _setup(unfused_grad_accumulation=True)).layers[-1]
    assert fused.bwd_ms == pytest.approx(head.bwd_ms - _eager(HEAD_WEIGHT), rel=1e-12)
    assert (fused.bwd_ms_min, fused.bwd_ms_max) == (fused.bwd_ms, fused.bwd_ms)
    assert unfused.bwd_ms == head.bwd_ms and fused.fwd_ms == head.fwd_ms


def test_a_block_without_a_te_record_drops_its_eager_accumulation_too():
    """Eager attention leaves a block without a TE record (te_fused.fused_bytes_saved; Qwen3's q/k norms did until
    §35.qknorm): its linears are still TE's, built with fuse_wgrad_accumulation, so the eager pass goes as on the
    record's blocks."""
    qk = dataclasses.replace(TINY, name="tiny-qk-r56", qk_norm=True, head_dim=16)
    profile = analytic.analytic_profile(qk, dataclasses.replace(SHAPE, attention="eager"), gpu=H100, model=REF)
    block = profile.layers[1]
    assert block.te_time is None
    held = BLOCK_PARAMS + 2 * 16  # q_norm and k_norm: a weight of head_dim each
    assert block.param_count == held
    assert block.wgrad_accumulate_ms == pytest.approx(_eager(held), rel=1e-12)
    fused = float8_profile(profile, _setup()).layers[1]
    assert fused.bwd_ms == pytest.approx(block.bwd_ms - _eager(held), rel=1e-12)
    assert float8_profile(profile, _setup(unfused_grad_accumulation=True)).layers[1].bwd_ms == block.bwd_ms


def test_other_runtimes_keep_the_eager_accumulation():
    profile = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    titan = TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                       runtime="torchtitan")
    assert [layer.bwd_ms for layer in float8_profile(profile, titan).layers] == [layer.bwd_ms for layer in profile.layers]


def test_the_mtp_layers_eh_proj_and_shared_head_fuse_as_the_decoders_do():
    """The MTP body's record holds eh_proj's backward (a ColumnParallelLinear, fused too); the MTP head's GEMM is the
    shared output weight's second wgrad, accumulated into the same main_grad."""
    shape = dataclasses.replace(SHAPE, mtp=1)
    profile = analytic.analytic_profile(TINY, shape, gpu=H100, model=REF)
    layers = _by_name(profile)
    body, mtp_head = layers["mtp.0"], layers["mtp.0.head"]
    eh_proj = 2 * 64 * 64
    assert body.te_time.accumulate_ms == pytest.approx(_eager(BLOCK_PARAMS + eh_proj), rel=1e-12)
    assert mtp_head.wgrad_accumulate_ms == pytest.approx(_eager(HEAD_WEIGHT), rel=1e-12)
    fused, unfused = (_by_name(float8_profile(profile, _setup(unfused_grad_accumulation=off)))
                      for off in (False, True))
    assert unfused["mtp.0"].bwd_ms - fused["mtp.0"].bwd_ms == pytest.approx(_eager(BLOCK_PARAMS + eh_proj), rel=1e-9)
    assert fused["mtp.0.head"].bwd_ms == pytest.approx(mtp_head.bwd_ms - _eager(HEAD_WEIGHT), rel=1e-12)
    assert unfused["mtp.0.head"].bwd_ms == mtp_head.bwd_ms


MEGATRON = [("--num-layers", ["2"]), ("--hidden-size", ["256"]), ("--num-attention-heads", ["4"]),
            ("--seq-length", ["128"]), ("--max-position-embeddings", ["128"]), ("--vocab-size", ["1024"])]


def _said(pairs) -> dict[str, tuple[str, str, str]]:
    from planner.models.configs.megatron import from_pairs

    job = from_pairs([*MEGATRON, *pairs], "run.sh")
    return {s.name: (s.value, s.status, s.what) for s in job.settings}, job


def test_a_norm_kind_the_block_does_not_build_is_not_modelled():
    """--normalization was listed "modelled (the same bytes)" and never read: the reader builds the norm from the MLP
    (--swiglu: RMSNorm, else LayerNorm). A kind that block does not have is listed not modelled, with what differs
    (TransformerConfig.normalization, transformer_config.py 256 at d98e8a64: LayerNorm by default)."""
    said, job = _said([("--normalization", ["RMSNorm"])])  # a GPT block (GELU) with RMSNorm
    assert job.arch.style == "gpt"
    assert said["--normalization"][:2] == ("RMSNorm", "not modelled")
    assert "LayerNorm" in said["--normalization"][2]
    said, job = _said([("--swiglu", []), ("--normalization", ["RMSNorm"])])
    assert job.arch.style == "llama" and said["--normalization"][:2] == ("RMSNorm", "modelled")
    said, _ = _said([("--normalization", ["LayerNorm"])])
    assert said["--normalization"][:2] == ("LayerNorm", "modelled")
    # --swiglu under Megatron's default LayerNorm: not given, said in the notes
    said, job = _said([("--swiglu", [])])
    assert "--normalization" not in said
    assert any(note.startswith("--normalization LayerNorm (Megatron-LM's default)") for note in job.notes)
