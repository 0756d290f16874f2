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
group) and `--moe-z-loss-coeff` (the z-loss's logsumexp over the logits) are listed as not modelled where they run;
so is `sinkhorn` (`sinkhorn_load_balancing`, router.py 215-247: fp32 Sinkhorn iterations over the logits in place of
the top-k routing, asserting a coefficient of 0). A coefficient is a float (arguments.py 3292), one a type where two
or more types are given (transformer_config.py 1013-1019; arguments.py 1084-1087 makes a one-item list a scalar):
anything else Megatron-LM refuses, and so does ckplan.

`--moe-router-dtype` (fp32 or fp64; default none: the input's dtype, bf16) sets the dtype the router's GEMM writes
its logits in (`TopKRouter.gating`, router.py 78-101; `RouterGatingLinearFunction`, moe_utils.py 958-980 at
92c8482e), and so TE's router probabilities, intermediates and gradients, and the probabilities the dispatcher
permutes and the experts' weighted activation reads (docs/framework-facts.md §545, §588): fp32 sets
`Arch.router_dtype_bytes` 4, charged in time (planner/profiler/te_moe.py) and memory (planner/cost/te_moe_kept.py);
fp64 beside `--moe-router-fusion` does not run (TE's `fused_topk_with_score_function` raises on float64 logits:
router.py 114-115 at v2.9, 174-175 at 4329ff84) and is refused; fp64 without the fusion (Megatron's eager top-k in
float64) is listed as not modelled.
"""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags, cast_value

LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
ROUTER_DTYPES = ("fp32", "fp64")  # megatron/training/arguments.py 3248-3250 at 92c8482e


def router_facts(flags: Flags, *, moe: bool) -> dict:
    """The Arch's `router_aux_loss` from the load-balancing flags and its `router_dtype_bytes` from
    `--moe-router-dtype` (the module docstring); {} for a dense model."""
    kinds = flags.take_list("--moe-router-load-balancing-type", "the router's load-balancing loss") or ["aux_loss"]
    coeffs = flags.take_list("--moe-aux-loss-coeff", "the auxiliary loss's coefficient") or ["0"]
    z_loss = flags.take("--moe-z-loss-coeff", "the router's z-loss coefficient", float, None)
    unknown = [kind for kind in kinds if kind not in LOSS_TYPES]
    if unknown:
        raise UserError(f"--moe-router-load-balancing-type {unknown[0]!r} is not one of Megatron-LM's "
                        f"({', '.join(LOSS_TYPES)}); give one")
    values = [cast_value("--moe-aux-loss-coeff", coeff, float) for coeff in coeffs]  # argparse's type=float
    if len(kinds) > 1 and len(values) != len(kinds) or len(kinds) == 1 and len(values) > 1:
        raise UserError(f"{len(kinds)} load-balancing type(s) (--moe-router-load-balancing-type, aux_loss if not "
                        f"given) and {len(values)} --moe-aux-loss-coeff value(s): Megatron-LM takes one coefficient "
                        "a type; give as many")
    dtype = _router_dtype(flags, moe=moe)
    if not moe:
        for flag in ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff"):
            _status(flags, flag, "no effect", "a router's loss: a dense model has no router")
        return {}
    runs = {kind for kind, coeff in zip(kinds, values) if kind in LOSS_TYPES[:3] and coeff > 0}
    if kinds == ["sinkhorn"]:  # a list of types never routes by Sinkhorn (router.py 500: routing_type == "sinkhorn")
        if any(values):
            raise UserError("--moe-router-load-balancing-type sinkhorn with an --moe-aux-loss-coeff does not run: "
                            "Megatron-LM's Sinkhorn routing asserts the coefficient is 0; drop one of them")
        _status(flags, "--moe-router-load-balancing-type", "not modelled",
                "sinkhorn: its fp32 Sinkhorn iterations over the tokens x experts logits, in place of the top-k "
                "routing charged, are not modelled")
    if runs - {"aux_loss"}:
        _status(flags, "--moe-router-load-balancing-type", "not modelled",
                f"{', '.join(sorted(runs - {'aux_loss'}))}: its passes over the tokens x experts (global_aux_loss's "
                "all-reduce of the counts) are not modelled; aux_loss's are (te_moe.py)")
    if z_loss:
        _status(flags, "--moe-z-loss-coeff", "not modelled", "the router's z-loss (a logsumexp over the tokens x "
                "experts logits and its gradient) is not modelled")
    return {"router_aux_loss": "aux_loss" in runs, **dtype}


def _router_dtype(flags: Flags, *, moe: bool) -> dict:
    """`--moe-router-dtype` read (the module docstring): the Arch's `router_dtype_bytes` where fp32 runs; refused where
    it is not Megatron-LM's or cannot run."""
    fusion = flags.has("--moe-router-fusion")
    dtype = flags.take("--moe-router-dtype", "the router's logits dtype")
    if dtype is None:
        return {}
    if dtype not in ROUTER_DTYPES:
        raise UserError(f"--moe-router-dtype {dtype!r} is not one of Megatron-LM's ({', '.join(ROUTER_DTYPES)}); "
                        "give one, or leave it out for the input's dtype")
    if not moe:
        _status(flags, "--moe-router-dtype", "no effect", "the router's dtype: a dense model has no router")
        return {}
    if dtype == "fp64" and fusion:
        raise UserError("--moe-router-dtype fp64 with --moe-router-fusion does not run: Transformer Engine's fused "
                        "top-k raises on float64 logits; drop one of them")
    if dtype == "fp64":
        _status(flags, "--moe-router-dtype", "not modelled", "the router's logits, probabilities and Megatron's "
                "eager top-k in fp64 (without --moe-router-fusion): charged as TE's fused router in the input's dtype")
        return {}
    _status(flags, "--moe-router-dtype", "modelled", "the router's logits, TE's router probabilities, intermediates "
            "and gradients and the permuted probabilities in fp32 (4 B a token and expert or routed copy), in time "
            "and memory")
    return {"router_dtype_bytes": 4}


def _status(flags: Flags, flag: str, status: str, why: str) -> None:
    for i, entry in enumerate(flags.sink):
        if entry[0] == flag:
            flags.sink[i] = (*entry[:2], status, why)
