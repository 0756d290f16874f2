"""GPT-style blocks as their configs say them: StarCoder2 (rotary, grouped-query attention, GELU
as one kernel) read by --arch-config, and dropout charged where the model drops (a 1-byte mask per
element of a residual dropout's output, as CUDA's fused dropout keeps) and nowhere else."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import costmodel
from planner.emit import megatron as export_megatron
from planner.models import archconfig
from planner.models.configs import megatron
from planner.models.gpus import gpu
from planner.profiler import analytic, analytic_time

# StarCoder2-15B's widths (bigcode/starcoder2-15b config.json), two layers
STARCODER2 = {"model_type": "starcoder2", "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 2,
              "num_attention_heads": 48, "num_key_value_heads": 4, "vocab_size": 49152,
              "max_position_embeddings": 16384, "rope_theta": 100000, "sliding_window": 4096, "use_bias": True,
              "norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh", "residual_dropout": 0.1,
              "embedding_dropout": 0.1, "attention_dropout": 0.1}


def test_a_starcoder2_config_is_a_rotary_gqa_gpt_block_counted_by_hand():
    arch = archconfig.from_hf_config(STARCODER2, where="c", name="sc2")
    assert (arch.style, arch.mlp_act, arch.max_position_embeddings, arch.num_kv_heads) == ("gpt", "gelu_kernel", None, 4)
    assert arch.rotates and arch.drops_residual and arch.drops_embedding and arch.drops_attention
    assert (arch.rope_theta, arch.sliding_window, arch.norm_eps) == (100000.0, 4096, 1e-5)
    h, kv, f = 6144, 4 * 128, 24576
    by_hand = 2 * (h * h + h) + 2 * (h * kv + kv) + (h * f + f) + (f * h + h) + 2 * 2 * h  # q, o; k, v; fc; proj; norms
    assert analytic.block_params(arch, analytic.Shape(seq_len=4096, micro_batch_size=1)) == by_hand == 383_847_424
    # transformers' Starcoder2Config defaults: no dropout; an MLP of another activation is refused
    plain = archconfig.from_hf_config({**STARCODER2, "residual_dropout": 0.0, "embedding_dropout": 0,
                                       "attention_dropout": 0.0}, where="c", name="sc2")
    assert not (plain.drops_residual or plain.drops_embedding or plain.drops_attention)
    with pytest.raises(Exception, match="hidden_act 'silu' is not read"):
        archconfig.from_hf_config({**STARCODER2, "hidden_act": "silu"}, where="c", name="sc2")
    with pytest.raises(Exception, match="residual_dropout must be a probability"):
        archconfig.from_hf_config({**STARCODER2, "residual_dropout": 1.5}, where="c", name="sc2")


def test_dropout_keeps_its_masks_only_where_the_model_drops():
    """Two residual masks a block (tokens x hidden bytes each, /t under SP), one on the embedding;
    attention dropout keeps a mask of the scores only under eager attention."""
    drops = archconfig.from_hf_config(STARCODER2, where="c", name="sc2")
    plain = archconfig.from_hf_config({**STARCODER2, "residual_dropout": 0.0, "embedding_dropout": 0.0,
                                       "attention_dropout": 0.0}, where="c", name="sc2")
    shape = analytic.Shape(seq_len=4096, micro_batch_size=2)
    tokens, h = 4096 * 2, 6144

    def kept(arch, at=shape):
        return sum(term.num_bytes for term in analytic.block_terms(arch, at))

    assert kept(drops) - kept(plain) == 2 * tokens * h
    eager = analytic.Shape(seq_len=4096, micro_batch_size=2, attention="eager")
    scores = 48 * 4096 * 4096 * 2
    assert kept(drops, eager) - kept(plain, eager) == 2 * tokens * h + scores * (1 + 2)  # mask, bf16 output
    assert analytic.embedding_layer(drops, shape, gpu("h100")).act_bytes - \
        analytic.embedding_layer(plain, shape, gpu("h100")).act_bytes == tokens * h
    # the dropouts' bytes moved: 5 a element forward (read, write, mask), 5 backward, two a block
    def elementwise(arch):
        return dict(analytic_time.block_work(arch, shape)[0].classed)["elementwise"]

    assert elementwise(drops) - elementwise(plain) == 2 * 5 * tokens * h


def test_a_starcoder2_fake_profile_keeps_what_the_analytic_one_does(tmp_path):
    """transformers' own StarCoder2 code under FakeTensorMode for an H100 against --arch-config:
    parameters equal, kept bytes equal but for what the CPU kernels of the fake run keep
    otherwise (rotary's cos and sin, s x head_dim in bf16 each, which the analytic block does not
    count; LayerNorm's mean and rstd in bf16 where CUDA keeps fp32), and the dropouts' masks one
    byte an element (CUDA's native_dropout) where the CPU's dropout keeps bf16 noise."""
    pytest.importorskip("transformers")
    # one block: a fake profile's time grows with its blocks, and a second is the first's kind
    small = {**STARCODER2, "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8,
             "num_key_value_heads": 2, "vocab_size": 512, "sliding_window": None, "num_hidden_layers": 1}
    config = tmp_path / "sc2" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(small))
    shape = ("--seq-len", "256", "--micro-batch-size", "1")
    run_ok("profile", "--hf-config", config.parent, "--fake", *shape, "--out", tmp_path / "f.json")
    run_ok("profile", "--arch-config", config, *shape, "--gpu", "h100", "--out", tmp_path / "a.json")
    fake, ours = io.load_profile(tmp_path / "f.json"), io.load_profile(tmp_path / "a.json")
    s, head = 256, 32
    cpu_kernels = 2 * 2 * s * head - 2 * 2 * 2 * s  # cos and sin; two norms' mean and rstd at 2 bytes, not 4
    for mine, theirs in zip(ours.layers, fake.layers, strict=True):
        assert mine.param_count == theirs.param_count, mine.name
    assert len(ours.layers) == len(fake.layers) == 3  # the embedding, the block, the head
    assert fake.layers[1].act_bytes - ours.layers[1].act_bytes == cpu_kernels
    # the ids the embedding saves are the batch's own storage (modelfile.cast_batch gives each batch tensor its own,
    # as the runtime's cloned slice is, §44.smallfix): charged as the batch (rules.batch_bytes), where before the
    # slice of example_batch's one seq + 1 token tensor recorded 512 B more than the analytic embedding keeps
    assert fake.layers[0].act_bytes == ours.layers[0].act_bytes


def test_megatrons_dropout_flags_are_read_and_an_export_says_the_models():
    """Megatron-LM drops at 0.1 unless told: a SwiGLU model left at the default keeps the masks, one
    at --hidden-dropout 0 none; --position-embedding-type rope on a GPT-style block is rotary."""
    base = [("--num-layers", ["2"]), ("--hidden-size", ["512"]), ("--num-attention-heads", ["8"]),
            ("--seq-length", ["1024"]), ("--max-position-embeddings", ["1024"]), ("--vocab-size", ["1024"])]
    swiglu = base + [("--swiglu", []), ("--position-embedding-type", ["rope"]), ("--disable-bias-linear", [])]

    def arch(pairs):
        return megatron.from_pairs(pairs, "t.sh").arch

    assert arch(swiglu).drops_residual and arch(swiglu).drops_embedding
    quiet = arch(swiglu + [("--hidden-dropout", ["0"]), ("--attention-dropout", ["0.0"])])
    assert not (quiet.drops_residual or quiet.drops_embedding or quiet.drops_attention)
    gpt_rope = arch(base + [("--position-embedding-type", ["rope"])])
    assert gpt_rope.rotates and gpt_rope.max_position_embeddings is None and gpt_rope.mlp_act == "gelu_kernel"
    assert not arch(base).rotates and arch(base).max_position_embeddings == 1024
    with pytest.raises(Exception, match="--hidden-dropout 1.0 is not a probability"):
        arch(swiglu + [("--hidden-dropout", ["1.0"])])


def test_a_starcoder2_plan_exports_to_megatron_and_reads_back_the_same(tmp_path):
    """--arch-config StarCoder2 → solve → export megatron → --from-megatron: the export says rotary
    positions at the model's base, the K/V groups and no dropout (the config's), and the rank
    reads back with the plan's bytes."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**STARCODER2, "hidden_size": 512, "intermediate_size": 2048,
                                  "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1024,
                                  "residual_dropout": 0.0, "embedding_dropout": 0.0, "attention_dropout": 0.0,
                                  "sliding_window": None}))
    run_ok("profile", "--arch-config", config, "--seq-len", "1024", "--micro-batch-size", "1", "--gpu", "h100",
           "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "1", "--microbatches", "2", "--mem", "80GB",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--out", tmp_path / "plan.yaml")
    profile, plan = io.load_profile(tmp_path / "p.json"), io.load_plan(tmp_path / "plan.yaml")
    result = export_megatron.export(plan, profile, plan_file=str(tmp_path / "plan.yaml"))
    for line in ("--position-embedding-type rope", "--rotary-base 100000", "--num-query-groups 2",
                 "--hidden-dropout 0", "--attention-dropout 0"):
        assert f"    {line}\n" in result.text, line
    script = tmp_path / "train.sh"
    script.write_text(result.text + 'torchrun --nproc_per_node 1 pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" '
                      "--vocab-size 1024\n")
    summary = json.loads(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100", "--json").stdout)
    exported = costmodel.evaluate(result.rounded.ranks(), profile, result.rounded.setup).stages[0]
    rank = summary["ranks"][0]
    assert (rank["static_bytes"], rank["peak_bytes"]) == (exported.static_bytes, exported.peak_bytes)


def test_opt_dropouts_inside_the_mlp_are_refused(tmp_path):
    opt = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 128, "max_position_embeddings": 64}
    assert archconfig.from_hf_config(opt, where="c", name="o").drops_residual  # OPTConfig's dropout 0.1
    assert not archconfig.from_hf_config({**opt, "dropout": 0.0}, where="c", name="o").drops_residual
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**opt, "activation_dropout": 0.1}))
    result = run("profile", "--arch-config", config, "--seq-len", "64", "--micro-batch-size", "1")
    assert result.exit_code != 0 and "activation_dropout = 0.1 is not modelled" in result.output


def test_a_llama_style_block_without_rotary_positions_moves_no_rotation_bytes():
    """Arch.rotary False (Megatron-LM's --position-embedding-type none) is read by a LLaMA-style block too:
    the eager rotation of Q and K (20 / 32 bytes an element, and its table) is not charged."""
    import dataclasses

    from planner.models import archs

    llama = dataclasses.replace(archs.arch("llama3-8b"), num_layers=2)
    shape = analytic.Shape(seq_len=1024, micro_batch_size=1)
    rotated = 1024 * (4096 + 1024)
    table = 1024 * 128 * analytic_time.ROTARY_TABLE

    def attention(arch):
        return [dict(work.classed).get("attention", 0) for work in analytic_time.block_work(arch, shape)[:2]]

    with_rope, without = attention(llama), attention(dataclasses.replace(llama, rotary=False))
    assert [a - b for a, b in zip(with_rope, without)] == [analytic_time.ROTARY_FWD * rotated + table,
                                                         analytic_time.ROTARY_BWD * rotated + table]
