"""What DeepSpeed's ZeRO 3 does around its step and each gradient's reduce-scatter beyond the collectives'
bytes, charged per layer once an iteration (docs/framework-facts.md §176; the record's facts in
planner/cost/runtime_deepspeed.py, read at DeepSpeed v0.6.2):

- the pre-divide: every reduction divides each whole gradient in place by the ranks before its reduce-scatter
  (the record's reduce_scatter_prepass_bytes a parameter), an eager elementwise kernel on the reduce stream. It runs
  beside the backward's compute and is charged as on the critical path at the profile's eager elementwise rate, as
  FSDP2's copy-ins on their own stream are (fsdp2work.fsdp2_copies_ms): it takes the SMs and HBM the compute runs on;
- the persistent parameters gathered again after the optimizer step (the record's regathers_persistent): one
  all-gather a parameter, each NCCL's ring latency (LL, the tuner's least for a few KB: links.ring_latency_us, the
  house's v2.21.5 model; the Azure runs' v2.12.10 gives 0.89x of it at 1,024 ranks, §176) plus its bytes over the
  shard group's link, one after the other, then a `torch.cuda.synchronize()`: nothing runs beside them. A block's
  persistent parameters are those of its submodules (deepspeed_terms.profile_block) under the threshold; the head's
  its final norm's, weight and bias on a GPT-style model, the weight on a LLaMA-style one; the embedding's tables
  are over it.
"""

from __future__ import annotations

from planner.cost import (
    dataparallel,
    deepspeed_grads,
    deepspeed_terms,
    deepspeed_waits,
    deepspeed_zero3,
    links,
    runtimes,
    stepcomm,
)
from planner.cost.comm import MS_PER_US
from planner.cost.hosttime import HEAD
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup


def prepass_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """The pre-divide over the layer's gradients, every reduction, at the profile's eager elementwise rate
    (membound_tbps' "elementwise" class, else its eager mean, else the HBM's); 0 where the record reads none, ZeRO 3's
    coordinator does not run, or the profile names no GPU rate (a measured profile)."""
    per_param = runtimes.of(setup.training).reduce_scatter_prepass_bytes
    if not per_param or not deepspeed_terms.runs_zero3(setup):
        return 0.0
    known = profile.assumptions
    rates = known.get("membound_tbps") or {}
    tbps = (rates.get("by_class") or {}).get("elementwise") or rates.get("eager") or known.get("gpu_hbm_tbps")
    if not tbps:
        return 0.0
    moved = per_param * own_param_count(layer, profile) * dataparallel.reductions_per_iteration(setup)
    return moved / (tbps * 1e12) * 1e3


def own_param_count(layer: LayerCost, profile: Profile) -> int:
    """The layer's parameters less those it shares with an earlier layer (a tied head's weight: autograd accumulates
    both uses into the one tensor's .grad, which ZeRO 3 reduces once, on the first holder)."""
    return layer.param_count - sum(item.param_count for item in profile.tied
                                   if layer.name in item.layers and item.layers[0] != layer.name)


def persistent_numels(layer: LayerCost, profile: Profile, setup: TrainSetup) -> list[int]:
    """The layer's parameters ZeRO 3 keeps whole (ds_numel < stage3_param_persistence_threshold: stage3.py 1048-1062
    at v0.6.2, `<`): a known block's submodules' (deepspeed_terms.profile_block), the head's final norm; [] for the
    embedding's tables and for blocks ckplan cannot split."""
    if layer.kind == HEAD:
        model = profile.assumptions.get("model") or {}
        hidden = model.get("hidden_size")
        norm = deepspeed_zero3.Submodule("final_layernorm", (hidden,) * (2 if model.get("style") == "gpt" else 1))
        return persistent_of([norm]) if isinstance(hidden, int) else []
    block = deepspeed_terms.profile_block(profile, layer)
    return [] if block is None else persistent_of(block)


def persistent_of(block) -> list[int]:
    """The element counts of these submodules' parameters ZeRO 3 keeps whole, in order: under
    stage3_param_persistence_threshold (DeepSpeed's default 1e5; the Azure recipes misspell its key, so the default)."""
    threshold = deepspeed_zero3.PARAM_PERSISTENCE_THRESHOLD_DEFAULT
    return [n for module in block for n in module.param_numels if n < threshold]


def persistent_gathers_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """The layer's persistent parameters all-gathered after the optimizer step, one collective each (the module
    docstring); 0 where the record does not regather them, ZeRO 3's coordinator does not run, or the setup has no
    shard link (a cpu profile)."""
    gb_per_s = setup.data_parallel.shard_gb_per_s
    if not (runtimes.of(setup.training).regathers_persistent and deepspeed_terms.runs_zero3(setup)) or not gb_per_s:
        return 0.0
    numels = persistent_numels(layer, profile, setup)
    if not numels:
        return 0.0
    k, tp = dataparallel.shard_size(setup), setup.comm.tp
    nodes = links.group_nodes(k, tp, setup.comm.domain)
    latency = links.ring_latency_us("all-gather", k, nodes, stepcomm.in_node_hardware(setup), "LL")
    weight = dataparallel.param_bytes(setup).weights
    return sum(latency * MS_PER_US + dataparallel.reduce_scatter_ms(n * weight, k, gb_per_s) for n in numels)


# the rows planner/cost/terms.py adds to its TERMS (name, quantity, where, value, source)
ROWS = (
    ("ZeRO 3's pre-divide of every gradient before its reduce-scatter", "step", "layer",
     lambda layer, ckpt, ctx: prepass_ms(layer, ctx.profile, ctx.setup),
     "the record's reduce_scatter_prepass_bytes (DeepSpeed v0.6.2 reduce_scatter_coalesced: div_ in place) at the "
     "profile's eager elementwise rate, every reduction (planner/cost/deepspeed_step.py, §176)"),
    ("ZeRO 3's persistent parameters gathered again after the step, one all-gather each", "step", "layer",
     lambda layer, ckpt, ctx: persistent_gathers_ms(layer, ctx.profile, ctx.setup),
     "the record's regathers_persistent (DeepSpeed v0.6.2 stage3.py _post_step, _allgather_params_coalesced): each "
     "at NCCL's LL ring latency over the shard group (links.ring_latency_us) and its bytes, then a synchronize "
     "(planner/cost/deepspeed_step.py, §176)"),
) + deepspeed_waits.ROWS + deepspeed_grads.ROWS
