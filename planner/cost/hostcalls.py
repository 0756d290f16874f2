"""The host calls a Megatron-LM step makes beside its layers' own ops (planner/cost/hosttime.py charges them inside
the passes that make them): the tensor-parallel collectives' issue, --overlap-param-gather's forward pre-hooks, and
get_batch's copies and TP broadcasts. Each a figure of the runtime record's host_rest_linears, in torch Linear
forwards (scripts/bench_host_comm.py, docs/framework-facts.md §106), carried to the GPU's host at its published Linear
(GPU.host_call_us, TransformerEngine#2053), Megatron-LM d98e8a64:

- a collective's issue (the record's "all-reduce", "all-gather", "reduce-scatter", "broadcast": per call): torch.
  distributed's Python wrapper, the c10d dispatcher op and the backend's call, timed on torch's fake backend, so
  what every backend pays before its own enqueue; NCCL's own (ProcessGroupNCCL's CUDA events, stream wait and the
  kernel's launch) is not in it (no CPU counterpart here, and no published figure found): a lower bound. Counted
  from the profile's collectives of each pass (LayerCollective: TE's linears' and Megatron's mappings' calls), and
  the loss's all-reduces (loss_collectives_ms);
- the forward pre-hook on every module under --overlap-param-gather (distributed_data_parallel.py 485-536): per
  module called in a forward (and in a full recompute's rerun) and per parameter it holds (the hook's loop); after a
  step's first microbatch the gathers are waited for and nothing else runs (param_and_grad_buffer.py 538-560). The
  modules a forward calls: a TE-spec dense block 13 (TransformerLayer, input_layernorm, self_attention,
  linear_qkv, core_attention and TE's backend module, linear_proj, pre_cross_attn_layernorm, cross_attention,
  pre_mlp_layernorm, mlp, linear_fc1, linear_fc2), +2 with TE's unfused attention (its scale_mask_softmax and
  attention_dropout modules); the embedding's stage 7 (Float16Module, GPTModel, the embedding, its word and
  position (or rotary) modules, the dropout, the TransformerBlock); the head 2 (final_layernorm, output_layer);
- get_batch (pretrain_gpt.py 110-150; megatron/core/utils.py get_batch_on_this_tp_rank 2167-2320), TP rank 0's
  path, per microbatch on the first and the last stage: the keys' .cuda(non_blocking=True) (the record's
  "get_batch", per key) and one broadcast a key over the TP group: tokens, labels, loss_mask, position_ids and
  attention_mask (create_attention_mask_in_dataloader, on by default) on a single stage; tokens, position_ids and
  attention_mask on the first of several, labels, loss_mask and attention_mask on the last. The data loader's own
  next() is not in it (on this machine a cross-process round trip, not a dispatch: §106).
Not in it: the logging (training_log with --log-interval 1 and tensorboard's add_scalar: its flags are read as
having no effect), the timers' barrier, MoE blocks' all-to-alls and MLA's modules.
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.schema import Profile, TrainSetup

PASSES = ("fwd", "bwd", "recompute")
BLOCK_MODULES = {"flash": 13, "eager": 15}  # a TE-spec dense block's modules called in a forward (module docstring)
EMBEDDING_MODULES, HEAD_MODULES = 7, 2
SINGLE_STAGE_KEYS, END_STAGE_KEYS = 5, 3  # get_batch's broadcast keys: one stage; the first or the last of several


def _rest(setup: TrainSetup) -> dict[str, tuple[float, float]]:
    return {name: (a, b) for name, a, b in runtimes.of(setup.training).host_rest_linears}


def call_ms(profile: Profile) -> float:
    """ms of one torch Linear forward on the profile's GPU's host (GPU.host_call_us); 0 where none is published or carried."""
    named = profile.assumptions.get("gpu")
    if not isinstance(named, str):
        return 0.0
    from planner.models import archs

    return archs.gpu(named).host_call_us / 1e3


def collectives_ms(layer, which: str, profile: Profile, setup: TrainSetup) -> float:
    """ms the host takes to issue the layer's tensor-parallel collectives in one pass ("fwd", "bwd", "recompute")."""
    rest = _rest(setup)
    at = 2 + PASSES.index(which)
    linears = sum(c[at] * rest.get(c[0], (0.0, 0.0))[0] for c in layer.collectives)
    return linears * call_ms(profile) if linears else 0.0


def pre_hooks_ms(modules: int, params: int, setup: TrainSetup, profile: Profile) -> float:
    """ms --overlap-param-gather's forward pre-hooks add to one forward over `modules` modules holding `params`
    parameters; 0 without the flag or where the record has no figure."""
    if not setup.data_parallel.overlap_param_gather:
        return 0.0
    per_module, per_param = _rest(setup).get("pre_hook", (0.0, 0.0))
    linears = modules * per_module + params * per_param
    return linears * call_ms(profile) if linears else 0.0


def block_modules(profile: Profile) -> int:
    """The modules a dense block's forward calls, by the profile's attention kind (13 where not named)."""
    return BLOCK_MODULES.get(profile.assumptions.get("attention"), BLOCK_MODULES["flash"])


def get_batch_ms(stage: int, profile: Profile, setup: TrainSetup) -> float:
    """ms get_batch takes on TP rank 0 per microbatch on this stage: its keys' copies and broadcasts (0 on a middle
    stage, where get_batch returns at once)."""
    stages = setup.pipeline.stages
    if 0 < stage < stages - 1:
        return 0.0
    keys = SINGLE_STAGE_KEYS if stages == 1 else END_STAGE_KEYS
    rest = _rest(setup)
    linears = keys * (rest.get("get_batch", (0.0, 0.0))[0] + rest.get("broadcast", (0.0, 0.0))[0])
    return linears * call_ms(profile) if linears else 0.0


def loss_collectives_ms(profile: Profile, setup: TrainSetup) -> float:
    """ms the host takes to issue the loss's all-reduces over the TP group, per microbatch on the last stage:
    Megatron's vocab-parallel cross-entropy three (tensor_parallel/cross_entropy.py 130, 146, 150: the max, the
    predicted logits, the sum of exps), --cross-entropy-loss-fusion's two (fusions/fused_cross_entropy.py 94, 112);
    none at TP 1, and TE's own cross-entropy's not counted."""
    training = setup.training
    if setup.comm.tp < 2 or getattr(training, "te_cross_entropy", False):
        return 0.0
    calls = 2 if getattr(training, "fused_cross_entropy", False) else 3
    linears = calls * _rest(setup).get("all-reduce", (0.0, 0.0))[0]
    return linears * call_ms(profile) if linears else 0.0
