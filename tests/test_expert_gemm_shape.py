"""Expert parallelism in the analytic time model (formulas.Shape.ep): a rank runs its experts / ep local experts,
each over ep x the tokens an expert holds, and accumulates only its own experts' gradients; FLOPs, per-token
bytes and kept activations do not move (docs/published-runs.md §23.moerows, framework-facts §92)."""

from collections import Counter

import pytest

from planner.commands import evaluate_config
from planner.commands.expert_options import check_ep
from planner.errors import UserError
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic, analytic_time, formulas
from planner.profiler.analytic import Shape
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 heads of 16, 2 K/V heads; every layer MoE: 8 experts of width 32, top 2, no shared expert
TINY = archs.Arch(name="tiny-ep", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # 64 tokens: 64 x 2 / 8 = 16 an expert


def _matmuls(work) -> Counter:
    """Every matmul of the pass, FLOPs: count."""
    return Counter({k.flops: n for k, n in work.kernels if k.kind == "matmul"})


def test_the_grouped_gemm_shape_a_rank_runs():
    assert formulas.expert_gemm_shape(TINY, SHAPE) == (8, 16)
    assert formulas.expert_gemm_shape(TINY, Shape(seq_len=32, micro_batch_size=2, ep=4)) == (2, 64)
    with pytest.raises(ValueError, match="does not divide the 8 routed experts"):
        formulas.expert_gemm_shape(TINY, Shape(seq_len=32, micro_batch_size=2, ep=3))


def test_ep_makes_fewer_larger_expert_gemms_of_the_same_flops():
    fwd1, bwd1, _ = analytic_time.block_work(TINY, SHAPE, moe=True)
    fwd4, bwd4, _ = analytic_time.block_work(TINY, Shape(seq_len=32, micro_batch_size=2, ep=4), moe=True)
    # gate, up and down (three SwiGLU matmuls) per local expert: 8 experts x 16 rows, or 2 x 64; the router
    # (2·64·64·8, the same size as one 16-row expert GEMM), Q and O (2·64·64·64), K and V (2·64·64·32) stay
    dense = Counter({2 * 64 * 64 * 8: 1, 2 * 64 * 64 * 64: 2, 2 * 64 * 64 * 32: 2})
    assert _matmuls(fwd1) == dense + Counter({2 * 16 * 64 * 32: 24})
    assert _matmuls(fwd4) == dense + Counter({2 * 64 * 64 * 32: 6})
    assert fwd1.flops == fwd4.flops and bwd1.flops == bwd4.flops
    assert fwd1.classed == fwd4.classed  # forward bytes: per token copy, the same under any ep


def test_ep_accumulates_only_the_ranks_own_experts_gradients():
    _, bwd1, _ = analytic_time.block_work(TINY, SHAPE, moe=True)
    _, bwd4, _ = analytic_time.block_work(TINY, Shape(seq_len=32, micro_batch_size=2, ep=4), moe=True)
    experts = 8 * 3 * 64 * 32  # routed experts' weights, of which a rank of ep 4 holds 2 of 8
    assert dict(bwd1.classed)["elementwise"] - dict(bwd4.classed)["elementwise"] == \
        analytic_time.ACCUMULATE * 2 * experts * 3 // 4


def test_the_profile_records_its_ep_and_check_ep_holds_it_to_the_setup():
    profile = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, ep=2), gpu=H100, model=REF)
    assert profile.assumptions["ep"] == 2 and profile.name.endswith("-ep2")
    assert "expert parallelism 2" in profile.assumptions["moe_parallelism"]
    check_ep(profile, ep=2, dp=4, shard_group=None, ep_bandwidth=None)  # made for it: fine
    with pytest.raises(UserError, match="as expert parallelism 2 runs them and --ep is 4"):
        check_ep(profile, ep=4, dp=4, shard_group=None, ep_bandwidth=None)
    whole = analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)
    assert "ep" not in whole.assumptions
    check_ep(whole, ep=1, dp=4, shard_group=None, ep_bandwidth=None)
    # made at ep 1, its experts' times are one device's: refused under --ep 2, naming the profile to make
    # (tests/test_search_ep.py: `ckplan profile ... --ep E`, and the search's own per-EP profiles)
    with pytest.raises(UserError, match=r"as one device runs them all \(expert parallelism 1\) and --ep is 2"):
        check_ep(whole, ep=2, dp=4, shard_group=None, ep_bandwidth=None)


def test_a_megatron_job_is_profiled_at_its_expert_parallelism():
    flags = {"--num-layers": "2", "--hidden-size": "64", "--ffn-hidden-size": "160", "--num-attention-heads": "4",
             "--group-query-attention": "true", "--num-query-groups": "2", "--swiglu": "true",
             "--disable-bias-linear": "true", "--position-embedding-type": "rope", "--seq-length": "32",
             "--max-position-embeddings": "32", "--vocab-size": "128", "--num-experts": "8",
             "--moe-ffn-hidden-size": "32", "--moe-router-topk": "2", "--expert-model-parallel-size": "4",
             "--micro-batch-size": "2", "--global-batch-size": "16"}
    job = megatron.from_pairs([(flag, [value]) for flag, value in flags.items()], "tiny.yaml")
    profile = evaluate_config._profile(job, H100)
    assert job.ep == 4 and profile.assumptions["ep"] == 4
    ep1 = analytic.analytic_profile(job.arch, Shape(seq_len=32, micro_batch_size=2), gpu=H100, model=REF)
    moe4 = next(layer for layer in profile.layers if layer.kind == "moe_block")
    moe1 = next(layer for layer in ep1.layers if layer.kind == "moe_block")
    assert moe4.act_bytes == moe1.act_bytes and moe4.param_count == moe1.param_count
    assert moe4.bwd_ms < moe1.bwd_ms  # larger GEMMs, a quarter of the experts' gradients accumulated
