"""What a Megatron-LM flags file says of a MoE router's auxiliary losses (docs/framework-facts.md §481).

megatron-core 92c8482e (Megatron-Bridge 25.11's pin), `TopKRouter.routing` (router.py 493-541): in training, where
an auxiliary loss has a coefficient above 0, the router computes the scores and routing map for it from the logits
(`compute_routing_scores_for_aux_loss`, TE's fused kernel under `--moe-router-fusion`), and `_apply_aux_loss`
(router.py 270-296) sums the routing map over the tokens (`routing_map.sum(dim=0)`), all-reduces the counts over the
TP x CP group (none where it is one rank), computes the Switch loss (`switch_load_balancing_loss_func`: TE's fused
kernel under the fusion) and attaches it to the probabilities (`MoEAuxLossAutoScaler`: no copy). The type is
`--moe-router-load-balancing-type` (Megatron-LM's default `aux_loss`), the coefficient `--moe-aux-loss-coeff`
(default 0: no aux loss runs). `Arch.router_aux_loss` says the `aux_loss` type runs; planner/profiler/te_moe.py
times it. `seq_aux_loss` and `global_aux_loss` (other reshapes, a global count's all-reduce over the data-parallel
group) and `--moe-z-loss-coeff` (the z-loss's logsumexp over the logits) are listed as not modelled where they run.
"""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags

LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


def router_facts(flags: Flags, *, moe: bool) -> dict:
    """The Arch's `router_aux_loss` from the load-balancing flags (the module docstring); {} for a dense model."""
    kinds = flags.take_list("--moe-router-load-balancing-type", "the router's load-balancing loss") or ["aux_loss"]
    coeffs = flags.take_list("--moe-aux-loss-coeff", "the auxiliary loss's coefficient") or ["0"]
    z_loss = flags.take("--moe-z-loss-coeff", "the router's z-loss coefficient", float, None)
    unknown = [kind for kind in kinds if kind not in LOSS_TYPES]
    if unknown:
        raise UserError(f"--moe-router-load-balancing-type {unknown[0]!r} is not one of Megatron-LM's "
                        f"({', '.join(LOSS_TYPES)}); give one")
    if not moe:
        for flag in ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff"):
            _status(flags, flag, "no effect", "a router's loss: a dense model has no router")
        return {}
    if len(coeffs) == 1:
        coeffs = coeffs * len(kinds)
    runs = {kind for kind, coeff in zip(kinds, coeffs) if kind in LOSS_TYPES[:3] and _positive(coeff)}
    if runs - {"aux_loss"}:
        _status(flags, "--moe-router-load-balancing-type", "not modelled",
                f"{', '.join(sorted(runs - {'aux_loss'}))}: its passes over the tokens x experts (global_aux_loss's "
                "all-reduce of the counts) are not modelled; aux_loss's are (te_moe.py)")
    if z_loss:
        _status(flags, "--moe-z-loss-coeff", "not modelled", "the router's z-loss (a logsumexp over the tokens x "
                "experts logits and its gradient) is not modelled")
    return {"router_aux_loss": "aux_loss" in runs}


def _status(flags: Flags, flag: str, status: str, why: str) -> None:
    for i, entry in enumerate(flags.sink):
        if entry[0] == flag:
            flags.sink[i] = (*entry[:2], status, why)


def _positive(value: str) -> bool:
    try:
        return float(value) > 0
    except ValueError:
        return False
