"""torchtitan's op-level SAC on a MoE block under expert parallelism: whether the token
dispatcher's two exchanges (the dispatch before the experts, the combine after them) are saved or
rerun (the term op_sac_ep_kept, planner/cost/terms.py; rules.all_to_all_ms times a rerun).

torchtitan b5bcd76c's policy saves the outputs of `_c10d_functional.all_to_all_single` (and of
DeepEP's / HybridEP's dispatch and combine: torchtitan/distributed/activation_checkpoint.py 60-70),
every other op reruns. Which op an exchange is (torchtitan/models/common/token_dispatcher.py 316-370,
docs/framework-facts.md §74): the functional `all_to_all_single` where the model is compiled or the
SPMD backend is not spmd_types; otherwise `spmd_types.all_to_all` (0.2.3 `_collectives.py`
`_AllToAllUneven`: `torch.distributed.all_to_all` into empty chunks, then `torch.cat`), none of
whose ops is a save op, so the backward's rerun forward communicates both again. spmd_types is the
default backend since 5ab3a0fd1 (2026-08-18): of the versions ckplan reads, b5bcd76c with an eager
model reruns them; the earlier ones (2c8b5947, bbb1b616, 9dec370) exchange through the functional
collectives and save them. (parallelism.spmd_backend = "partial_dtensor" is listed, not modelled.)

Saved, each holds every routed token copy's hidden state on the receiving rank, the layer's a2a_bytes
(analytic.dispatch_bytes); the per-layer profile knows no expert parallelism (planner/profiler/opsac.py
keeps none of them: without it the dispatcher is a local gather, rerun), so they are added here,
2 x a2a_bytes for a MoE block whose option is op-sac, where ep > 1 (their rerun peak is left as the
profile's, which counts them as remade: a few hundred MiB too high per block, in its backward)."""

from __future__ import annotations

from planner.cost.layers import LayerCost
from planner.schema import TrainSetup

OPTION_OP_SAC = "op-sac"  # planner/profiler/opsac.py's name
SPMD_TYPES_DEFAULT = ("b5bcd76c",)  # torchtitan versions read here whose default backend is spmd_types


def op_sac_ep_option(layer: LayerCost, option: int, setup: TrainSetup) -> bool:
    """Whether `option` is op-sac on a MoE block that exchanges tokens over ep > 1 ranks."""
    return option >= 2 and setup.data_parallel.ep > 1 and bool(layer.a2a_bytes) \
        and layer.options[option].name == OPTION_OP_SAC


def exchanges_saved(setup: TrainSetup) -> bool:
    """Whether op-level SAC saves the exchanges (the module docstring), else reruns them."""
    version = setup.training.runtime_version or "b5bcd76c"
    return setup.training.compile or version not in SPMD_TYPES_DEFAULT


def op_sac_ep_kept_bytes(layer: LayerCost, option: int, setup: TrainSetup) -> int:
    """The two all-to-all outputs a MoE block keeps under op-level SAC with expert parallelism."""
    return 2 * layer.a2a_bytes if op_sac_ep_option(layer, option, setup) and exchanges_saved(setup) else 0


def op_sac_reruns_exchanges(layer: LayerCost, option: int, setup: TrainSetup) -> bool:
    """Whether the backward's rerun forward communicates the dispatch and combine again."""
    return op_sac_ep_option(layer, option, setup) and not exchanges_saved(setup)
