"""Expert parallelism's options (`--ep`, `--ep-bandwidth`) checked against the profile, the data
parallelism and the runtime that will run the plan, each refusal one sentence; and the routing
assumption the plan rests on (balanced routing), said aloud."""

from __future__ import annotations

from planner.errors import UserError


def check_ep(profile, *, ep: int, dp: int, shard_group: int | None, ep_bandwidth: float | None) -> None:
    """One sentence for each --ep the profile or the data parallelism cannot take."""
    if ep_bandwidth is not None and ep == 1:
        raise UserError("--ep-bandwidth is the experts' all-to-all bandwidth; it needs --ep 2 or more")
    # the experts' GEMMs' shape the profile's times were made at (formulas.Shape.ep: evaluate --from-* makes it
    # at the job's EP; `ckplan profile` at 1, where --ep E keeps the smaller GEMMs' time, an over-estimate)
    made = profile.assumptions.get("ep", 1)
    if made > 1 and made != ep:
        raise UserError(f"the profile times its experts' GEMMs as expert parallelism {made} runs them and --ep is "
                        f"{ep}; profile the model for --ep {ep}")
    if ep == 1:
        return
    if not any(layer.expert_param_count for layer in profile.layers) and profile.source == "fake":
        raise UserError(f"--ep {ep} splits routed experts, and this --fake profile records none: a dense model, "
                        "experts outside planner/runtime/routing.py's contract (a submodule named experts with "
                        "num_experts and its parameters stacked over them), or a profile made before --fake "
                        "recorded experts (profile it again); drop --ep, or follow that contract")
    if not any(layer.expert_param_count for layer in profile.layers):
        raise UserError(f"--ep {ep} splits routed experts, and this profile has none (a dense model, or a profile "
                        "made before experts were recorded); drop --ep, or profile a mixture-of-experts model with "
                        "`ckplan profile --arch`")
    if dp % ep:
        divisors = ", ".join(str(k) for k in range(1, dp + 1) if dp % k == 0)
        raise UserError(f"--ep {ep} does not divide --dp {dp}: expert-parallel ranks are data-parallel ranks "
                        f"(Megatron-LM, torchtitan); use one of {divisors}, or raise --dp")
    experts = routed_experts(profile)
    if experts is not None and experts % ep:
        divisors = ", ".join(str(k) for k in range(2, experts + 1) if experts % k == 0 and dp % k == 0) or "none here"
        raise UserError(f"--ep {ep} does not divide the model's {experts} routed experts; every expert-parallel "
                        f"rank holds the same number of them (an --ep dividing both them and --dp {dp}: {divisors})")
    if shard_group is not None and shard_group % ep:
        raise UserError(f"--ep {ep} does not divide --shard-group {shard_group}: the experts' state is sharded over "
                        "shard group / ep ranks; choose a shard group that is a multiple of --ep")


def routed_experts(profile) -> int | None:
    """The routed experts of the model's MoE layers: an analytic profile's model says; a
    measured one recorded the tokens each routed expert received (routed_tokens); None: not known."""
    model = profile.assumptions.get("model")
    experts = model.get("num_experts") if isinstance(model, dict) else None
    if isinstance(experts, int):
        return experts
    counts = {len(layer.routed_tokens) for layer in profile.layers if layer.routed_tokens}
    return min(counts) if counts else None


def check_ep_runtime(profile, *, ep: int, zero: int, runtime: str) -> None:
    """A plan for ckplan's runtime (launch) from a model file runs expert parallelism with ZeRO 0
    only (runtime/experts.py): refused here, not after the ranks have started."""
    if ep > 1 and zero and runtime == "ckplan" and profile.source in ("measured", "fake"):
        raise UserError(f"--ep {ep} with --zero {zero}: ckplan's runtime runs expert parallelism with ZeRO 0 only "
                        "(ZeRO's partitions would mix different experts across the group), and `ckplan launch` runs "
                        "this plan; use --zero 0, or plan for the framework you export to (--runtime megatron or "
                        "torchtitan)")


def routing_note(profile, ep: int) -> str | None:
    """Expert parallelism's assumption said aloud: the plan charges every rank the mean of the
    routed token copies (balanced routing); how far the profiled microbatch's routing was from
    that on the busiest rank, and what its experts would keep beyond the plan there. None for a
    profile without recorded routing (analytic profiles state --capacity-factor instead)."""
    from planner.runtime.routing import rank_load
    from planner.units import format_bytes

    loads = [(rank_load(layer.routed_tokens, len(layer.routed_tokens), ep), layer) for layer in profile.layers
             if layer.routed_tokens and len(layer.routed_tokens) % ep == 0]
    if not loads:
        return None
    if profile.source == "fake":  # its routed_tokens are the balanced expectation (profiler/fake_moe.py)
        return (f"--ep {ep}: the plan charges balanced routing (every rank the mean of the routed token copies); "
                "a --fake profile has no routing to weigh that against (a fake tensor has no values): the busiest "
                "rank keeps more by as much as real routing is uneven")
    load, layer = max(loads, key=lambda item: item[0])
    return (f"--ep {ep}: the plan charges balanced routing (every rank the mean of the routed token copies); on the "
            f"profiled microbatch the busiest rank of {layer.name} computes {load:.2f}x the mean, which would keep "
            f"{format_bytes((load - 1) * layer.expert_act_bytes)} more per microbatch there than the plan says")
