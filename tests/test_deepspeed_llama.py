"""DeepSpeed ZeRO 3's coordinator on LLaMA-style blocks (planner/cost/deepspeed_zero3.py llama_block), the third
gather of selective reruns (rerun_ranges), and the sentence where neither can be charged
(planner/cost/deepspeed_terms.py not_charged)."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import deepspeed_terms
from planner.cost import deepspeed_zero3 as z3
from planner.cost.deepspeed_zero3 import Submodule
from planner.cost.layers import layer_costs

H, FF, HEADS, KV = 1024, 2816, 8, 2  # the tiny GQA LLaMA below: head_dim 128, k and v 256 wide
ATTN = H * H + 2 * (KV * 128 * H) + H * H  # q, k, v, o: 2,621,440
MLP = 3 * H * FF  # gate, up, down: 8,650,752


def test_a_llama_block_in_the_order_its_forward_first_uses_its_modules():
    block = z3.llama_block(H, FF, heads=HEADS, kv_heads=KV, head_dim=128)
    assert [(m.name, m.param_numels, m.part) for m in block] == [
        ("input_layernorm", (H,), "norm"), ("q_proj", (H * H,), "attn"), ("k_proj", (256 * H,), "attn"),
        ("v_proj", (256 * H,), "attn"), ("o_proj", (H * H,), "attn"), ("post_attention_layernorm", (H,), "norm"),
        ("gate_proj", (H * FF,), "mlp"), ("up_proj", (H * FF,), "mlp"), ("down_proj", (FF * H,), "mlp")]
    qwen3 = z3.llama_block(H, FF, heads=HEADS, kv_heads=KV, head_dim=128, qkv_bias=True, qk_norm=True)
    assert [m.name for m in qwen3[1:6]] == ["q_proj", "q_norm", "k_proj", "k_norm", "v_proj"]
    assert qwen3[1].param_numels == (H * H, H) and qwen3[3].param_numels == (256 * H, 256)


@pytest.mark.parametrize(("option", "ranges"), [
    ("full", ((0, 9),)), ("op-sac", ((0, 9),)), ("attn", ((1, 5),)), ("mlp", ((6, 9),)),
    ("attn,mlp", ((1, 5), (6, 9))), ("core-attn,mlp", ((6, 9),)), ("core-attn", ()), ("mlp-act", ()),
    ("norm-out", ()), ("none", ()), ("offload", ())])
def test_each_option_reruns_the_submodules_of_the_parts_it_names(option, ranges):
    assert z3.rerun_ranges(z3.llama_block(H, FF, heads=HEADS, kv_heads=KV, head_dim=128), option) == ranges


ABCD = [Submodule("n", (1,), "norm"), Submodule("a", (4,), "attn"), Submodule("g", (3,), "mlp"),
        Submodule("d", (2,), "mlp")]


def test_a_rerun_range_recomputes_when_the_backward_reaches_its_last_submodule():
    assert z3.trace(ABCD, layers=1, checkpointed=False, reruns=((2, 4),)) == [
        (0, "forward", 0), (0, "forward", 1), (0, "forward", 2), (0, "forward", 3),
        (0, "recompute", 2), (0, "recompute", 3), (0, "backward", 3), (0, "backward", 2),
        (0, "backward", 1), (0, "backward", 0)]
    assert z3.trace(ABCD, layers=1, checkpointed=True) == z3.trace(ABCD, layers=1, checkpointed=False,
                                                                   reruns=((0, 4),))


@pytest.mark.parametrize(("max_reuse", "third"), [(0, 5), (1, 3), (3, 3), (4, 3), (5, 0), (100, 0)])
def test_an_mlp_rerun_gathers_its_submodules_a_third_time_by_the_reuse_distance(max_reuse, third):
    """By hand, no prefetch, edaa7221's `>=`: after g's recompute the walk meets d's recompute and d's backward
    (2 + 2 = 4 elements) before g's backward: g kept iff 4 < distance; d's backward follows its recompute at
    once, kept at any distance above 0 (at 0 the walk stops before it). The attention (a) and norm (n) are not
    rerun: released after their forward, gathered once in the backward. Third gathers, of the block's 10
    elements: d's 2 and g's 3 at 0; g's 3 up to 4; none from 5."""
    m = 1_000_000  # elements a unit: every parameter above DeepSpeed's persistence threshold (1e5)
    block = [Submodule(s.name, (s.numel * m,), s.part) for s in ABCD]
    moments = z3.simulate(block, layers=2, checkpointed=False, reruns=((2, 4),), max_reuse_numel=max_reuse * m,
                          prefetch_bucket=0)
    runs = [run for run in moments if run.layer == 0 and run.phase != "forward"]
    assert [(run.phase, run.name) for run in runs][:3] == [("recompute", "g"), ("recompute", "d"), ("backward", "d")]
    assert z3.third_gather_share(block, runs) == pytest.approx(third / 10)


@pytest.fixture(scope="module")
def llama_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsllama")
    config = folder / "llama.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": H, "intermediate_size": FF,
                                  "num_hidden_layers": 4, "num_attention_heads": HEADS, "num_key_value_heads": KV,
                                  "vocab_size": 1024, "max_position_embeddings": 256, "tie_word_embeddings": False}))
    run_ok("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--out", folder / "p.json")
    return folder / "p.json"


def _setup(profile_path, link=None, **knobs):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = io.load_profile(profile_path)
    options = DataParallelOptions(dp=8, zero=3, deepspeed=knobs, shard_bandwidth=link)
    return profile, build_setup(profile, stages=1, mem="80GB", microbatches=1, schedule="1F1B", optimizer="adam",
                                precision="bf16-mixed", parallel_stages=None, runtime="deepspeed",
                                data_parallel=options)


def test_the_llama_profiles_blocks_are_charged_with_their_submodules(llama_profile):
    profile, setup = _setup(llama_profile)
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    assert block.param_count == ATTN + MLP + 2 * H  # the profile's count is the submodules' sum
    assert deepspeed_terms.charged(profile, setup) and deepspeed_terms.not_charged(profile, setup) is None


@pytest.mark.parametrize(("option", "gathered_again"), [
    ("full", ATTN + MLP), ("op-sac", ATTN + MLP), ("attn", ATTN), ("mlp", MLP), ("attn,mlp", ATTN + MLP),
    ("core-attn", 0), ("mlp-act", 0), ("attn,mlp-act", ATTN), ("none", 0)])
def test_each_option_on_a_slow_link_adds_a_gather_of_the_submodules_it_reruns(llama_profile, option,
                                                                               gathered_again):
    """Distance 0, no prefetch: every rerun submodule is released after its recompute and gathered again for
    its backward. At 1 GB/s among 8 ranks (7/8 of the bytes cross) in 2 B, the window (backward and rerun, a
    few ms on an A100) hides none of it: each option adds exactly its rerun linears' share of the block's gather
    (the norms, 1,024 elements each, are persistent)."""
    profile, setup = _setup(llama_profile, link=1.0, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    index = block.option_index(option)
    assert deepspeed_terms.third_gather_share(profile, block, setup, index) == pytest.approx(
        gathered_again / (ATTN + MLP))
    # the share of one gather of the layer's parameters (the persistent norms' 2H with them, as the term takes it)
    expected_ms = gathered_again / (ATTN + MLP) * (ATTN + MLP + 2 * H) * 2 * 7 / 8 / 1e9 * 1e3
    assert deepspeed_terms.third_gather_ms(block, index, profile, setup) == pytest.approx(expected_ms)


def test_where_the_coordinator_cannot_be_replayed_the_plan_says_so(llama_profile, tmp_path):
    """A TP 2 profile: the plan is scored with the largest-layer term and says the working set and third
    gather are not charged, and why; an analytic profile at TP 1 says nothing of it."""
    base = ("--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8, "--zero", 3, "--microbatches", 1,
            "--precision", "bf16-mixed", "--runtime", "deepspeed")
    assert "DeepSpeed ZeRO 3:" not in run_ok("evaluate", "--profile", llama_profile, *base).output
    config = tmp_path / "llama.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": H, "intermediate_size": FF,
                                  "num_hidden_layers": 4, "num_attention_heads": HEADS, "num_key_value_heads": KV,
                                  "vocab_size": 1024, "max_position_embeddings": 256}))
    run_ok("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--tp", 2, "--out", tmp_path / "tp2.json")
    said = " ".join(run_ok("evaluate", "--profile", tmp_path / "tp2.json", *base).output.split())
    assert "third gather of rerun submodules are not charged (under tensor parallelism (2)" in said
