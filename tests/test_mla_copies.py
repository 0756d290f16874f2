"""transformers' latent attention's copies (planner/profiler/hf_mla.py) against the fake profile's own trace of
DeepseekV3Attention at toy widths, op by op: the query's cat, the key build, the output's copy and their
gradients' copies, by hand; the fake's count of in-place destinations and fills is the only difference."""

from __future__ import annotations

from collections import Counter

import torch
from test_fake_mla import MLA

from planner.models import archconfig, archs
from planner.profiler import analytic_time, device_attention, fake, fake_mode, hf_mla, te_mla
from planner.profiler.formulas import Shape
from planner.profiler.opclass import Tracker
from planner.profiler.storages import counted_as

COPIES = {"aten.cat", "aten.clone", "aten.copy_", "aten.zeros_like", "aten.sum"}


class _Copies(fake.OpBytes):
    """OpBytes, keeping each class's bytes of the copy-like ops on the attention's 4-d (batch, heads, tokens,
    width) tensors and the latent split's cat apart; rotary's own cats (of its halves) are left out by their width,
    the block's other copies (3-d hidden states) by their rank."""

    def __init__(self, tracker, config: dict) -> None:
        super().__init__(tracker)
        self.copies: Counter = Counter()
        self._half, self._latent = config["qk_rope_head_dim"] // 2, config["kv_lora_rank"]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = Counter(self.classed)
        out = super().__torch_dispatch__(func, types, args, kwargs or {})
        name = str(func.overloadpacket)
        shapes = [tuple(t.shape) for t in fake._tensors((args, kwargs or {}))]
        rotary_cat = name == "aten.cat" and all(shape[-1] == self._half for shape in shapes)
        latent_cat = name == "aten.cat" and len(shapes) == 2 and shapes[0][-1] == self._latent
        if name in COPIES and not rotary_cat and (latent_cat or all(len(shape) == 4 for shape in shapes)):
            for key, moved in (Counter(self.classed) - before).items():
                self.copies[key] += moved
        return out


def _trace(config: dict, seq_len: int) -> tuple[Counter, Counter]:
    model, layers, batch, mode = fake_mode.hf_model_on_meta(config, seq_len=seq_len)
    with mode, counted_as("cuda"), device_attention.device_attention("cuda", archs.gpu("h100"), layers):
        fake_mode.fake_module(model, mode)
        x = layers[0][1](fake_mode.fake_tensor(batch(1)[0], mode)).detach().requires_grad_(True)
        with Tracker() as tracker:
            with _Copies(tracker, config) as forward:
                out = layers[1][1](x)
            with _Copies(tracker, config) as backward:
                out.backward(torch.zeros_like(out))
    return forward.copies, backward.copies


def test_copies_by_hand_against_the_trace():
    """64 tokens, 4 heads, q/k 16 + 8, v 16, kv latent 32 (test_fake_mla.MLA's dense block)."""
    T, n, d_qk, nope, rope, v, r = 64, 4, 24, 16, 8, 16, 32
    arch, shape = archconfig.from_hf_config(MLA, where="test", name="test"), Shape(seq_len=T, micro_batch_size=1)
    forward = 4 * T * n * d_qk + 4 * T * n * d_qk + 4 * T * n * v  # query cat, key build, output copy
    kv_side = (2 * 4 * T * n * (nope + v) + 4 * T * (r + rope) + 2 * 4 * T * n * d_qk + 4 * T * n * d_qk
               + 2 * T * n * rope + 4 * T * n * rope + 2 * T * n * rope + 2 * T * rope)
    assert (forward, kv_side) == (65_536, 166_912)
    assert hf_mla.forward_bytes(arch, shape) == Counter(attention=forward)
    assert hf_mla.backward_bytes(arch, shape) == Counter(attention=kv_side, elementwise=2 * 4 * T * n * d_qk)
    fake_fwd, fake_bwd = hf_mla.fake_only_bytes(arch, shape)
    assert (fake_fwd, fake_bwd) == (2 * T * n * d_qk, 4 * T * n * d_qk + 4 * T * n * rope)
    traced_fwd, traced_bwd = _trace(MLA, T)
    assert traced_fwd == Counter(attention=forward + fake_fwd)
    assert traced_bwd == Counter(attention=kv_side + fake_bwd, elementwise=2 * 4 * T * n * d_qk)


def test_the_eager_count_charges_them_and_te_replaces_them():
    arch, shape = archconfig.from_hf_config(MLA, where="test", name="test"), Shape(seq_len=64, micro_batch_size=1)
    _, fwd, bwd = analytic_time._projections(arch, shape)
    rotated = 64 * (4 * 8 + 8)
    assert fwd["attention"] == analytic_time.ROTARY_FWD * rotated + 65_536
    assert bwd["attention"] == analytic_time.ROTARY_BWD * rotated + 166_912
    eager = te_mla.eager_bytes(arch, shape)  # what TE's record takes off the eager block: the copies too
    latents = 64 * 32
    assert eager == (36 * latents + 20 * rotated + 65_536, 96 * latents + 32 * rotated + 166_912 + 2 * 4 * 64 * 4 * 24)
