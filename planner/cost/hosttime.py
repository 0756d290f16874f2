"""The host's floor under a layer's forward: a pass cannot finish before the host has issued it.

Without CUDA graphs the host issues every kernel of a pass through the framework's Python; where it
issues them more slowly than the device runs them, the pass takes the host's time, on any GPU
(issue 35: the Megatron-LM functional tests T15-T20, whose published H100 -> GB200 speed-up, 1.46x
and 1.31x, is below the GPUs' matmul ratio). A pass is max(device time, host time); the cost model
charges the difference where the host's is larger (`host_bound_ms`), nothing elsewhere.

The host time is a floor, from published figures only:
- what a dense block's forward issues: the runtime record's `host_calls_per_block`, the framework
  modules a dense block calls each forward (Megatron-core on Transformer Engine: linear_qkv,
  core_attention, linear_proj, linear_fc1, linear_fc2, the TE layer spec's five TE modules,
  megatron/core/models/gpt/gpt_layer_specs.py 140-160, Megatron-LM 6e091e1b); the bias-dropout-adds,
  rotary and activation functions between them are not counted (no published per-call time);
- what one such call costs the host: GPU.host_call_us, the published CPU time of one Linear
  module's forward on the GPU's reference system (TransformerEngine#2053, 2025-08-11: BF16, hidden
  2048, 8192 tokens; torch's Linear 13.48 µs on a DGX H100's Xeon Platinum 8480C, 37.08 µs on GB200's
  Grace, 33.17 µs on GH200's; TE's Linear then 99.66 µs on GB200, since brought to "nearly the same
  with vanilla torch linear" for BF16, a TE maintainer in TransformerEngine#2126, 2026-01-03, before
  the tests' TE v2.16): torch's figure is read for each TE module, a lower bound for LayerNormLinear
  and DotProductAttention, which do more. No figure is published for the other hosts (DGX A100's
  EPYC, DGX B200's), nor for a module's backward: those charge nothing.

Syncs, where the host cannot run ahead of the device: Megatron-LM's interleaved schedule with
overlap_p2p_comm (the default; batch_p2p_comm off, so no torch.cuda.synchronize after its p2p ops:
p2p_communication.py 416-419, arguments.py 979-996, 6e091e1b) waits on its receives on the device,
not the host; the loss function's NaN and Inf checks (pretrain_gpt.py 149-165, rerun_state_machine.py
519-521: `if rejection_func(loss)`) sync the host once per microbatch on the last stage, after which
the host's lead restarts from nothing: the floor applies per pass, as charged here.
"""

from __future__ import annotations

from planner.cost import rules, runtimes
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

DENSE_BLOCK = "decoder_block"


def host_forward_ms(profile: Profile, setup: TrainSetup) -> float:
    """ms the host takes to issue one dense block's forward (the module's docstring); 0 where the
    runtime's record or the profile's GPU has no figure."""
    calls = runtimes.of(setup.training).host_calls_per_block
    named = profile.assumptions.get("gpu")
    if not calls or not isinstance(named, str):
        return 0.0
    from planner.models import archs

    return calls * archs.gpu(named).host_call_us / 1e3


def host_bound_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch a dense block's forward (and a full recompute's rerun) takes beyond its device
    time where the host issues it more slowly: max(device, host) less device; 0 for other layers (as
    jobsettings' terms, an analytic profile's dense blocks: a fake profile's, kinds named by the model's
    class, are not read)."""
    if layer.kind != DENSE_BLOCK:
        return 0.0
    host = host_forward_ms(profile, setup)
    if not host:
        return 0.0
    extra = max(0.0, host - layer.fwd_ms)
    if int(ckpt) == 1:  # full recompute: the forward issued again
        extra += max(0.0, host - rules.recompute_ms(layer, setup))
    return extra
