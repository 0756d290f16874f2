"""A layer's fresh weight gradients, charged as the runtime holds them (issue 33).

The profile's transient counts what the layer's backward makes beyond what it keeps; of that, a fake (or
measured) profile records the weight gradients autograd makes as tensors of their own and holds until
AccumulateGrad adds them in place (LayerProfile.weight_grad_transient_bytes; torch 2.13 accumulate_grad.h,
§690). A runtime whose linears accumulate their weight gradients inside the GEMM (the record's
`wgrad_in_gemm`: Megatron-core's gradient_accumulation_fusion, TE's fuse_wgrad_accumulation, §692, §699)
never holds them: the transient is charged without them. An embedding's lookup is no GEMM: its table's
gradient is made fresh under every runtime (§700), so a layer that holds a lookup table keeps its whole
transient here. The analytic profile records 0 (its transient is the fused one already); a measured one
None (kept as measured)."""

from __future__ import annotations

from planner.cost import dataparallel
from planner.cost.layers import LayerCost
from planner.cost.runtimes import of as runtime_of
from planner.schema.setup import TrainSetup


def fused_back(layer: LayerCost, setup: TrainSetup) -> int:
    """What a runtime that accumulates weight gradients inside the GEMM takes off the layer's transient: the
    fresh weight gradients the profile counts in it; 0 where the runtime makes them (eager autograd, or
    Megatron-LM under --no-gradient-accumulation-fusion) or the layer holds a lookup table."""
    if not runtime_of(setup.training).wgrad_in_gemm or setup.training.unfused_grad_accumulation:
        return 0
    if layer.lookup_param_count:
        return 0
    return layer.weight_grad_transient_bytes


def fresh_made_here(layer: LayerCost, setup: TrainSetup) -> int:
    """Of the layer's transient, what FSDP2's replay makes itself as the unit's unsharded gradients
    (fsdp2_events.grads): where the gradients are reduced and freed every microbatch (not kept whole), `.grad`
    is None at each backward and AccumulateGrad takes the fresh gradient as it is (§690, §692's FSDP2 row), so it
    is that gradient, charged once there. Kept whole through the microbatches, a later microbatch's fresh
    gradient is held beside the accumulated one until the add: kept in the transient."""
    return 0 if dataparallel.kept_whole(setup) else layer.weight_grad_transient_bytes
