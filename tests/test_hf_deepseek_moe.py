"""A DeepSeek-V3 MoE block's mixture (planner/profiler/hf_moe.py, analytic_moe.experts_bytes) against the fake
profile's own trace of transformers 5.24's DeepseekV3MoE at toy widths: T = 16 tokens, h = 64, E = 4 routed
experts of f = 32, k = 2 (S = 32), one shared expert of 32, latent attention as test_fake_mla.MLA."""

from __future__ import annotations

import pytest
import torch
from test_fake_mla import MLA

from planner.models import archconfig, archs
from planner.profiler import analytic_moe, analytic_time, device_attention, fake, fake_mode, hf_moe
from planner.profiler.formulas import Shape
from planner.profiler.opclass import Tracker
from planner.profiler.storages import counted_as

T, H, E, K, F = 16, 64, 4, 2, 32
S = T * K
MOE = dict(MLA, first_k_dense_replace=0, routed_scaling_factor=2.5)


def _trace(config: dict) -> tuple[fake.OpBytes, fake.OpBytes]:
    pytest.importorskip("transformers")
    model, layers, batch, mode = fake_mode.hf_model_on_meta(config, seq_len=T)
    with mode, counted_as("cuda"), device_attention.device_attention("cuda", archs.gpu("h100"), layers):
        fake_mode.fake_module(model, mode)
        x = layers[0][1](fake_mode.fake_tensor(batch(1)[0], mode)).detach().requires_grad_(True)
        with Tracker() as tracker:
            with fake.OpBytes(tracker) as forward:
                out = layers[1][1](x)
            with fake.OpBytes(tracker) as backward:
                out.backward(torch.zeros_like(out))
    return forward, backward


def test_router_bytes_by_hand():
    """Forward: the casts 6 T h + 6 E h, the bias 2 E; over tokens x experts 44 T E (sigmoid 8, the bias add 8,
    the bool cast 5, ~ 2, masked_fill 9, three top-k reads 4 each, the gather's read 4); the group scores at
    g = t = 1 76 T (top-2 24 + 4, sum 12, top-t 4 + 12, zeros_like 8, scatter_ 8 + 8); top-k and gather 24 S,
    the scale 8 S; the renormalization 20 S + 16 T. Backward 84 S + 16 T + 24 T E + 6 T h + 6 E h."""
    forward, backward = hf_moe.router_bytes(T, H, E, K)
    assert forward == 6 * T * H + 6 * E * H + 2 * E + 44 * T * E + 76 * T + 32 * S + (20 * S + 16 * T) == 13_640
    assert backward == 84 * S + 16 * T + 24 * T * E + 6 * T * H + 6 * E * H == 12_160
    # two groups, top-1 group: the expanded mask's reshape copies (8 T E), the group terms 56 T g + 20 T t
    assert hf_moe.router_bytes(T, H, E, K, groups=2)[0] == 13_640 + 8 * T * E + 56 * T == 15_048
    # no renormalization: no sum, + 1e-20, clone, divide, and their gradients
    assert hf_moe.router_bytes(T, H, E, K, renormalizes=False) == (13_640 - 20 * S - 16 * T, 12_160 - 60 * S - 16 * T)


def test_the_mixture_is_the_fake_count_of_transformers_code():
    """The experts' module (with the shared expert's SwiGLU and the experts' input-gradient add): the
    analytic block's `activation` to the byte both ways; the router: the MoE block's `elementwise` less a
    dense block's (the same attention; its SwiGLU's gate/up gradient sum is 6 T h whatever its width, as the
    shared expert's) is the router's bytes and one add (6 T h: the shared experts' output forward, where their input
    gradient meets the routed path's backward); two groups alike, with the mask's copy."""
    arch = archconfig.from_hf_config(MOE, where="test", name="test")
    assert hf_moe.counts_deepseek(arch) and not analytic_moe.counts_mixture(arch)
    fwd, bwd, _ = analytic_time.block_work(arch, Shape(seq_len=T, micro_batch_size=1), moe=True)
    moe_fwd, moe_bwd = _trace(MOE)
    dense_fwd, dense_bwd = _trace(MLA)
    assert dict(moe_fwd.classed)["activation"] == dict(fwd.classed)["activation"] == 72_880
    assert dict(moe_bwd.classed)["activation"] == dict(bwd.classed)["activation"] == 178_816
    router_fwd, router_bwd = hf_moe.router_bytes(T, H, E, K)
    assert moe_fwd.classed["elementwise"] - dense_fwd.classed["elementwise"] == router_fwd + 6 * T * H
    assert moe_bwd.classed["elementwise"] - dense_bwd.classed["elementwise"] == router_bwd + 6 * T * H
    grouped_fwd, _ = _trace(dict(MOE, n_group=2, topk_group=1))
    assert grouped_fwd.classed["elementwise"] - dense_fwd.classed["elementwise"] == \
        hf_moe.router_bytes(T, H, E, K, groups=2)[0] + 6 * T * H


def test_the_experts_bytes_by_hand():
    """fp32 weights (w = o = 4): forward 20 S h + 10 S f + 12 T h + 132 S + 12 E, backward 60 S h + 26 S f
    + 12 T h + 52 S (the analytic_moe docstring's terms summed); with the shared expert's SwiGLU (10 T f forward,
    18 T f backward) and the experts' input-gradient add (6 T h) the traced 72,880 / 178,816."""
    forward, backward = analytic_moe.experts_bytes(T, H, F, E, K)
    shared_fwd, shared_bwd = 10 * T * F, 18 * T * F
    assert forward == 20 * S * H + 10 * S * F + 12 * T * H + 132 * S + 12 * E
    assert backward == 60 * S * H + 26 * S * F + 12 * T * H + 52 * S
    assert forward + shared_fwd == 72_880
    assert backward + 6 * T * H + shared_bwd == 178_816
