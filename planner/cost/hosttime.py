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
  Grace, 33.17 µs on GH200's). None is published for DGX A100's EPYC 7742: the Xeon's 13.48 µs carried by
  the two CPUs' SPECspeed2017_int_base (8.92 and 13.9), 21.01 µs, a model (planner/models/gpus.py; it does not
  carry to Grace: docs/framework-facts.md §873). The other hosts (DGX B200's) charge nothing;
- what a dense block's forward and its backward cost in such Linears: the runtime record's
  `host_block_linears` for the profile's attention kind (flash: TE's fused attention, one call; eager:
  TE's UnfusedDotProductAttention, --attention-backend unfused), measured by scripts/bench_host.py
  (docs/framework-facts.md §85) on a torch replica of Megatron-core's TE layer spec block (Megatron-LM 6e091e1b): its five TE modules (each a
  torch Linear or SDPA call: a TE maintainer reads the BF16 TE Linear's CPU overhead as "nearly the same
  with vanilla torch linear", TransformerEngine#2126, 2026-01-03), the q/k/v view and split, the two
  torch.compile'd bias-dropout-adds, the bias-GeLU autograd Function, and the autograd engine's
  backward over all of them. The ratio is the replica's on the machine that ran the script, carried to
  the GPU's host as a multiple of its published Linear: a measured ratio, not a figure of that host.
  Under context parallelism 2 with TE's p2p ring, the record's "flash_cp2": the same block with
  AttnFuncWithCPAndKVP2P's two ring steps a pass (scripts/bench_host_cp.py, §97; other CP sizes: the block
  without the ring, not measured). Not in it: the local spec's own modules (read as the TE spec's, as its
  kernels are), the attention dropout's RNG-tracker fork, the ring's sends, receives, CUDA streams and events.
- what a latent-attention dense block's passes cost (the record's "mla_flash" and "mla_eager"): scripts/bench_host.py's
  MLABlock (Megatron-core's TE spec with MLASelfAttention at d98e8a64: its own input norm, the four latent
  projections, the latent split, the IdentityOp norms, the unfused rotary on q's and k's positional parts, the cats;
  docs/framework-facts.md §882); a MoE block with latent attention is read as the "moe" entry (dense attention).
- what a MoE block's passes cost in such Linears (the record's "moe" entry): scripts/bench_host.py's MoE
  replica (the dense block's attention half, then Megatron-core's MoELayer with the alltoall dispatcher,
  fused router and permute, TE's GroupedLinear, the compiled weighted SwiGLU; docs/framework-facts.md §94).
  Megatron's dispatcher copies the split sizes to the host each MoE layer (token_dispatcher.py
  `_maybe_dtoh_and_synchronize`, TEGroupedMLP's `tokens_per_expert.tolist()`): the host waits for the
  device there, so it cannot have issued the rest of the layer ahead; per pass, max(device, host) is the
  floor either way. Not in it: the all-to-all's own issue (four collectives a layer), the flex dispatcher's
  (HybridEP / DeepEP) kernels, and CUDA graphs (`--cuda-graph-impl`), under which the graphed scope issues no
  per-op host work: read as not modelled, the whole block's host time charged. The pass's device time the host is
  measured against includes its dispatch and combine (_exchange_pass_ms): they run on the device inside
  the pass (NCCL's all_to_all_single, or the flex backend's kernels on the compute stream) while the host issues
  on, so the host is charged only where its issue outlasts the experts' compute and the exchanges together.

A pass takes max(device, host): the forward against the layer's forward time, the backward against
its backward; a full recompute's rerun against the recompute's device time, at the forward's host time.

The rest of the step (the record's `host_rest_linears`, scripts/bench_host_step.py, docs/framework-facts.md §97),
Megatron-LM d98e8a64:
- the embedding's forward and backward: per pass max(device, host), as a block's;
- the output layer (final norm and output linear) and the loss (the vocab-parallel cross-entropy, loss_func and
  its two validate_result checks, which read the loss on the host: a sync): on the last stage a microbatch's
  forward reaches the loss and its backward starts there (schedules.py forward_step, backward_step), so the
  output layer's and the loss's passes are one span, max(device, host) over it;
- the DDP's backward post-hook on each parameter tensor (`grad_hook_ms`, distributed_data_parallel.py 560-584:
  main_grad.add_ unless the GEMM accumulated into it), in the backward of the layer holding the tensor;
- the optimizer step (`host_step_ms`, once a step): its per-tensor loops (optimizer.py, distrib_optimizer.py,
  clip_grads.py count_zeros_fp32, TE FusedAdam.step, calc_params_l2_norm) over the layer's parameter tensors, and
  on the embedding's stage its fixed calls. count_zeros' and the params norm's `.item()` wait for the device
  (--log-num-zeros-in-grad, --log-params-norm; the loss's in training_log): the host cannot run ahead past them.
  What runs before the first one may hide in the host's lead at the last backward (each layer's by its own
  backward's lead); what runs after it is charged whole (an upper bound by the Adam kernel's device time, which
  runs while the host copies the shards back).
- in each pass, the host calls beside the layers' ops (planner/cost/hostcalls.py, docs/framework-facts.md §106):
  the tensor-parallel collectives' issue (the profile's, and the loss's all-reduces in the head's span), under
  --overlap-param-gather the forward pre-hook on each module a forward calls, and get_batch's copies and
  broadcasts in the first stage's embedding forward and the last stage's span.
Not in it: NCCL's own enqueue of a collective, the data loader's next(), the tensorboard writer and training_log,
the timers' barrier, a MoE or MLA block's modules under --overlap-param-gather's pre-hooks (0 counted; their
parameter tensors are counted, planner/cost/blocktensors.py).

Megatron-LM's timers above level 0 (the record's timer_syncs, --timing-log-level; docs/framework-facts.md §275-§277)
call torch.cuda.synchronize() at each start and stop. Inside a timed region the host issues and the device runs as
before (each pass max(device, host), as charged here); what the sync takes away is the overlap across it: the
region starts with the device idle, so its first call's issue is not hidden behind earlier work (timer_sync_ms: one
torch call, GPU.host_call_us, a region); at level 1 forward-backward stops (after finalize_model_grads) and the
optimizer starts with a sync, so the step's loops find no lead left in the last backward (host_step_ms).

Syncs, where the host cannot run ahead of the device: Megatron-LM's interleaved schedule with
overlap_p2p_comm (the default; batch_p2p_comm off, so no torch.cuda.synchronize after its p2p ops:
p2p_communication.py 416-419, arguments.py 979-996, 6e091e1b) waits on its receives on the device,
not the host; the loss function's NaN and Inf checks (pretrain_gpt.py 149-165, rerun_state_machine.py
519-521: `if rejection_func(loss)`) sync the host once per microbatch on the last stage, after which
the host's lead restarts from nothing: the floor applies per pass, as charged here.
"""

from __future__ import annotations

from planner.cost import blocktensors, contextparallel, hostcalls, rules, runtimes
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

DENSE_BLOCK = "decoder_block"
EMBEDDING = "embedding"
HEAD = "norm+lm_head"
MOE_BLOCK = "moe_block"
MOE = "moe"  # the record's host_block_linears entry of a MoE block (the alltoall dispatcher's; flash attention)
MLA = "mla"  # the record's host_block_linears entries of a latent-attention dense block: "mla_flash", "mla_eager"


def host_block_ms(profile: Profile, setup: TrainSetup, *, moe: bool = False) -> tuple[float, float]:
    """ms the host takes to issue one dense block's forward and its backward (the module's docstring), the
    record's figure for the profile's attention kind (a latent attention's: "mla_<kind>"; under context parallelism
    with TE's p2p ring, the kind's "_cp<N>" entry where the record measured one); `moe`: a MoE block's (the record's "moe" entry, measured
    with flash attention: none under another kind); (0, 0) where the record or the profile's GPU has none."""
    kind = profile.assumptions.get("attention")
    if moe:
        kind = MOE if kind == "flash" else None
    elif (profile.assumptions.get("model") or {}).get("kv_lora_rank"):
        kind = f"{MLA}_{kind}"  # a latent attention's block (MLASelfAttention), measured apart
    linears = {name: (fwd, bwd) for name, fwd, bwd in runtimes.of(setup.training).host_block_linears}
    cp = int(profile.assumptions.get("cp", 1) or 1)
    ring = f"{kind}_cp{cp}"  # TE's p2p ring at this CP size, where measured; else the block without it
    if cp > 1 and ring in linears and contextparallel.comm_type(setup.training) == "p2p" and not moe:
        kind = ring
    fwd, bwd = linears.get(kind, (0.0, 0.0))
    named = profile.assumptions.get("gpu")
    if not (fwd or bwd) or not isinstance(named, str):
        return 0.0, 0.0
    from planner.models import archs

    call_ms = archs.gpu(named).host_call_us / 1e3
    return fwd * call_ms, bwd * call_ms


def _call_ms(profile: Profile) -> float:
    named = profile.assumptions.get("gpu")
    if not isinstance(named, str):
        return 0.0
    from planner.models import archs

    return archs.gpu(named).host_call_us / 1e3


def rest_ms(profile: Profile, setup: TrainSetup, part: str) -> tuple[float, float]:
    """ms the host takes for one part outside the blocks (the record's host_rest_linears): "embedding", "output",
    "loss" (forward, backward); "grad_hook" (a tensor with main_grad.add_, without); "step", "inner_step", "zeros",
    "params_norm" (a tensor, the fixed calls). (0, 0) where the record or the GPU's host has none."""
    rest = {name: (a, b) for name, a, b in runtimes.of(setup.training).host_rest_linears}
    a, b = rest.get(part, (0.0, 0.0))
    call_ms = _call_ms(profile) if (a or b) else 0.0
    return a * call_ms, b * call_ms


def param_tensors(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """The parameter tensors a layer holds as Megatron-core builds it from the profile's model: a block's as
    planner/cost/blocktensors.py counts them (a GPT-style block 12, a LLaMA-style block 6, +1 a q/k/v bias, +2 or 4
    q/k norms; a latent-attention block's own projections and norms; a MoE block's router, its rank's local experts'
    weights one tensor each, and its shared experts); the embedding its word table and a learned position table;
    the head the final norm and, where it is not the embedding's own tensor (untied, or a pipeline's last stage: a
    copy), the output weight."""
    model = profile.assumptions.get("model") or {}
    gpt = model.get("style") == "gpt"
    if layer.kind in (DENSE_BLOCK, MOE_BLOCK):
        return blocktensors.block_tensors(model, moe=layer.kind == MOE_BLOCK, ep=setup.data_parallel.ep)[0]
    if layer.kind == EMBEDDING:
        return 1 + (1 if gpt and not model.get("rotary") and model.get("max_position_embeddings") else 0)
    if layer.kind == HEAD:
        return (2 if gpt else 1) + (1 if not model.get("tie_word_embeddings") or setup.pipeline.stages > 1 else 0)
    return 0


def _linear_weights(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """Of param_tensors, the weights whose gradient a GEMM accumulates into main_grad under gradient-accumulation
    fusion (TE's linears and grouped linears; Megatron's output layer): a block's linears' (blocktensors), the
    head's output weight where counted."""
    model = profile.assumptions.get("model") or {}
    if layer.kind in (DENSE_BLOCK, MOE_BLOCK):
        return blocktensors.block_tensors(model, moe=layer.kind == MOE_BLOCK, ep=setup.data_parallel.ep)[1]
    if layer.kind == HEAD:
        norm = 2 if model.get("style") == "gpt" else 1
        return param_tensors(layer, profile, setup) - norm
    return 0


def grad_hook_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the DDP's backward post-hooks take on the layer's tensors (the record's "grad_hook":
    with main_grad.add_, and without where the GEMM accumulated: fused weights unless
    --no-gradient-accumulation-fusion)."""
    added, fused = rest_ms(profile, setup, "grad_hook")
    tensors = param_tensors(layer, profile, setup)
    skip = 0 if setup.training.unfused_grad_accumulation else _linear_weights(layer, profile, setup)
    return added * (tensors - skip) + fused * skip


def _backward_lead_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms the device's backward of this layer runs beyond the host's issue of it (its rerun's with it under full
    recompute): the lead the host gains over the device in the layer's last backward; 0 where host-bound."""
    if layer.kind == EMBEDDING:
        return max(0.0, layer.bwd_ms - _embedding_host(layer, profile, setup)[1])
    if layer.kind not in (DENSE_BLOCK, MOE_BLOCK):
        return 0.0
    _, bwd, rerun = _block_host(layer, profile, setup)
    exchange = _exchange_pass_ms(layer, setup)  # the backward's dispatch and combine: device time (host_bound_ms)
    device, host = layer.bwd_ms + exchange, bwd
    if int(ckpt) == 1:
        device, host = device + rules.recompute_ms(layer, setup) + exchange, host + rerun
    return max(0.0, device - host)


def _block_host(layer: LayerCost, profile: Profile, setup: TrainSetup) -> tuple[float, float, float]:
    """ms the host takes for a block's forward, its backward (with the DDP hooks) and a full recompute's rerun:
    the record's block, its tensor-parallel collectives' issue and (forward, rerun) the forward pre-hooks
    (planner/cost/hostcalls.py); (0, 0, 0) where the record or the GPU's host has no block figure."""
    fwd, bwd = host_block_ms(profile, setup, moe=layer.kind == MOE_BLOCK)
    if not (fwd or bwd):
        return 0.0, 0.0, 0.0
    tensors = param_tensors(layer, profile, setup)
    dense = layer.kind == DENSE_BLOCK and not (profile.assumptions.get("model") or {}).get("kv_lora_rank")
    hooks = hostcalls.pre_hooks_ms(hostcalls.block_modules(profile) if dense else 0, tensors, setup, profile)
    return (fwd + hooks + hostcalls.collectives_ms(layer, "fwd", profile, setup),
            bwd + grad_hook_ms(layer, profile, setup) + hostcalls.collectives_ms(layer, "bwd", profile, setup),
            fwd + hooks + hostcalls.collectives_ms(layer, "recompute", profile, setup))


def _exchange_pass_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """One pass's share of rules.all_to_all_ms: a dispatch and a combine (the forward's, the backward's gradients,
    or a full recompute's rerun), device time inside that pass."""
    return rules.all_to_all_ms(layer, 0, setup) / 2


def _embedding_host(layer: LayerCost, profile: Profile, setup: TrainSetup) -> tuple[float, float]:
    """ms the host takes for the embedding's forward (with get_batch on the first stage and the embedding stage's
    pre-hooks) and its backward (with its DDP hooks), each with its collectives' issue; (0, 0) where the record
    has no embedding figure."""
    fwd, bwd = rest_ms(profile, setup, "embedding")
    if not (fwd or bwd):
        return 0.0, 0.0
    hooks = hostcalls.pre_hooks_ms(hostcalls.EMBEDDING_MODULES, param_tensors(layer, profile, setup), setup, profile)
    return (fwd + hooks + hostcalls.get_batch_ms(0, profile, setup)
            + hostcalls.collectives_ms(layer, "fwd", profile, setup),
            bwd + grad_hook_ms(layer, profile, setup) + hostcalls.collectives_ms(layer, "bwd", profile, setup))


def host_step_ms(layer: LayerCost, profile: Profile, setup: TrainSetup, ckpt=0) -> float:
    """ms the host's optimizer step adds once a step for this layer's tensors, and on the embedding's stage the
    step's fixed calls (the module's docstring). The loops before the first sync (the copy to the main grads, the
    norm's filter, the clip's list, count_zeros' loop; with no count_zeros, the inner step's and the params norm's
    loops too) run while the device still finishes the last backward where the host issued it ahead: each layer's
    share hidden by up to its own backward's lead (_backward_lead_ms, a lower bound of the stage's lead); the loops
    after count_zeros' .item() and the fixed calls are charged whole."""
    training = setup.training
    tensors = param_tensors(layer, profile, setup)
    before, fixed = rest_ms(profile, setup, "step")
    after, _ = rest_ms(profile, setup, "inner_step")
    before, after = before * tensors, after * tensors
    for part, on in (("zeros", training.log_num_zeros_in_grad), ("params_norm", training.log_params_norm)):
        per_tensor, once = rest_ms(profile, setup, part) if on else (0.0, 0.0)
        before += per_tensor * tensors if part == "zeros" else 0.0
        after += per_tensor * tensors if part == "params_norm" else 0.0
        fixed += once
    if not training.log_num_zeros_in_grad:  # no .item() before the inner step: its loops run inside the lead too
        before, after = before + after, 0.0
    if not _syncs(setup, "step"):  # a step timer's synchronize leaves the host no lead (timer_sync_ms)
        before -= min(before, _backward_lead_ms(layer, ckpt, profile, setup))
    return before + after + (fixed if layer.kind == EMBEDDING else 0.0)


def _head_and_loss_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """The output layer's and the loss's host time beyond their device time, one span on the last stage."""
    from planner.cost import megatron_loss

    host = sum(rest_ms(profile, setup, "output")) + sum(rest_ms(profile, setup, "loss"))
    if not host:
        return 0.0
    last = setup.pipeline.stages - 1
    host += grad_hook_ms(layer, profile, setup) + hostcalls.collectives_ms(layer, "fwd", profile, setup) \
        + hostcalls.collectives_ms(layer, "bwd", profile, setup) \
        + hostcalls.pre_hooks_ms(hostcalls.HEAD_MODULES, param_tensors(layer, profile, setup), setup, profile) \
        + (hostcalls.get_batch_ms(last, profile, setup) if last else 0.0) + hostcalls.loss_collectives_ms(profile, setup)
    device = layer.fwd_ms + layer.bwd_ms + rules.stage_constant_ms(profile, last, setup) \
        + megatron_loss.vocab_parallel_ce_ms(profile, last, setup)
    return max(0.0, host - device)


def host_bound_ms(layer: LayerCost, ckpt, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch a dense block's passes take beyond their device time where the host issues them
    more slowly: max(device, host) less device for the forward, the backward, and a full recompute's
    rerun of the forward, the DDP hooks in the backward; the embedding's passes the same, the head's with the
    loss one span (rest_ms); 0 for other layers (as jobsettings' terms, an analytic profile's dense and MoE
    blocks: a fake profile's, kinds named by the model's class, are not read)."""
    if layer.kind == EMBEDDING:
        fwd, bwd = _embedding_host(layer, profile, setup)
        return max(0.0, fwd - layer.fwd_ms) + max(0.0, bwd - layer.bwd_ms)
    if layer.kind == HEAD:
        return _head_and_loss_ms(layer, profile, setup)
    if layer.kind not in (DENSE_BLOCK, MOE_BLOCK):
        return 0.0
    fwd, bwd, rerun = _block_host(layer, profile, setup)
    if not (fwd or bwd):
        return 0.0
    # the pass's tokens' dispatch and combine run on the device within it (rules.all_to_all_ms charges them apart):
    # the host issues ahead while they run, so they are device time the host's issue is measured against
    exchange = _exchange_pass_ms(layer, setup)
    extra = max(0.0, fwd - layer.fwd_ms - exchange) + max(0.0, bwd - layer.bwd_ms - exchange)
    if int(ckpt) == 1:  # full recompute: the forward issued again
        extra += max(0.0, rerun - rules.recompute_ms(layer, setup) - exchange)
    return extra


def _syncs(setup: TrainSetup, per: str) -> list[str]:
    """The runtime's timers real at the setup's --timing-log-level that synchronize once a `per` ("microbatch":
    each stage, each microbatch; "step")."""
    level = getattr(setup.training, "timing_log_level", 0)
    return [name for name, at, each in runtimes.of(setup.training).timer_syncs if each == per and at <= level]


def timer_sync_ms(stage: int, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch on a stage the timers' synchronizes add: each region timed per microbatch (level 2:
    forward-compute, backward-compute) starts with the device idle, so the device waits while the host issues the
    region's first call (one torch call on the GPU's host, GPU.host_call_us); the rest of the region is
    max(device, host) as host_bound_ms charges it. 0 at level 0 or where the GPU's host has no figure."""
    return len(_syncs(setup, "microbatch")) * _call_ms(profile)
