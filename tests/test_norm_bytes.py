"""Each architecture's eager RMSNorm charged at its own bytes (planner/profiler/norm_bytes.py): LLaMA's and Gemma's,
by hand on a tiny Gemma 3 block (four norms, q/k norms), the checkpoint's early stop inside Gemma 3's post-MLP norm,
what Transformer Engine's fused norm saves, and transformers' own modules counted op by op by OpBytes where
transformers is installed."""

from __future__ import annotations

import dataclasses

import pytest

from planner.models import archconfig
from planner.profiler import analytic_time, formulas, norm_bytes, te_fused
from planner.profiler.formulas import Shape

# hidden 64, 4 heads of 32, 2 K/V heads, MLP 128 (tests/test_gemma3.py's), every 2nd layer global
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256,
          "max_position_embeddings": 512, "sliding_window": 64, "sliding_window_pattern": 2, "pad_token_id": 0,
          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}
T, H, Q, KV = 64, 64, 4 * 32, 2 * 32
SHAPE = Shape(seq_len=T, micro_batch_size=1)


def _gemma(fp32_scale: bool = True):
    arch = archconfig.from_hf_config(GEMMA3, where="config.json", name="tiny").layer(0)
    return dataclasses.replace(arch, fp32_norm_scale=fp32_scale)


def _norm_bytes(arch) -> tuple[int, int]:
    fwd, bwd, _ = analytic_time.block_work(arch, SHAPE)
    return dict(fwd.classed)["norm"], dict(bwd.classed)["norm"]


def test_the_record_is_the_architectures_norm():
    assert norm_bytes.rms_norm(_gemma()) is norm_bytes.GEMMA
    assert norm_bytes.rms_norm(_gemma(fp32_scale=False)) is norm_bytes.LLAMA


def test_gemma3_blocks_norms_by_hand():
    """Four norms over T x h and the q/k norms over T x (q + kv) (per head, no per-row bytes: _projections'), at
    Gemma's 40 / 108 B an element and 28 / 44 a row; backward, the residual stream's gradient sums (2 x 6 B an
    element) land in the norms' class too (analytic_time.block_work)."""
    fwd, bwd = _norm_bytes(_gemma())
    assert fwd == 4 * (40 * T * H + 28 * T) + 40 * T * (Q + KV)
    assert bwd == 4 * (108 * T * H + 44 * T) + 108 * T * (Q + KV) + 2 * 6 * T * H
    llama_fwd, llama_bwd = _norm_bytes(_gemma(fp32_scale=False))  # the same block on LLaMA's norm
    assert (fwd - llama_fwd, bwd - llama_bwd) == (4 * T * (4 * H + Q + KV), 12 * T * (4 * H + Q + KV))


def test_the_final_norm_and_a_norms_rerun_are_the_architectures():
    fwd, bwd, rerun = analytic_time.head_work(_gemma(), SHAPE)
    assert (dict(fwd.classed)["norm"], dict(bwd.classed)["norm"]) == (40 * T * H + 28 * T, 108 * T * H + 44 * T)
    assert dict(rerun.classed)["norm"] == 40 * T * H + 28 * T
    assert analytic_time.rerun_work(_gemma(), SHAPE, "norm").bytes == 40 * T * H + 28 * T


def test_the_norm_weights_gradients_by_hand():
    """W's share: Gemma's fp32 product and sum, 16 B an element, the gradient written in fp32 and cast back, 10 B an
    element of the weight; four norms of width 64 and the q/k norms of head_dim 32 (LLaMA's: 8 and 2)."""
    elements, widths = 4 * T * H + T * (Q + KV), 4 * H + 2 * 32
    assert analytic_time.norm_weight_grad_bytes(_gemma(), SHAPE) == 16 * elements + 10 * widths
    assert analytic_time.norm_weight_grad_bytes(_gemma(fp32_scale=False), SHAPE) == 8 * elements + 2 * widths


def test_gemma3s_rerun_stops_at_the_post_mlp_norms_product():
    """torch's checkpoint reruns the whole block (the post-MLP norm keeps the down projection's output) but stops
    at the last save, the scale's product's inputs: the product (8 B an element in fp32), the cast back (6) and the
    residual add (6) are not rerun; LLaMA's norm there would skip its weight's product (4)."""
    for fp32_scale, tail in ((True, 14), (False, 4)):
        arch = _gemma(fp32_scale)
        fwd, _, rerun = analytic_time.block_work(arch, SHAPE)
        assert rerun.flops == fwd.flops == formulas.block_flops(arch, SHAPE)
        assert fwd.bytes - rerun.bytes == (6 + tail) * T * H
        assert dict(fwd.classed)["norm"] - dict(rerun.classed)["norm"] == tail * T * H


def test_te_fused_norm_saves_the_architectures_eager_figure():
    """TE's norm inside linear_qkv and linear_fc1 (4 B an element and 4 a row forward, 6 and 4 backward) in place
    of the block's two eager norms: what it saves is the architecture's own eager figure less TE's."""
    shape = Shape(seq_len=T, micro_batch_size=1, attention="flash")
    for arch, (fwd, bwd) in ((_gemma(), (40, 108)), (_gemma(fp32_scale=False), (36, 96))):
        saved = te_fused._norms_saved(arch, T, H)
        assert saved == (2 * ((fwd - 4) * T * H + (28 - 4) * T), 2 * ((bwd - 6) * T * H + (44 - 4) * T))
    gemma, llama = te_fused.fused_bytes_saved(_gemma(), shape), te_fused.fused_bytes_saved(_gemma(False), shape)
    # the two norms TE fuses (2 x 4 and 2 x 12 B an element) and the q/k norms' eager bytes (4 and 12 more)
    assert (gemma[0] - llama[0], gemma[1] - llama[1]) == (4 * T * (2 * H + Q + KV), 12 * T * (2 * H + Q + KV))


@pytest.mark.parametrize("module_path, record", [
    ("transformers.models.llama.modeling_llama.LlamaRMSNorm", norm_bytes.LLAMA),
    ("transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm", norm_bytes.GEMMA),
    ("transformers.models.gemma.modeling_gemma.GemmaRMSNorm", norm_bytes.GEMMA),
])
def test_transformers_modules_move_the_records_bytes_an_element(module_path, record):
    """transformers' own module in bf16 under FakeTensorMode, forward and backward counted by OpBytes at three
    shapes (rows n, width h): bytes = a n h + b n + c h solved exactly; a is the record's, each way."""
    pytest.importorskip("transformers")
    import importlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner.profiler.fake import OpBytes

    module_name, _, class_name = module_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)

    def moved(n: int, h: int) -> tuple[int, int]:
        norm = cls(h).to(torch.bfloat16)
        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.randn(1, n, h, dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(1, n, h, dtype=torch.bfloat16)
            with OpBytes() as counted:
                y = norm(x)
                fwd = counted.bytes
                y.backward(grad)
        return fwd, counted.bytes - fwd

    base, wider, longer = moved(64, 128), moved(64, 256), moved(128, 128)
    for way, per_element in ((0, record.fwd), (1, record.bwd)):
        # base = a·8192 + b·64 + c·128, wider - base = a·8192 + c·128, longer - base = a·8192 + b·64
        by_width, by_rows = wider[way] - base[way], longer[way] - base[way]
        assert by_width + by_rows - base[way] == per_element * 64 * 128
