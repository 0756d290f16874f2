"""GPT-OSS: parameters against a hand count and transformers' own module, the sliding window's pairs against a
brute-force mask, what its blocks keep, and torchtitan's gpt_oss config functions read (planner/models/gptoss.py)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from planner.cli import cli as main
from planner.errors import UserError
from planner.models import archconfig, archs
from planner.models.gptoss import window_pairs
from planner.profiler import analytic_kept, analytic_time, formulas

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model_type": "gpt_oss", "hidden_size": 8, "intermediate_size": 6, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "vocab_size": 16, "num_local_experts": 4,
        "num_experts_per_tok": 2, "sliding_window": 3, "layer_types": ["sliding_attention", "full_attention"],
        "swiglu_limit": 7.0, "attention_bias": True, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}


def _tiny() -> archs.Arch:
    return archconfig.from_hf_config(dict(TINY), where="tiny.json", name="tiny")


def test_tiny_parameters_by_hand_and_as_transformers_builds_them():
    # attention: q 8x16 + 16, k and v 8x8 + 8 each, o 16x8 + 8, 4 sinks = 428; router 8x4 + 4 = 36; an expert:
    # gate/up 8x12 + 12, down 6x8 + 8 = 164, four of them 656; two norms 16: a block 1136. Embedding 16x8,
    # head 16x8 + its norm 8
    assert formulas.total_params(_tiny()) == 128 + 2 * 1136 + 136 == 2536
    transformers = pytest.importorskip("transformers")
    config = transformers.GptOssConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    model = transformers.GptOssForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 2536


def test_full_size_20b_as_transformers_builds_it_under_fake_tensors():
    transformers = pytest.importorskip("transformers")
    from torch._subclasses.fake_tensor import FakeTensorMode

    arch = archs.arch("gpt-oss-20b")
    config = transformers.GptOssConfig(num_hidden_layers=24, num_local_experts=32)
    with FakeTensorMode():
        model = transformers.GptOssForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == formulas.total_params(arch) == 20_914_757_184
    # the model card's 3.6B active: without the input embedding (a lookup), as OpenAI counts it
    assert formulas.active_params(arch, input_embedding=False) == 3_608_307_264
    assert formulas.total_params(archs.arch("gpt-oss-120b")) == 116_829_156_672  # the card's 117B


def test_the_config_file_is_the_built_in():
    config = json.loads((ROOT / "configs/hf/gpt-oss-20b.json").read_text())
    read = archconfig.from_hf_config(config, where="gpt-oss-20b.json", name="gpt-oss-20b")
    assert read.sha256() == archs.arch("gpt-oss-20b").sha256()
    assert read.layer(0).sliding_window == 128 and read.layer(1).sliding_window is None


@pytest.mark.parametrize("change, said", [
    ({"quantization_config": {"quant_method": "mxfp4"}}, "quantization_config"),
    ({"layer_types": None}, "layer_types must list 2 entries"),
    ({"layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types must list 2 entries"),
    ({"sliding_window": None}, "no sliding_window"),
    ({"swiglu_limit": None}, "swiglu_limit must be a positive number"),
])
def test_a_gpt_oss_config_it_cannot_read_is_refused_in_one_sentence(change, said):
    with pytest.raises(UserError, match=said):
        archconfig.from_hf_config({**TINY, **change}, where="tiny.json", name="tiny")


@pytest.mark.parametrize("seq_len, window", [(1, 1), (5, 3), (8, 8), (9, 4), (64, 128), (300, 128), (7, None)])
def test_window_pairs_are_the_mask_counted(seq_len, window):
    q = torch.arange(seq_len)[:, None]
    k = torch.arange(seq_len)[None, :]
    mask = k <= q  # transformers' causal mask, and sliding_window_overlay: kv_idx > q_idx - window
    if window is not None:
        mask &= k > q - window
    assert window_pairs(seq_len, window) == int(mask.sum())


def test_sliding_layers_count_their_window_and_run_its_exact_pairs():
    arch = archs.arch("gpt-oss-20b")
    shape = formulas.Shape(seq_len=8192, micro_batch_size=2)
    sliding, full = arch.layer(0), arch.layer(1)
    width = formulas.q_width(arch, shape)
    # FLOPs as MFU counts attention: s x window pairs (s² in a full layer), 4 FLOPs a pair per width
    assert formulas.block_flops(full, shape) - formulas.block_flops(sliding, shape) == \
        4 * shape.tokens * (8192 - 128) * width
    kernel = analytic_time._attention(sliding, shape)[0][0]
    assert kernel.flops * kernel.run_fraction == pytest.approx(4 * 2 * window_pairs(8192, 128) * width)
    assert analytic_time._attention(full, shape)[0][0].run_fraction == 0.5


def test_the_clamped_swiglu_and_the_sinks_keep_what_torchtitan_keeps():
    arch = archs.arch("gpt-oss-20b").layer(1)
    shape = formulas.Shape(seq_len=4096, micro_batch_size=1, tp=2)
    plain = replace(arch, swiglu_limit=None, attention_sinks=False)
    slots, f, d = arch.num_experts * formulas.expert_tokens(arch, shape), 2880 // 2, 2
    assert sum(t.num_bytes for t in analytic_kept.moe_terms(arch, shape)) - \
        sum(t.num_bytes for t in analytic_kept.moe_terms(plain, shape)) == 3 * slots * f * d  # 7f against 4f
    tokens, heads = 4096, 64 // 2
    assert sum(t.num_bytes for t in analytic_kept.gqa_terms(arch, shape)) - \
        sum(t.num_bytes for t in analytic_kept.gqa_terms(plain, shape)) == \
        tokens * heads * 64 * d + 4 * tokens * heads + d * tokens * heads


def test_expert_parallelism_splits_the_experts_biases_with_them():
    from planner.profiler import analytic

    arch, shape = archs.arch("gpt-oss-20b"), formulas.Shape(seq_len=1, micro_batch_size=1, tp=2)
    assert analytic.expert_params(arch, shape) == 32 * (3 * 2880 * 1440 + 2 * 1440 + 2880)
    # the block: attention (Q/K/V split, their biases split, the output's bias and norms whole, sinks split) + MLP
    # per device: 32 query heads (2048 wide), 4 K/V heads (256 each)
    attention = 2880 * (2048 + 2 * 256) + 2048 * 2880 + (2048 + 2 * 256) + 2880 + 32
    assert formulas.block_params(arch, shape) == attention + 2880 * 32 + 32 + analytic.expert_params(arch, shape) \
        + 2 * 2880


def test_torchtitan_gpt_oss_20b_function_is_read_and_scored():
    runner = CliRunner()
    result = runner.invoke(main, ["evaluate", "--from-torchtitan",
                                  str(ROOT / "configs/torchtitan/gpt_oss/config_registry.py") + ":gpt_oss_20b",
                                  "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    assert "gpt-oss-20b on 8 x h100-sxm" in result.output
    assert "training.disable_cuda_graphs" in result.output  # not modelled: listed, not dropped
    assert "model.flavor" in result.output  # the flavor modelled


def test_the_fake_route_refuses_gpt_oss_in_one_sentence():
    runner = CliRunner()
    result = runner.invoke(main, ["profile", "--hf-config", str(ROOT / "configs/hf/gpt-oss-20b.json"), "--fake",
                                  "--seq-len", "128"])
    assert result.exit_code != 0
    assert "no SDPA attention" in result.output and "Traceback" not in result.output


def test_the_extra_bytes_are_gpt_oss_own_and_counted_by_hand():
    from planner.profiler import gptoss_time

    shape = formulas.Shape(seq_len=4096, micro_batch_size=1, tp=2)
    assert gptoss_time.extra_bytes(archs.arch("mixtral-8x7b"), shape, moe=True) == ({}, {})
    arch = archs.arch("gpt-oss-20b").layer(0)
    fwd, bwd = gptoss_time.extra_bytes(arch, shape, moe=True)
    T, heads, f, h, slots = 4096, 32, 1440, 2880, 32 * 512  # 4096 x 4 / 32 = 512 tokens an expert
    assert fwd == {"attention": 280 * T * heads, "activation": 20 * slots * f, "elementwise": 8 * slots * (2 * f + h)}
    assert bwd == {"attention": 802 * T * heads, "activation": 82 * slots * f,
                   "elementwise": 2 * T * (2048 + 2 * 256 + h) + 14 * slots * (2 * f + h) + 2 * T * 32}


def test_op_level_sac_saves_the_biased_linears_and_reruns_only_the_experts():
    from planner.profiler import opsac

    arch = archs.arch("gpt-oss-20b").layer(1)
    shape = formulas.Shape(seq_len=4096, micro_batch_size=1)
    T, h, d, boundary = 4096, 2880, 2, 4096 * 2880 * 2
    assert opsac.offers_op_sac(arch, shape, moe=True)
    assert [name for name, _, _ in opsac.block_mms(arch, shape, moe=True)] == ["wqkv", "wo"]
    # the input, wqkv's and wo's outputs (addmm: saved), the attention's output and logsumexp, the router's logits
    # (its biased gate: an addmm) and top-k values and indices
    expected = boundary + T * (4096 + 2 * 512) * d + T * h * d + T * 4096 * d + 4 * 64 * T + T * 32 * d + 12 * T * 4
    assert opsac.op_sac_kept_bytes(arch, shape, boundary, moe=True) == expected
    held = formulas.expert_tokens(arch, shape)
    assert sorted(k.flops for k in opsac.rerun_kernels(arch, shape, moe=True)) == [2 * held * h * 2880] * 96
