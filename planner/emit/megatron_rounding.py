"""What Megatron-LM's export rounds beyond the schedule and the recompute: the settings its written
flags run whether or not the plan was scored with them.

- A model with experts is written with --moe-grouped-gemm (megatron.moe_arguments: one grouped GEMM
  over a rank's experts, as the profiles charge the experts' backward). On Transformer Engine's layers
  that runs TE's grouped GEMM, which allocates the record's `te_grouped_gemm_workspaces` beside the
  plain workspace (framework-facts §89): a plan scored without them (no --te-grouped-gemm) is
  re-scored with them, and the export says so. Under Megatron-core's local spec (--local-layers) the
  experts' grouped GEMM is not TE's: nothing changes.
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.emit import facts, rounding
from planner.schema import Profile


def grouped_gemm(rounded: rounding.Rounded, profile: Profile) -> None:
    """Score `rounded` with TE's grouped GEMM where the export writes --moe-grouped-gemm on TE's layers
    and the plan was scored without it (the module's docstring); said in `rounded.changes`."""
    model = facts.read(profile).model
    training = rounded.setup.training
    if model is None or not model.num_experts or training.te_grouped_gemm or training.local_layers:
        return
    workspaces = runtimes.of(training).te_grouped_gemm_workspaces
    if not workspaces:
        return
    rounded.setup = rounded.setup.model_copy(
        update={"training": training.model_copy(update={"te_grouped_gemm": True})})
    rounded.changes.append(f"--moe-grouped-gemm runs Transformer Engine's grouped GEMM over the experts, which "
                           f"allocates {workspaces} more cuBLAS workspaces a rank than the plan was scored with: "
                           "scored with them (as --te-grouped-gemm)")
