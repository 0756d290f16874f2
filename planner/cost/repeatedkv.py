"""K and V repeated to the query heads' width before attention, as a runtime's model does it (the
record's cp_repeats_kv): what SDPA then saves for its backward beyond the grouped K/V an analytic
profile counts (the terms repeated_kv_kept and repeated_kv_extra, planner/cost/terms.py).

torchtitan's llama (9dec370 model.py 116-126, 201-209) calls keys = repeat_kv(xk, n_rep), values
likewise, an expand then a reshape (a copy), and hands them to F.scaled_dot_product_attention, whose
flash kernel saves its inputs q, k, v with its output and logsumexp for the backward. So each block
holds K and V at the rank's query heads, a_local = heads / tp, not at its K/V heads,
kv_local = max(kv_heads / tp, 1): 2 x tokens x (a_local - kv_local) x head_dim x 2 B beyond the
profile's K and V (the 405B at TP 8: 16 against 1 head, 240 MiB a block at 32,768 tokens). The
unrepeated xk, xv are not saved (the rotary's and the repeat's backwards need neither).

Where they sit: kept with the layer's activations where the option keeps the attention's inputs;
rerun in the backward, beside the other rerun activations, where the option recomputes them (full,
torchtitan's op-level SAC: repeat_kv's copy is not in its save list, 9dec370 parallelize_llama.py
214-223); an offloaded option's saved tensors are on the host. Under compile a layer whose profile
recorded AOTAutograd's partition (compiled_kept_bytes, TP 1) already holds them: the partition of
torchtitan's block saves sdpa's repeated K and V (tests/test_compiled.py's hand count), so nothing is
added there; a layer charged as eager under compile (no figures: TP > 1) is charged as eager here too.
0 for a profile not analytic (a measured model's own repeat is in its records), for latent attention
(its K/V are up-projected per head already) and where the record does not repeat."""

from __future__ import annotations

from planner.cost import runtimes
from planner.cost.layers import LayerCost
from planner.cost.rules import runtime_facts
from planner.schema import Profile, TrainSetup

BF16_BYTES = 2
BLOCKS = ("decoder_block", "moe_block")
# options that keep the attention's inputs (q, k, v) as the forward made them (analytic_kept's
# selective options: core-attn reruns the core from the kept q, k, v; mlp and mlp-act the MLP alone;
# attn reruns the whole attention module, the repeat with it)
KEEPS_ATTENTION_INPUTS = frozenset({"none", "core-attn", "mlp", "mlp-act", "core-attn,mlp", "core-attn,mlp-act"})


def repeated_kv_bytes(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """The bytes the repeated K and V hold beyond the grouped ones, per microbatch (the module's docstring)."""
    model, shape = profile.assumptions.get("model"), profile.assumptions
    if profile.source != "analytic" or layer.kind not in BLOCKS or not isinstance(model, dict) \
            or model.get("kv_lora_rank") or not runtime_facts(setup).cp_repeats_kv:
        return 0
    tp = shape.get("tp", 1)
    heads, kv_heads = model["num_heads"], model["num_kv_heads"]
    head_dim = model.get("head_dim") or model["hidden_size"] // heads
    q_local, kv_local = heads // tp, max(kv_heads // tp, 1)  # formulas.q_width, kv_width
    tokens = shape["seq_len"] // shape.get("cp", 1) * shape["micro_batch_size"]  # formulas.Shape.tokens
    return 2 * tokens * max(0, q_local - kv_local) * head_dim * BF16_BYTES


def _kept(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> bool | None:
    """True: kept with the activations; False: rerun in the backward; None: on the host, or already in
    the compiled partition's figures."""
    name = layer.options[option].name
    compiled = bool(setup.training.compile) and runtimes.of(setup.training).compiles_model
    if name == "offload" or compiled and any(item.compiled_kept_bytes for item in profile.layers
                                             if item.kind == layer.kind):
        return None
    return name in KEEPS_ATTENTION_INPUTS


def repeated_kv_kept_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """repeated_kv_bytes kept to the backward by a layer whose option keeps the attention's inputs."""
    return repeated_kv_bytes(layer, profile, setup) if _kept(layer, option, profile, setup) is True else 0


def repeated_kv_extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """repeated_kv_bytes held by the layer's backward where it reruns them."""
    return repeated_kv_bytes(layer, profile, setup) if _kept(layer, option, profile, setup) is False else 0
