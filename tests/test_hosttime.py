"""The host's floor under a dense block's forward (planner/cost/hosttime.py): five TE module calls at
the host's published CPU time per module forward, charged only where it exceeds the device's time."""

from __future__ import annotations

import pytest

from planner.cost import hosttime
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


@pytest.mark.parametrize("gpu, call_us", [("gb200", 37.08), ("h100", 13.48), ("gh200", 33.17)])
def test_a_tiny_blocks_forward_takes_the_hosts_five_module_calls(gpu, call_us):
    profile, (embedding, block, *rest) = _layers(TINY, gpu)
    host = 5 * call_us / 1e3  # linear_qkv, core_attention, linear_proj, linear_fc1, linear_fc2
    assert hosttime.host_forward_ms(profile, _setup()) == pytest.approx(host)
    assert block.fwd_ms < host  # a 32-token block runs in a few µs on the device
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == pytest.approx(host - block.fwd_ms)
    # a fully recomputed block issues its forward again (Megatron reruns the whole forward)
    assert hosttime.host_bound_ms(block, 1, profile, _setup()) == pytest.approx(2 * (host - block.fwd_ms))
    assert hosttime.host_bound_ms(embedding, 0, profile, _setup()) == 0.0  # not a block: not counted
    assert hosttime.host_bound_ms(rest[-1], 0, profile, _setup()) == 0.0


def test_no_floor_where_nothing_is_published_or_read():
    profile, (_, block, *_) = _layers(TINY, "a100-80g")  # DGX A100's host: no published figure
    assert hosttime.host_bound_ms(block, 0, profile, _setup()) == 0.0
    profile, (_, block, *_) = _layers(TINY, "gb200")
    assert hosttime.host_bound_ms(block, 0, profile, _setup("torchtitan")) == 0.0  # the record reads no host calls


def test_long_kernels_are_not_host_bound():
    # LLaMA 3 8B's block at 8192 tokens on GB200: the device's forward (ms) is far above 5 x 37 µs
    profile, layers = _layers(archs.arch("llama3-8b"), "gb200", seq=8192)
    block = next(layer for layer in layers if layer.kind == "decoder_block")
    assert block.fwd_ms > 10 * hosttime.host_forward_ms(profile, _setup())
    assert hosttime.host_bound_ms(block, 1, profile, _setup()) == 0.0
