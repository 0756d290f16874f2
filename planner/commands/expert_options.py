"""Expert parallelism's options (`--ep`, `--ep-bandwidth`) checked against the profile, the data
parallelism and the runtime that will run the plan, each refusal one sentence; and the routing
assumption the plan rests on (balanced routing), said aloud."""

from __future__ import annotations

from planner.errors import UserError


def check_ep(profile, *, ep: int, dp: int, shard_group: int | None, ep_bandwidth: float | None) -> None:
    """One sentence for each --ep the profile or the data parallelism cannot take."""
    if ep_bandwidth is not None and ep == 1:
        raise UserError("--ep-bandwidth is the experts' all-to-all bandwidth; it needs --ep 2 or more")
    if ep == 1:
        _check_made_at(profile, ep)
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
    _check_made_at(profile, ep)


def _check_made_at(profile, ep: int) -> None:
    """An analytic profile's experts' times hold at the expert parallelism they were made at only
    (formulas.Shape.ep: experts / ep grouped GEMMs of ep x the tokens each, larger and faster than one
    device's), so --ep must be that one. It is refused, not re-made here: the plan names the profile
    file, and export and evaluate read its times again (`ckplan search` makes one profile per EP itself)."""
    made = profile.assumptions.get("ep", 1)
    if made == ep or profile.source != "analytic" and made == 1:
        return  # a measured or --fake profile: expert_time_note says what its times assume
    at = (f"times its experts' GEMMs as expert parallelism {made} runs them" if made > 1 else
          "times its experts' GEMMs as one device runs them all (expert parallelism 1)")
    raise UserError(f"the profile {at} and --ep is {ep}; profile the model for it: {remake_command(profile, ep)}")


def remake_command(profile, ep: int) -> str:
    """The `ckplan profile` line that makes this analytic profile again at expert parallelism `ep`:
    its model and the options it records (--mfu, --capacity-factor, --compiled, --attention-kernel, --optimizer-impl
    where not the default)."""
    facts = profile.assumptions
    ref = profile.model.file if profile.model is not None else ""
    model = f"--arch {ref[len('arch:'):]}" if ref.startswith("arch:") else f"--arch-config {ref or 'CONFIG'}"
    parts = [f"ckplan profile {model}", f"--seq-len {facts.get('seq_len')}",
             f"--micro-batch-size {profile.micro_batch_size}"]
    parts += [f"--tp {facts['tp']}"] if facts.get("tp", 1) > 1 else []
    parts += ["--sp"] if facts.get("sp") else []
    parts += [f"--cp {facts['cp']}"] if facts.get("cp", 1) > 1 else []
    parts += [f"--attention {facts['attention']}"] if facts.get("attention", "flash") != "flash" else []
    parts += ([f"--attention-kernel {facts['attention_kernel']}"] if facts.get("attention_kernel", "flash2") != "flash2"
              else [])
    parts += [f"--optimizer-impl {facts['optimizer_impl']}"] if facts.get("optimizer_impl", "fused") != "fused" else []
    parts += [f"--gpu {facts['gpu']}"] if facts.get("gpu") else []
    parts += [f"--dtype {profile.dtype}"] if profile.dtype != "bfloat16" else []
    parts += [f"--mfu {facts['mfu']:g}"] if facts.get("mfu") is not None else []
    parts += [f"--capacity-factor {facts['capacity_factor']:g}"] if facts.get("capacity_factor", 1) != 1 else []
    parts += ["--compiled"] if any(layer.compiled_kept_bytes for layer in profile.layers) else []
    parts += [f"--ep {ep}"] if ep > 1 else []
    return " ".join(parts)


def expert_time_note(profile, ep: int) -> str | None:
    """What a measured or --fake profile's experts' times assume under --ep E: one device ran every expert
    over its share of the tokens; an expert-parallel rank runs experts / E of them over E x those tokens,
    larger GEMMs no profile here re-made (an over-estimate where the small ones ran below the GPU's rate).
    None where the profile was made at this EP (an analytic one always is: _check_made_at)."""
    if ep == 1 or profile.source == "analytic" or profile.assumptions.get("ep", 1) == ep:
        return None
    experts = routed_experts(profile)
    many = f"its {experts} routed experts" if experts else "its routed experts"
    return (f"--ep {ep}: the experts' times are this {profile.source} profile's, one device running {many} each "
            f"over its share of the tokens; an --ep {ep} rank runs 1/{ep} of them over {ep} x the tokens each, "
            "larger GEMMs the profile did not time (their time is over-stated where the small ones ran below the "
            "device's rate)")


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
