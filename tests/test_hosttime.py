"""The host's floor under a dense block's passes (planner/cost/hosttime.py): the record's measured forward and
backward in torch Linear forwards, at the host's published CPU time per Linear forward, charged only where it
exceeds the device's time of that pass."""

from __future__ import annotations

import pytest

from planner.cost import hosttime, runtimes
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4, num_kv_heads=2,
                  vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
MODEL = FileRef(file="arch:test", sha256="0" * 64)


def _setup(runtime="megatron") -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime)


def _layers(arch, gpu: str, seq: int = 32):
    profile = analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=1), gpu=archs.gpu(gpu), model=MODEL)
    return profile, layer_costs(profile)


def test_megatrons_record_reads_the_benchmarks_block():
    # scripts/bench_host.py's dense block in torch Linear forwards: forward, backward; with TE's fused attention and
    # with its unfused one
    assert runtimes.of(_setup().training).host_block_linears == (("flash", 36.72, 47.29), ("eager", 49.72, 52.76),
                                                                  ("moe", 77.10, 86.41), ("flash_cp2", 68.85, 74.27),
                                                                  ("mla_flash", 56.72, 55.81),
                                                                  ("mla_eager", 66.60, 66.21))


def test_context_parallelism_2_takes_the_ring_blocks_host_time():
    # scripts/bench_host_cp.py: the block with TE's AttnFuncWithCPAndKVP2P at CP 2 (the slower rank's)
    profile, _ = _layers(TINY, "h100")
    cp2 = profile.model_copy(update={"assumptions": {**profile.assumptions, "cp": 2}})
    assert hosttime.host_block_ms(cp2, _setup()) == pytest.approx((68.85 * 13.48e-3, 74.27 * 13.48e-3))
    # CP 4 is not measured, nor TE's all-to-all exchange: the block without the ring
    cp4 = profile.model_copy(update={"assumptions": {**profile.assumptions, "cp": 4}})
    assert hosttime.host_block_ms(cp4, _setup()) == pytest.approx((36.72 * 13.48e-3, 47.29 * 13.48e-3))
    a2a = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                     runtime="megatron", cp_comm="a2a")
    assert hosttime.host_block_ms(cp2, a2a) == pytest.approx((36.72 * 13.48e-3, 47.29 * 13.48e-3))
    eager = cp2.model_copy(update={"assumptions": {**cp2.assumptions, "attention": "eager"}})
    assert hosttime.host_block_ms(eager, _setup()) == pytest.approx((49.72 * 13.48e-3, 52.76 * 13.48e-3))


def test_the_profiles_attention_picks_the_block():
    profile, _ = _layers(TINY, "h100")
    assert profile.assumptions["attention"] == "flash"
    assert hosttime.host_block_ms(profile, _setup()) == pytest.approx((36.72 * 13.48e-3, 47.29 * 13.48e-3))
    eager = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention": "eager"}})
    assert hosttime.host_block_ms(eager, _setup()) == pytest.approx((49.72 * 13.48e-3, 52.76 * 13.48e-3))
    other = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention": "sliding"}})
    assert hosttime.host_block_ms(other, _setup()) == (0.0, 0.0)  # a kind the record does not list: nothing


@pytest.mark.parametrize("gpu, call_us", [("gb200", 37.08), ("h100", 13.48), ("gh200", 33.17)])
def test_a_tiny_blocks_passes_take_the_hosts_time(gpu, call_us):
    profile, (_, block, *_) = _layers(TINY, gpu)
    fwd, bwd = 36.72 * call_us / 1e3, 47.29 * call_us / 1e3
    assert hosttime.host_block_ms(profile, _setup()) == pytest.approx((fwd, bwd))
    assert block.fwd_ms < fwd and block.bwd_ms < bwd  # a 32-token block runs in a few µs on the device
    # its backward also runs the DDP hook on each of its 6 tensors (LLaMA style): main_grad.add_ on the two norm
    # weights, none on the four GEMM-accumulated weights (tests/test_hosttime_step.py)
    hook = (2 * 0.18 + 4 * 0.04) * call_us / 1e3
    assert hosttime.grad_hook_ms(block, profile, _setup()) == pytest.approx(hook)
    none = (fwd - block.fwd_ms) + (bwd + hook - block.bwd_ms)
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == pytest.approx(none)
    # a fully recomputed block issues its forward again (Megatron reruns the whole forward)
    from planner.cost import rules
    rerun = fwd - rules.recompute_ms(block, _setup())
    assert hosttime.host_bound_ms(block, 1, profile, _setup()) == pytest.approx(none + rerun)
    # the embedding's and the head's passes: tests/test_hosttime_step.py


def test_dgx_a100s_host_is_the_xeons_figure_carried_by_specint_speed():
    # 13.48 µs (TransformerEngine#2053, DGX H100's Xeon 8480C) x 13.9 / 8.92 (SPECspeed2017_int_base medians, Xeon
    # Platinum 8480+ and EPYC 7742) = 21.006 -> 21.01 µs, on both A100s (the same DGX A100 host)
    for name in ("a100-80g", "a100-40g"):
        assert archs.gpu(name).host_call_us == 21.01
    profile, (_, block, *_) = _layers(TINY, "a100-80g")
    # the tiny block's passes by hand: forward 36.72 Linears x 21.01 µs = 0.7714872 ms, backward 47.29 x 21.01 =
    # 0.9935629 ms, its hooks (2 x 0.18 + 4 x 0.04) x 21.01 = 0.010925 ms; the device's few µs are under all three
    assert hosttime.host_block_ms(profile, _setup()) == pytest.approx((0.7714872, 0.9935629))
    assert hosttime.grad_hook_ms(block, profile, _setup()) == pytest.approx(0.0109252)
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == pytest.approx(
        0.7714872 + 0.9935629 + 0.0109252 - block.fwd_ms - block.bwd_ms)


def test_each_pass_is_its_own_max():
    # a device whose forward outlasts the host's but whose backward does not: only the backward's excess is charged
    profile, (_, block, *_) = _layers(TINY, "h100")
    fwd, bwd = hosttime.host_block_ms(profile, _setup())
    bwd += hosttime.grad_hook_ms(block, profile, _setup())  # the DDP hooks run inside the backward
    from dataclasses import replace
    slow_fwd = replace(block, fwd_ms=fwd * 2, bwd_ms=bwd / 2)
    assert hosttime.host_bound_ms(slow_fwd, 0, profile, _setup()) == pytest.approx(bwd / 2)
    slow_bwd = replace(block, fwd_ms=fwd / 4, bwd_ms=bwd * 2)
    assert hosttime.host_bound_ms(slow_bwd, 0, profile, _setup()) == pytest.approx(fwd * 3 / 4)


def test_no_floor_where_nothing_is_published_or_read():
    profile, (_, block, *_) = _layers(TINY, "b200")  # DGX B200's host: no published figure
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == 0.0
    profile, (_, block, *_) = _layers(TINY, "gb200")
    assert hosttime.host_bound_ms(block, 0, profile, _setup("torchtitan")) == 0.0  # the record reads no host time


def test_long_kernels_are_not_host_bound():
    # LLaMA 3 8B's block at 8192 tokens on GB200: each pass on the device (ms) is over three times the host's
    profile, layers = _layers(archs.arch("llama3-8b"), "gb200", seq=8192)
    block = next(layer for layer in layers if layer.kind == "decoder_block")
    fwd, bwd = hosttime.host_block_ms(profile, _setup())
    assert block.fwd_ms > 3 * fwd and block.bwd_ms > 3 * bwd
    assert hosttime.host_bound_ms(block, 1, profile, _setup()) == 0.0


MOE = archs.Arch(name="tiny-moe", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4, num_kv_heads=2,
                 vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32)


@pytest.mark.parametrize("gpu, call_us", [("gb200", 37.08), ("h100", 13.48)])
def test_a_moe_block_takes_the_moe_replicas_host_time(gpu, call_us):
    # scripts/bench_host.py's MoE block (alltoall dispatcher, fused router and permute): 77.10 and 86.41 Linear
    # forwards, with flash attention; under another attention kind the record lists none for it
    profile, layers = _layers(MOE, gpu)
    block = next(layer for layer in layers if layer.kind == "moe_block")
    fwd, bwd = 77.10 * call_us / 1e3, 86.41 * call_us / 1e3
    assert hosttime.host_block_ms(profile, _setup(), moe=True) == pytest.approx((fwd, bwd))
    assert block.fwd_ms < fwd and block.bwd_ms < bwd
    # its backward holds the DDP's hooks on its 21 tensors (tests/test_hosttime_step.py): the two norms' and router's
    # with main_grad.add_ (0.18 Linears each), the 18 GEMM-accumulated weights' without (0.04)
    hooks = (3 * 0.18 + 18 * 0.04) * call_us / 1e3
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == pytest.approx(
        fwd - block.fwd_ms + bwd + hooks - block.bwd_ms)
    eager = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention": "eager"}})
    assert hosttime.host_block_ms(eager, _setup(), moe=True) == (0.0, 0.0)
    assert hosttime.host_bound_ms(block, 0, profile, _setup("torchtitan")) == 0.0


MLA = archs.Arch(name="tiny-mla", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4, num_kv_heads=4,
                 vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32, kv_lora_rank=16, q_lora_rank=24,
                 qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)


def test_a_latent_attention_block_takes_the_mla_blocks_host_time():
    """scripts/bench_host.py's MLABlock (MLASelfAttention's own norm, four latent projections, unfused rotary, cats):
    by the profile's attention kind, not the dense block's; a MoE block keeps the "moe" entry."""
    profile, _ = _layers(MLA, "h100")
    assert profile.assumptions["attention"] == "flash"
    assert hosttime.host_block_ms(profile, _setup()) == pytest.approx((56.72 * 13.48e-3, 55.81 * 13.48e-3))
    eager = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention": "eager"}})
    assert hosttime.host_block_ms(eager, _setup()) == pytest.approx((66.60 * 13.48e-3, 66.21 * 13.48e-3))
    assert hosttime.host_block_ms(profile, _setup(), moe=True) == pytest.approx((77.10 * 13.48e-3, 86.41 * 13.48e-3))
    gb200, _ = _layers(MLA, "gb200")
    assert hosttime.host_block_ms(gb200, _setup()) == pytest.approx((56.72 * 37.08e-3, 55.81 * 37.08e-3))
