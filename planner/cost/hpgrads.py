"""The optimizer's own fp32 gradients, added into after every microbatch's backward.

DeepSpeed's BF16_Optimizer as BLOOM 176B ran it (56c52238, framework-facts §61) keeps whole fp32
gradients beside the bf16 ones autograd writes. Its PipelineEngine calls update_hp_grads after each
microbatch's backward, which for every parameter casts the bf16 gradient to a new fp32 tensor (read 2 B,
write 4) and adds it into the fp32 gradient (read 4 + 4, write 4): the record's hp_grad_accumulate_bytes
a parameter a microbatch, eager elementwise kernels at the profile's measured elementwise rate (its
HBM bandwidth where it names none). The reduction after the last microbatch then reads these.

It also calls clear_lp_grads (every .grad set to None) before each backward, so autograd stores each new
bf16 gradient without a kernel: the profile's in-place accumulation (fsdp2work.PROFILE_ACCUMULATE x the
weights' 2 B, read both and write one, charged in its backward at the same elementwise rate) is not run,
and is taken off here, as fsdp2work does for FSDP2 (18 - 6 = 12 B a parameter a microbatch, net).

In memory (framework-facts §69) the fp32 gradients are held all iteration, whole on every rank
(dataparallel.bytes_per_param, the record's hp_grad_bytes); the cast is one parameter's fp32 tensor at a
time, alive right after a microbatch's backward, when that microbatch's activations are gone and the
others in flight remain (cast_extra_bytes, a layer's extra as the solvers and the evaluator read it).
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.cost.dataparallel import param_bytes
from planner.cost.fsdp2work import PROFILE_ACCUMULATE
from planner.cost.layers import LayerCost
from planner.cost.rules import kept_bytes, layer_extra_bytes
from planner.schema import Profile, TrainSetup


def elementwise_tbps(profile: Profile) -> float | None:
    """TB/s an eager elementwise kernel moves on the profile's GPU: its measured rate where the profile
    carries one (membound_tbps), else the HBM bandwidth; None where it names neither (a measured profile)."""
    rates = profile.assumptions.get("membound_tbps")
    if isinstance(rates, dict):
        rate = (rates.get("by_class") or {}).get("elementwise", rates.get("eager"))
        if isinstance(rate, (int, float)) and rate > 0:
            return float(rate)
    tbps = profile.assumptions.get("gpu_hbm_tbps")
    return float(tbps) if isinstance(tbps, (int, float)) and not isinstance(tbps, bool) and tbps > 0 else None


def hp_grad_accumulate_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the runtime's fp32 gradient accumulation adds after the layer's backward: every
    parameter of the layer (its norms, biases and embedding tables too: update_hp_grads walks them all)
    x the record's bytes, less the profile's .grad accumulation it does not run (the module's docstring),
    under bf16-mixed; 0 where the record moves none or no rate is known."""
    moved_per_param = runtimes.of(setup.training).hp_grad_accumulate_bytes
    tbps = elementwise_tbps(profile)
    if not moved_per_param or setup.training.precision != "bf16-mixed" or tbps is None:
        return 0.0
    unrun = PROFILE_ACCUMULATE * param_bytes(setup).weights
    return layer.param_count * (moved_per_param - unrun) / (tbps * 1e12) * 1e3



def cast_extra_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> float:
    """What update_hp_grads' fp32 cast of one of the layer's gradients adds to the layer's extra beyond its
    backward's own (rules.layer_extra_bytes), so the two make the larger of them: the record's
    hp_grad_cast_bytes x the layer's largest parameter tensor (its whole parameters where the profile names
    none: an analytic profile), less what the layer keeps under `option`, under bf16-mixed; 0 where the
    record casts none.

    The cast runs after the stage's whole backward, when every layer's kept bytes of that microbatch are
    freed; an extra is charged net of what the layers after it keep (assembly.net_extra_bytes), so this
    is exact for a stage's first layer and over by the kept bytes of the layers before it elsewhere."""
    arm = cast_arm_bytes(layer, option, setup)
    return 0.0 if arm is None else max(0.0, arm - layer_extra_bytes(layer, option))


def cast_arm_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> float | None:
    """The cast's own arm of the layer's extra (cast_extra_bytes: the cast less what the layer keeps); None where the
    record casts none."""
    per_param = runtimes.of(setup.training).hp_grad_cast_bytes
    if not per_param or setup.training.precision != "bf16-mixed":
        return None
    return per_param * (layer.largest_param_count or layer.param_count) - kept_bytes(layer, option)
