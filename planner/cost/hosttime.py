"""The host's floor under a dense block's passes: a pass cannot finish before the host has issued it.

Without CUDA graphs the host issues every kernel of a pass through the framework's Python; where it
issues them more slowly than the device runs them, the pass takes the host's time, on any GPU
(issue 35: the Megatron-LM functional tests T15-T20, whose published H100 -> GB200 speed-up, 1.46x
and 1.31x, is below the GPUs' matmul ratio). A pass is max(device time, host time); the cost model
charges the difference where the host's is larger (`host_bound_ms`), nothing elsewhere.

The host time is a floor, from a published absolute and a measured ratio:
- what one torch Linear forward costs the host: GPU.host_call_us, the published CPU time of one Linear
  module's forward on the GPU's reference system (TransformerEngine#2053, 2025-08-11: BF16, hidden
  2048, 8192 tokens; torch's Linear 13.48 µs on a DGX H100's Xeon Platinum 8480C, 37.08 µs on GB200's
  Grace, 33.17 µs on GH200's). No figure is published for the other hosts (DGX A100's EPYC, DGX
  B200's): those charge nothing;
- what a dense block's forward and its backward cost in such Linears: the runtime record's
  `host_block_linears` for the profile's attention kind (flash: TE's fused attention, one call; eager:
  TE's UnfusedDotProductAttention, --attention-backend unfused), measured by scripts/bench_host.py
  (docs/framework-facts.md §85) on a torch replica of Megatron-core's TE layer spec block (Megatron-LM 6e091e1b): its five TE modules (each a
  torch Linear or SDPA call: a TE maintainer reads the BF16 TE Linear's CPU overhead as "nearly the same
  with vanilla torch linear", TransformerEngine#2126, 2026-01-03), the q/k/v view and split, the two
  torch.compile'd bias-dropout-adds, the bias-GeLU autograd Function, and the autograd engine's
  backward over all of them. The ratio is the replica's on the machine that ran the script, carried to
  the GPU's host as a multiple of its published Linear: a measured ratio, not a figure of that host.
  Not in it: the embedding, the output layer and loss, the optimizer's per-tensor work, CP's ring
  steps, the local spec's own modules (read as the TE spec's, as its kernels are), the attention
  dropout's RNG-tracker fork.
- what a MoE block's passes cost in such Linears (the record's "moe" entry): scripts/bench_host.py's MoE
  replica (the dense block's attention half, then Megatron-core's MoELayer with the alltoall dispatcher,
  fused router and permute, TE's GroupedLinear, the compiled weighted SwiGLU; docs/framework-facts.md §94).
  Megatron's dispatcher copies the split sizes to the host each MoE layer (token_dispatcher.py
  `_maybe_dtoh_and_synchronize`, TEGroupedMLP's `tokens_per_expert.tolist()`): the host waits for the
  device there, so it cannot have issued the rest of the layer ahead; per pass, max(device, host) is the
  floor either way. Not in it: the all-to-all's own issue (four collectives a layer), the flex dispatcher's
  (HybridEP / DeepEP) kernels, and CUDA graphs (`--cuda-graph-impl`), under which the graphed scope issues no
  per-op host work: read as not modelled, the whole block's host time charged.

A pass takes max(device, host): the forward against the layer's forward time, the backward against
its backward; a full recompute's rerun against the recompute's device time, at the forward's host time.

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
MOE_BLOCK = "moe_block"
MOE = "moe"  # the record's host_block_linears entry of a MoE block (the alltoall dispatcher's; flash attention)


def host_block_ms(profile: Profile, setup: TrainSetup, *, moe: bool = False) -> tuple[float, float]:
    """ms the host takes to issue one dense block's forward and its backward (the module's docstring), the
    record's figure for the profile's attention kind; `moe`: a MoE block's (the record's "moe" entry, measured
    with flash attention: none under another kind); (0, 0) where the record or the profile's GPU has none."""
    kind = profile.assumptions.get("attention")
    if moe:
        kind = MOE if kind == "flash" else None
    linears = {name: (fwd, bwd) for name, fwd, bwd in runtimes.of(setup.training).host_block_linears}
    fwd, bwd = linears.get(kind, (0.0, 0.0))
    named = profile.assumptions.get("gpu")
    if not (fwd or bwd) or not isinstance(named, str):
        return 0.0, 0.0
    from planner.models import archs

    call_ms = archs.gpu(named).host_call_us / 1e3
    return fwd * call_ms, bwd * call_ms


def host_bound_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch a dense block's passes take beyond their device time where the host issues them
    more slowly: max(device, host) less device for the forward, the backward, and a full recompute's
    rerun of the forward; 0 for other layers (as jobsettings' terms, an analytic profile's dense and MoE
    blocks: a fake profile's, kinds named by the model's class, are not read)."""
    if layer.kind not in (DENSE_BLOCK, MOE_BLOCK):
        return 0.0
    fwd, bwd = host_block_ms(profile, setup, moe=layer.kind == MOE_BLOCK)
    if not (fwd or bwd):
        return 0.0
    extra = max(0.0, fwd - layer.fwd_ms) + max(0.0, bwd - layer.bwd_ms)
    if int(ckpt) == 1:  # full recompute: the forward issued again
        extra += max(0.0, fwd - rules.recompute_ms(layer, setup))
    return extra
