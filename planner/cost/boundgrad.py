"""The gradient of a pipeline stage's output, charged once (issue 33; docs/published-runs.md §43.boundgrad, §44.boundgrad2).

Every pipeline runtime ckplan models runs a stage's backward on the gradient it received for the stage's output
(torch's pipelining hands `backward_one_chunk` its receive buffer, Megatron-LM's `backward_step` the tensor
`recv_backward` made, DeepSpeed's `_exec_backward_pass` its one `grad_layer`: docs/framework-facts.md §605, §606).
ckplan charges that tensor as the stage's receive buffer (rules.last_layer_buffer_bytes) and every profile kind makes
the stage's last layer's backward transient with the same gradient in it (LayerProfile.incoming_grad_bytes: the
transient less the transient without it). On a stage before the last the closing layer's extra is therefore charged
less that part: here, the one place evaluate (assembly.stage_sums), the DP (planner/solve/dpsegments.py) and the MILP
(planner/solve/milp_rows.py) read it from. Inside a stage and on the last stage the gradient is the next layer's input
gradient or the loss's, charged nowhere else, and stays.

Not taken where FSDP2's units are charged per moment beside a pipeline (fsdpunits.charged_per_moment): their moments
(gathered.stage_unit_moments, the DP's dpmoments, the MILP's milp_moments) place the layer's scratch at some moments
and not at others, and are charged as before (§44.boundgrad2 says so)."""

from __future__ import annotations

from planner.cost import compiled_block, fsdpunits, hpgrads
from planner.cost.layers import LayerCost
from planner.cost.rules import layer_extra_bytes, runtime_facts
from planner.schema import Profile, TrainSetup


def applies(setup: TrainSetup) -> bool:
    """Whether a stage before the last takes its closing layer's incoming gradient off (module docstring)."""
    return setup.pipeline.stages > 1 and not fsdpunits.charged_per_moment(setup, runtime_facts(setup).fsdp_units)


def closing_grad_bytes(layer: LayerCost, option: int, *, stage: int, profile: Profile, setup: TrainSetup) -> float:
    """What stage `stage`'s last layer's extra under `option` (every "extra" row's sum, before Megatron-FSDP's moments)
    is over by, the stage's receive buffer charging the same gradient: the layer's incoming gradient (the compiled
    record's where it plays: compiled_block.incoming_bytes), less where the optimizer's fp32 cast after the backward
    (hpgrads.cast_arm_bytes), which holds no received gradient, is the larger arm. 0 on the pipeline's last stage and
    where it does not apply. `setup` counts the pipeline's stages (placement.stages_view: a chunked schedule's
    virtual stages)."""
    if stage >= setup.pipeline.stages - 1 or not applies(setup):
        return 0.0
    compiled = compiled_block.incoming_bytes(layer, option, profile, setup)
    incoming = layer.incoming_grad_bytes if compiled is None else compiled
    if not incoming:
        return 0.0
    cast = hpgrads.cast_arm_bytes(layer, option, setup)
    if cast is None:
        return float(incoming)
    own = layer_extra_bytes(layer, option)  # the arm the gradient is in (the compiled record replaces it: its peak)
    if compiled is not None:
        own += compiled_block.extra_bytes(layer, option, profile, setup)
    return float(min(max(own - cast, 0.0), incoming))
