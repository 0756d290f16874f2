"""What torchtitan's op-level SAC saves beyond the profile's `op-sac` option under expert
parallelism (the term op_sac_ep_kept, planner/cost/terms.py).

torchtitan b5bcd76c's policy saves the outputs of `_c10d_functional.all_to_all_single` (and of
DeepEP's / HybridEP's dispatch and combine: torchtitan/distributed/activation_checkpoint.py 60-70),
and under expert parallelism a MoE block's token dispatcher runs two of them per microbatch, the
dispatch before the experts and the combine after them (torchtitan/models/common/token_dispatcher.py
316-370, docs/framework-facts.md §74): each holds every routed token copy's hidden state on the
receiving rank, the layer's a2a_bytes (analytic.dispatch_bytes: tokens x top-k x hidden x 2 B at a
capacity factor of 1). The per-layer profile knows no expert parallelism (planner/profiler/opsac.py
keeps none of them: without it the dispatcher is a local gather, rerun), so they are added here:
2 x a2a_bytes for a MoE block whose option is op-sac, where ep > 1. Their rerun peak is left as the
profile's (the rerun does not remake them: a few hundred MiB too high per block, at its backward)."""

from __future__ import annotations

from planner.cost.layers import LayerCost
from planner.schema import TrainSetup

OPTION_OP_SAC = "op-sac"  # planner/profiler/opsac.py's name


def op_sac_ep_kept_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> int:
    """The two all-to-all outputs a MoE block keeps under op-level SAC with expert parallelism."""
    if option < 2 or setup.data_parallel.ep == 1 or not layer.a2a_bytes:
        return 0
    return 2 * layer.a2a_bytes if layer.options[option].name == OPTION_OP_SAC else 0
