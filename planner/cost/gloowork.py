"""What a unit's FSDP2 moments hold where the collectives are gloo's, beyond what fsdpunits charges from FSDP2's code:
ckplan's runtime on the CPU (planner/runtime/launcher.py: gloo on the CPU, NCCL on CUDA; its record's
cpu_collectives), so charged where the profile's device is the CPU under that record, nothing on a GPU, whose
charges stay fsdpunits'; beside a pipeline (gathered._gloo_bytes: a stage's moments and the solvers' bound), where
they were measured; one stage's moments stay as they were (issue 33; docs/framework-facts.md §735, §839-§841).

- A unit's post-backward reduce-scatter (fsdpunits.layer_moment_bytes' `after`): FSDP2 copies the unit's gradients
  into the reduce-scatter input, drops them, allocates the output, 1/K of the input (torch 2.13.0
  fsdp/_fully_shard/_fsdp_collectives.py 597-613), and calls `dist.reduce_scatter_single` (DefaultReduceScatter,
  175-189), which on gloo clones the input and keeps the clone in its work until the wait (ProcessGroupGloo.cpp
  `reduce_scatter_tensor_coalesced`, §735). The clone takes the dropped gradients' place (the same bytes: the reduce
  dtype is the weights' on the CPU, fp32), beside the input fsdpunits charges; the output is new beside them, and so
  is the unit's last trained parameter's unsharded gradient, which foreach_reduce's loop variable `unsharded_grad`
  keeps referenced after its loop over the gradients (579-590) until the function returns, past the wait (§839).
  Under NCCL (no clone) the gradients fsdpunits charges are more than the output and that last gradient together.
- A unit's all-gather output outlives FSDP2's reference to it (§840): gloo's worker thread keeps the work, and so its
  output, in `workInProgress_` until it takes the work lock again after running it (ProcessGroupGloo.cpp `runLoop`),
  and frees the tensor's Python storage only under the GIL, which the rank's own thread gives up at its next blocking
  call or switch interval; so where no collective is called between the all-gather's wait and a layer's backward, the
  output may live through that backward and its post-backward's reduce-scatter (measured: a stage of one unit at
  ZeRO 3, in 32 of 76 runs, 2 of them to the reduce-scatter). Charged, as the larger moment of some runs, where the
  copy-out meets the backward with no collective between: ZeRO 3's pre-backward all-gather of a stage's only unit
  (nothing prefetches it, it prefetches nothing), ZeRO 2's forward all-gather of the model's last layer (its forward,
  the loss and its backward follow); a unit prefetched or prefetching calls a collective between.
"""

from __future__ import annotations

from planner.cost import dataparallel
from planner.cost.rules import runtime_facts
from planner.schema import Profile, TrainSetup


def runs_gloo(profile: Profile, setup: TrainSetup) -> bool:
    """Whether the collectives are gloo's: the profile's device is the CPU and the runtime's record runs gloo there
    (RuntimeFacts.cpu_collectives: ckplan's; a GPU framework's record scored on a CPU profile keeps its own)."""
    return profile.device.type == "cpu" and runtime_facts(setup).cpu_collectives == "gloo"


def reduce_scatter_beside_bytes(unit_params: float, last_param_count: float, setup: TrainSetup) -> float:
    """Beside gloo's clone at the post-backward of a unit of `unit_params` parameters whose last trained tensor has
    `last_param_count`: the reduce-scatter output, 1/K of its gradients in the reduce dtype (none where HSDP's kept
    output, dataparallel.reduced_bytes_per_param, is it), and that tensor's unsharded gradient, in the weights' dtype."""
    held = dataparallel.param_bytes(setup)
    output = 0.0 if dataparallel.reduced_bytes_per_param(setup) else unit_params * held.grads / dataparallel.shard_size(setup)
    return output + last_param_count * held.weights


def backward_all_gather_bytes(gathered: float, setup: TrainSetup, *, model_last: bool, one_unit: bool) -> float:
    """The unit's all-gather output (`gathered` bytes) gloo may still hold through the layer's backward and
    post-backward: ZeRO 3's pre-backward all-gather where the unit is alone among the layers charged (`one_unit`:
    a stage of one unit); ZeRO 2's forward all-gather of the model's last layer (`model_last`); 0 elsewhere."""
    zero3 = setup.data_parallel.zero >= 3
    return gathered if (zero3 and one_unit) or (not zero3 and model_last) else 0.0


def earlier_reduce_scatter_bytes(unit_params: float, setup: TrainSetup, *, one_unit: bool) -> float:
    """The previous microbatch's reduce-scatter input of a stage's only unit (`one_unit`), its gradients in the reduce
    dtype, which gloo's work may still hold (its clone, not yet let go by gloo's worker thread) through the next
    microbatch's backward, a collective called between or not (measured: the tied GPT's head alone at ZeRO 2 peaks
    8,448 B higher in its second backward so, docs/framework-facts.md §860); 0 with one microbatch."""
    if not one_unit or setup.pipeline.microbatches < 2:
        return 0.0
    return unit_params * dataparallel.param_bytes(setup).grads
