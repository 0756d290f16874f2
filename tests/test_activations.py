"""A GPT-style MLP's activation as transformers writes it: what its autograd saves and what its ops
move (planner/profiler/activations.py), and GPT-2's blocks, analytic against transformers' own
code under FakeTensorMode, keeping the same bytes and taking the same time."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures.cli import run_ok

from planner import io
from planner.models import archconfig
from planner.profiler import fake
from planner.profiler.activations import ACTIVATIONS

GPT2 = {"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 8, "vocab_size": 512, "n_positions": 512}


def _measured(module, tokens: int = 64, width: int = 128) -> tuple[int, int, int]:
    """(f-wide tensors the MLP keeps between its linears, forward and backward bytes an element) of
    `module` on a bf16 tensor standing for the first linear's output."""
    start = torch.randn(tokens, width, dtype=torch.bfloat16, requires_grad=True)
    y0 = start * 1.0
    saved = {}

    def pack(tensor):
        if tensor.numel() == tokens * width:
            saved[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    grad = torch.ones(tokens, width, dtype=torch.bfloat16)
    with fake.counting() as done:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = module(y0)
        forward = done()
        torch.autograd.grad(out, y0, grad)
        backward = done() - forward
    kept = len(saved) + (out.untyped_storage().data_ptr() not in saved)  # the output: the second linear's input
    return kept, forward.bytes // (tokens * width), backward.bytes // (tokens * width)


@pytest.mark.parametrize("name", ["gelu_new", "gelu_accurate", "gelu_fast", "gelu_python", "gelu",
                                  "gelu_pytorch_tanh", "relu"])
def test_each_activation_keeps_and_moves_what_its_code_does(name):
    activations = pytest.importorskip("transformers.activations")
    act = archconfig.from_hf_config({**GPT2, "activation_function": name}, where="c", name="g").mlp_act
    record = ACTIVATIONS[act]
    assert _measured(activations.ACT2FN[name]) == (record.kept, record.fwd_bytes, record.bwd_bytes)


def test_megatrons_gelu_keeps_korthikantis_two_tensors():
    """"gelu" (gpt3-175b, Megatron-LM's fused bias-GELU) keeps its input and its output, as before."""
    assert ACTIVATIONS["gelu"].kept == ACTIVATIONS["gelu_kernel"].kept == 2
    assert archconfig.from_hf_config(GPT2, where="c", name="g").mlp_act == "gelu_new"  # GPT2Config's default


def test_a_gpt2_fake_profile_keeps_and_times_what_the_analytic_one_does(tmp_path):
    """transformers' own GPT-2 (gelu_new, dropout 0.1 everywhere) under FakeTensorMode for an H100
    against --arch-config: parameters equal; kept bytes equal but for what the CPU kernels of the
    fake run keep otherwise (LayerNorm's mean and rstd in bf16 where CUDA keeps fp32; the ids' int64
    copy HF's embedding keeps); forward and backward within 5% per layer; the recompute options
    both offer for the MLP's activation keep the same bytes."""
    pytest.importorskip("transformers")
    config = tmp_path / "gpt2" / "config.json"
    config.parent.mkdir()
    # one block: a fake profile's time grows with its blocks, and a second GPT-2 block is the first's
    # kind, held to the same figures (the analytic profile has one block kind)
    config.write_text(json.dumps({**GPT2, "n_layer": 1}))
    shape = ("--seq-len", "256", "--micro-batch-size", "1")
    run_ok("profile", "--hf-config", config.parent, "--fake", *shape, "--out", tmp_path / "f.json")
    run_ok("profile", "--arch-config", config, *shape, "--gpu", "h100", "--out", tmp_path / "a.json")
    theirs, ours = io.load_profile(tmp_path / "f.json"), io.load_profile(tmp_path / "a.json")
    s = 256
    norm_stats = 2 * 2 * (4 - 2) * s  # two LayerNorms' mean and rstd, 2 bytes an entry on the CPU, 4 on CUDA
    for mine, fake_layer in zip(ours.layers, theirs.layers, strict=True):
        assert mine.param_count == fake_layer.param_count, mine.name
        assert abs(mine.fwd_ms / fake_layer.fwd_ms - 1) < 0.05 and abs(mine.bwd_ms / fake_layer.bwd_ms - 1) < 0.05
    assert len(ours.layers) == len(theirs.layers) == 3  # the embedding, the block, the head
    assert theirs.layers[1].act_bytes - ours.layers[1].act_bytes == -norm_stats
    # the ids the embedding saves are the batch's own storage (modelfile.cast_batch gives each batch tensor its own,
    # as the runtime's cloned slice is, §44.smallfix): charged as the batch (rules.batch_bytes), where before the
    # slice of example_batch's one seq + 1 token tensor recorded 512 B more than the analytic embedding keeps
    assert theirs.layers[0].act_bytes == ours.layers[0].act_bytes
    mine, fake_block = ({o.name: o.kept_bytes for o in layer.recompute_options} for layer in (ours.layers[1],
                                                                                             theirs.layers[1]))
    # mlp-act frees all the activation keeps but its input (four tensors of gelu_new's five); the runtime's
    # policy inside HF's GPT2MLP, which holds the residual dropout, also saves c_proj's output (a matmul's)
    # and reruns the dropout's mask (1 byte an element), where the analytic block keeps the mask
    tokens_h = s * GPT2["n_embd"]
    assert mine["none"] - mine["mlp-act"] == 4 * s * 4 * GPT2["n_embd"] * 2
    assert fake_block["mlp-act"] - mine["mlp-act"] == 2 * tokens_h - tokens_h - norm_stats


@pytest.mark.parametrize("micro_batch_size", [1, 3])
def test_a_gpt2_embedding_moves_the_bytes_its_code_moves(micro_batch_size):
    """The token and position lookups, their add and dropout (CUDA's native_dropout), counted op by
    op on transformers' modules, against analytic_time.embedding_work: the position ids torch.arange
    writes, and the add's gradient summed over the sequences only where there are several."""
    pytest.importorskip("transformers")
    from torch import nn

    from planner.models.hfmodels import GPT2Embedding
    from planner.profiler import analytic_time
    from planner.profiler.device_attention import device_attention
    from planner.profiler.formulas import Shape

    s, h = 128, 64
    emb = GPT2Embedding(nn.Embedding(512, h), nn.Embedding(256, h), nn.Dropout(0.1)).to(torch.bfloat16)
    for param in emb.parameters():
        param.grad = torch.zeros_like(param)
    ids, grad = torch.randint(0, 512, (micro_batch_size, s)), torch.zeros(micro_batch_size, s, h, dtype=torch.bfloat16)
    with device_attention("cuda"), fake.counting() as done:
        out = emb(ids)
        forward = done()
        out.backward(grad)
        backward = done() - forward
    arch = archconfig.from_hf_config({**GPT2, "n_embd": h, "n_positions": 256}, where="c", name="g")
    fwd, bwd, _ = analytic_time.embedding_work(arch, Shape(seq_len=s, micro_batch_size=micro_batch_size))
    assert (fwd.bytes, bwd.bytes) == (forward.bytes, backward.bytes)


def test_gemmas_scaled_embedding_moves_its_output_once_more_each_way():
    """transformers' GemmaTextScaledWordEmbedding multiplies the lookup by √hidden_size: the analytic
    embedding charges that pass (read and write the output, forward and backward); the fake counts
    the 0-dim scale's 2 bytes too."""
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    from planner.profiler import analytic_time
    from planner.profiler.formulas import Shape

    vocab, h, s = 512, 64, 128
    emb = gemma.GemmaTextScaledWordEmbedding(vocab, h, 0, embed_scale=h ** 0.5).to(torch.bfloat16)
    for param in emb.parameters():
        param.grad = torch.zeros_like(param)
    ids, grad = torch.randint(0, vocab, (1, s)), torch.zeros(1, s, h, dtype=torch.bfloat16)
    with fake.counting() as done:
        out = emb(ids)
        forward = done()
        out.backward(grad)
        backward = done() - forward
    config = {"model_type": "gemma", "hidden_size": h, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": vocab,
              "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}
    arch = archconfig.from_hf_config(config, where="c", name="g")
    fwd, bwd, _ = analytic_time.embedding_work(arch, Shape(seq_len=s, micro_batch_size=1))
    assert arch.scaled_embedding and (forward.bytes - fwd.bytes, backward.bytes - bwd.bytes) == (2, 2)
    plain = archconfig.from_hf_config({**config, "model_type": "llama", "hidden_activation": None}, where="c", name="l")
    assert fwd.bytes - analytic_time.embedding_work(plain, Shape(seq_len=s, micro_batch_size=1))[0].bytes == 2 * s * h * 2
