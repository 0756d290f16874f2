"""The local add of a tied parameter's two gradients, where one stage holds both holders (docs/framework-facts.md
§249, §349-§352; the all-reduce between two stages' ranks is rules.tied_sum_ms).

On one stage the holders share one nn.Parameter: the head's weight gradient and the embedding's meet at its one
AccumulateGrad, and autograd's InputBuffer adds them (read 2, write 1 of the table), every microbatch, under every
runtime. The profile's `sum_ms` (TiedSet) is that add: measured (measure.tied_sets) or its roofline
(analytic_tied.tied_sum_ms). Where the cost model charges the later holder's .grad accumulation, as the profile's backward
times it, that charge is this add's: the same bytes, one accumulation fewer than two untied tables run (§249). Where
it takes that accumulation off because the runtime never runs it, the add is charged here:

- FSDP2 sharding (fsdp2work.unrun_accumulate_bytes: the unsharded .grad is None at every backward, §351);
- DeepSpeed's ZeRO 3 (deepspeed_grads.hooks_ms: its hooks set .grad to None after each reduce-scatter, §352, §370);
- an optimizer's own fp32 gradients (the record's hp_grad_accumulate_bytes: .grad cleared before each backward);
- Megatron-LM's gradient-accumulation fusion, where the later holder's profile accumulation is taken off
  (fusedkernels: its wgrad GEMM accumulates into main_grad in its epilogue, §350). There the GEMM's layer also
  returns a dummy gradient for autograd, which Megatron zero-fills (zero_out_wgrad, set on one stage so the add does
  not sum garbage): one write of the table, at the add's rate (a third of its bytes), charged too.

Nothing where the stages are more than one (each holder's stage runs its own AccumulateGrad; §247-§249).

The add's first operand is memory too (buffered_grad_bytes): the later holder's gradient waits in that InputBuffer
from its backward to the first holder's (§336, §381), which the profile, timing each layer alone, never sees.
"""

from __future__ import annotations

from planner.cost import deepspeed_grads, fsdp2work, runtimes
from planner.cost.dataparallel import BYTES_PER_PARAM
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup

# InputBuffer's add reads both gradients and writes the sum; the zero fill writes one tensor of the same size
ADD_TENSORS = 3
FILL_TENSORS = 1


def tied_local_add_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per iteration of the adds (and Megatron's zero fills) the layer's shared parameters cost beyond what the
    cost model charges (the module's docstring): the microbatches x the profile's sum_ms of each tied set the layer
    is a later holder of; 0 on more than one stage or where the layer shares nothing with an earlier layer."""
    if setup.pipeline.stages > 1 or not layer.shared_before:
        return 0.0
    add_ms = sum(item.sum_ms for item in profile.tied if layer.name in item.layers[1:])
    fused = _fused_accumulation(layer, profile, setup)
    unrun = fused or _accumulation_unrun(layer, profile, setup)
    per_microbatch = (add_ms if unrun else 0.0) + (add_ms * FILL_TENSORS / ADD_TENSORS if fused else 0.0)
    return setup.pipeline.microbatches * per_microbatch


def _accumulation_unrun(layer: LayerCost, profile: Profile, setup: TrainSetup) -> bool:
    """Whether the cost model takes the profile's .grad accumulation of the layer's shared parameters off: FSDP2
    shards them, DeepSpeed's ZeRO 3 hooks take every gradient (deepspeed_grads), or the runtime clears .grad before each backward to keep its own fp32 gradients (hpgrads)."""
    if fsdp2work.unrun_accumulate_bytes(layer.shared_before, setup) > 0:
        return True
    if deepspeed_grads.takes_accumulation_off(profile, setup):  # ZeRO 3's hooks: .grad None at every backward (§370)
        return True
    return bool(runtimes.of(setup.training).hp_grad_accumulate_bytes) and setup.training.precision == "bf16-mixed"


def _fused_accumulation(layer: LayerCost, profile: Profile, setup: TrainSetup) -> bool:
    """Whether the layer's weight gradient is accumulated by its GEMM (the record's Transformer Engine layers under
    Megatron's gradient-accumulation fusion, not turned off) where its profile timed an eager accumulation, which
    fusedkernels.fused_profile then takes off: the layer's wgrad_accumulate_ms in the profile as made, or, once
    fused_profile has set it to 0 (the profile solve and evaluate hand the cost model, float8.float8_profile), an
    analytic profile timed by its roofline (analytic_time.accumulate_ms times every layer's; none under --mfu)."""
    if runtimes.of(setup.training).fused_kernels != "transformer-engine" or setup.training.unfused_grad_accumulation:
        return False
    roofline = profile.source == "analytic" and profile.assumptions.get("mfu") is None
    return any(timed.wgrad_accumulate_ms > 0 or roofline for timed in profile.layers if timed.name == layer.name)


def buffered_grad_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """What autograd's InputBuffer holds of the tied sets on one stage: each set's later holders' gradient of the
    shared table, made in the weights' dtype (BYTES_PER_PARAM's first), added up there and waiting from the last
    holder's backward to the first holder's, where AccumulateGrad takes the sum (torch 2.13.0 input_buffer.cpp,
    engine.cpp; §336, §381: 8,192 B on the tied GPT fixture, every ZeRO stage). Charged with the bytes held all
    iteration (the quantities have none held over a span of the backward alone): exact at the backward's moments
    between the two holders, where the fixtures peak, over by these bytes at the forward's and the step's. Known from
    the stage's position only on one stage (tied_once_bytes): with more, 0 (the embedding and the head are always
    split, each stage its own AccumulateGrad; a set sharing an inner stage goes uncharged)."""
    if setup.pipeline.stages != 1:
        return 0.0
    weights = BYTES_PER_PARAM[(setup.training.precision, setup.training.optimizer)][0]
    return float(sum(item.param_count for item in profile.tied) * weights)
