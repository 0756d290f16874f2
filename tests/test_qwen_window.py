"""A Qwen config's sliding window as transformers 5.24 applies it (planner/models/gemma3.py qwen_fields,
framework-facts §505): only where use_sliding_window is true (its default false), and then only on the layers
layer_types marks sliding, by default those from max_window_layers up. The analytic reader windowed every layer of
such a config, and windowed a config that gave sliding_window without use_sliding_window."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok

from planner.models import archconfig
from planner.profiler.analytic import Shape
from planner.profiler.formulas import attention_flops

QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
         "sliding_window": 8, "use_sliding_window": True, "max_window_layers": 1}


MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
       "mlp_only_layers": []}


def _arch(config):
    return archconfig.from_hf_config(config, where="config.json", name="tiny")


def _windows(config):
    arch = _arch(config)
    return tuple(arch.layer(i).sliding_window for i in range(arch.num_layers))


@pytest.mark.parametrize("change, windows", [
    ({}, (None, 8, 8)),  # from max_window_layers 1 up
    ({"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}, (8, None, 8)),
    ({"max_window_layers": 0}, (8, 8, 8)),
    ({"max_window_layers": 3}, (None, None, None)),
    ({"max_window_layers": None}, (None, None, None)),  # transformers' default 28: past these 3 layers
    ({"use_sliding_window": None}, (None, None, None)),  # not given: transformers' default false
    ({"use_sliding_window": False}, (None, None, None)),
    ({"model_type": "qwen3", "head_dim": 16}, (None, 8, 8)),
    # Qwen2-MoE: the even-indexed layers below max_window_layers; Qwen3-MoE: every layer
    ({**MOE, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 64, "max_window_layers": 3}, (8, None, 8)),
    ({**MOE, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 64, "max_window_layers": None}, (8, None, 8)),
    ({**MOE, "model_type": "qwen2_moe", "shared_expert_intermediate_size": 64, "max_window_layers": 1}, (8, None, None)),
    ({**MOE, "model_type": "qwen3_moe", "head_dim": 16}, (8, 8, 8)),
    ({**MOE, "model_type": "qwen3_moe", "head_dim": 16, "use_sliding_window": None}, (None, None, None)),
])
def test_the_window_on_the_layers_transformers_gives_it(change, windows):
    config = {key: value for key, value in {**QWEN2, **change}.items() if value is not None}
    assert _windows(config) == windows
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoConfig.for_model(**config)
    # Qwen3-MoE keeps no layer_types: its attention takes sliding_window on every layer (modeling_qwen3_moe.py 149)
    kinds = getattr(hf, "layer_types", None) or ["sliding_attention"] * hf.num_hidden_layers
    assert tuple(hf.sliding_window if kind == "sliding_attention" else None for kind in kinds) == windows


def test_a_full_layer_counts_the_whole_causal_prefix_and_a_windowed_one_its_window(tmp_path):
    # at 16 tokens: projections 2·16·64·(2·64 + 2·32) on each; QK^T and scores·V 4·16·16·64 on the full layer,
    # 4·16·8·64 on the windowed ones
    arch, shape = _arch(QWEN2), Shape(seq_len=16, micro_batch_size=1)
    projections = 2 * 16 * 64 * (2 * 64 + 2 * 32)
    assert [attention_flops(arch.layer(i), shape) for i in range(3)] == [
        projections + 4 * 16 * 16 * 64, projections + 4 * 16 * 8 * 64, projections + 4 * 16 * 8 * 64]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN2))
    run_ok("profile", "--arch-config", path, "--seq-len", 16, "--micro-batch-size", 1, "--dtype", "bf16",
           "--out", tmp_path / "p.json")
    layers = json.loads((tmp_path / "p.json").read_text())["layers"]
    blocks = {layer["name"]: layer for layer in layers}
    assert blocks["layers.0"]["variant"] == "full attention" and blocks["layers.1"]["variant"] == "window 8"
    assert blocks["layers.0"]["fwd_ms"] > blocks["layers.1"]["fwd_ms"] == blocks["layers.2"]["fwd_ms"]
