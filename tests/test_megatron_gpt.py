"""Megatron-LM's GPT test model (tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed): a GPT
block with grouped-query attention as an arch config, and what a Megatron rank holds after the
optimizer step, by hand."""

from __future__ import annotations

from planner.models.archconfig import from_hf_config
from planner.profiler.analytic import Shape
from planner.profiler.analytic_kept import gpt_block_terms
from planner.profiler.formulas import block_params, embedding_params, head_params

# the test's model_config.yaml: 32 layers, h 4096, 32 heads in 8 query groups, 4h GeLU MLP (no
# --swiglu), learned positions of 8192, untied; vocab 131,073 padded by Megatron to a multiple of
# 128 x TP: 131,200 at TP 1, 131,584 at TP 4
MEGATRON_7B = {"model_type": "gpt2", "n_embd": 4096, "n_layer": 32, "n_head": 32, "num_key_value_heads": 8,
               "n_inner": 16384, "vocab_size": 131200, "n_positions": 8192, "tie_word_embeddings": False}


def test_the_gqa_gelu_config_counts_the_7b_tests_parameters_by_hand():
    arch = from_hf_config(MEGATRON_7B, where="c.json", name="megatron-7b")
    one = Shape(seq_len=8192, micro_batch_size=1)
    h, q, kv, f = 4096, 4096, 1024, 16384
    block = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + 2 * h * f + f + h + 2 * 2 * h  # matrices, biases, 2 LN
    assert block_params(arch, one) == block == 176_207_872
    assert head_params(arch, one) == 2 * h + 131_200 * h == 537_403_392
    assert embedding_params(arch, one) == (131_200 + 8192) * h == 570_949_632
    # M1's last rank (TP 1, PP 4, 8 virtual stages of one layer): layers 3, 7, ..., 31, the final
    # LayerNorm and the output layer
    assert 8 * block + head_params(arch, one) == 1_947_066_368
    # M4 (TP 4): the matrices and column-parallel biases / 4, LayerNorms and row-parallel biases whole,
    # the vocabulary padded to 131,584 and split / 4, the positions whole
    tp4 = from_hf_config(MEGATRON_7B | {"vocab_size": 131_584}, where="c.json", name="megatron-7b")
    four = Shape(seq_len=8192, micro_batch_size=2, tp=4)
    rank = 32 * block_params(tp4, four) + embedding_params(tp4, four) + head_params(tp4, four)
    assert block_params(tp4, four) == 44_070_400 and rank == 1_713_299_456


def test_a_gpt_block_keeps_k_and_v_at_the_groups_width():
    arch = from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4, "num_key_value_heads": 2,
                           "vocab_size": 128, "n_positions": 16}, where="c.json", name="t")
    terms = {t.what: t.num_bytes for t in gpt_block_terms(arch, Shape(seq_len=8, micro_batch_size=2))}
    tokens = 8 * 2
    assert terms["Q"] == tokens * 64 * 2  # 4 heads x 16, bf16
    assert terms["K (K/V heads only)"] == terms["V (K/V heads only)"] == tokens * 32 * 2  # 2 groups x 16
