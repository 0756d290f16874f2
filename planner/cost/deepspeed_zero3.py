"""DeepSpeed ZeRO 3's parameter coordinator, read as a rule over its module trace (framework-facts §103).

ZeRO 3 gathers each submodule's own parameters (recurse=False) when the submodule runs, forward and
backward, and after it runs releases each one whose next use in the recorded trace of the step lies
further than `stage3_max_reuse_distance` parameters' elements away (deepspeed/runtime/zero/
partitioned_param_coordinator.py at v0.6.2, 32d97976: fetch_sub_module 205-300, release_sub_module
302-315, __params_to_release 358-378: the trace walked from the module after the one released, each
module's parameters counted, the walk stopping before a module once more than the distance was
counted; at edaa7221 the same walk stops at `>=`, 653-662). Parameters of at most
`stage3_param_persistence_threshold` elements are never partitioned (ds_persist) and never gathered,
but count in the walk.

Under reentrant activation checkpointing a block's backward re-runs its forward, then its backward:
each submodule's parameters are used at its recompute and again at its backward. Between the two
uses the trace holds the submodules after it twice (their recompute, then their backward), so a
submodule's parameters stay gathered to their backward only where the block's parameters after it,
counted twice, fit within the distance; every other submodule is gathered a third time in the step
(forward, recompute, backward), where FSDP2 gathers a unit twice (forward; recompute and backward).

Nothing here reads a setup: planner/cost/deepspeed_terms.py charges what `simulate` finds at the setup's
stage3 knobs (the --stage3-* options, docs/published-runs.md §25.dszero3); scripts/deepspeed_zero3_trace.py
and scripts/deepspeed_working_set.py print it for the published rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# deepspeed/runtime/zero/constants.py at v0.6.2 (32d97976) 99-112
MAX_REUSE_DISTANCE_DEFAULT = 1_000_000_000
PARAM_PERSISTENCE_THRESHOLD_DEFAULT = 100_000


@dataclass(frozen=True)
class Submodule:
    """One module of the trace: its name, its own parameters' element counts (weight, bias), and the part of
    the block a ckplan recompute option names for it ("attn", "mlp", "norm": the options that rerun it)."""
    name: str
    param_numels: tuple[int, ...]
    part: str = ""

    @property
    def numel(self) -> int:
        return sum(self.param_numels)


def gpt_block(hidden: int, intermediate: int) -> list[Submodule]:
    """Megatron-DeepSpeed's GPT block in forward order (megatron/model/transformer.py: input
    LayerNorm, the fused QKV ColumnParallelLinear, the output RowParallelLinear, the post-attention
    LayerNorm, the MLP's two linears; each with its bias)."""
    h, i = hidden, intermediate
    return [Submodule("input_layernorm", (h, h), "norm"), Submodule("query_key_value", (3 * h * h, 3 * h), "attn"),
            Submodule("dense", (h * h, h), "attn"), Submodule("post_attention_layernorm", (h, h), "norm"),
            Submodule("dense_h_to_4h", (h * i, i), "mlp"), Submodule("dense_4h_to_h", (i * h, h), "mlp")]


def llama_block(hidden: int, intermediate: int, *, heads: int, kv_heads: int, head_dim: int,
                qkv_bias: bool = False, qk_norm: bool = False) -> list[Submodule]:
    """transformers' LlamaDecoderLayer (and Qwen2's, Qwen3's, Mistral's) in the order its forward first
    uses its modules, which is the order DeepSpeed's trace records them (modeling_llama.py: input_layernorm;
    self_attn's q_proj, k_proj, v_proj, o_proj; post_attention_layernorm; mlp's
    down_proj(act_fn(gate_proj(x)) * up_proj(x)): gate_proj, up_proj, down_proj). Grouped-query attention:
    k_proj and v_proj kv_heads x head_dim wide. Qwen2: biases on q, k and v; Qwen3: q_norm after q_proj and
    k_norm after k_proj (modeling_qwen3.py). RMSNorms have a weight only. Modules without parameters
    (rotary_emb, act_fn, the containers) are hooked too but gather and count nothing, so they are left out.
    Their backward runs in the reverse order (autograd takes the latest-made node first: v_proj's, k_proj's,
    q_proj's; up_proj's before gate_proj's), which `trace` assumes."""
    h, i, q, kv = hidden, intermediate, heads * head_dim, kv_heads * head_dim

    def proj(name: str, out: int) -> Submodule:
        return Submodule(name, (h * out, out) if qkv_bias else (h * out,), "attn")

    norm = [Submodule("q_norm", (head_dim,), "attn")] if qk_norm else []
    knorm = [Submodule("k_norm", (head_dim,), "attn")] if qk_norm else []
    return [Submodule("input_layernorm", (h,), "norm"), proj("q_proj", q), *norm, proj("k_proj", kv), *knorm,
            proj("v_proj", kv), Submodule("o_proj", (q * h,), "attn"),
            Submodule("post_attention_layernorm", (h,), "norm"), Submodule("gate_proj", (h * i,), "mlp"),
            Submodule("up_proj", (h * i,), "mlp"), Submodule("down_proj", (i * h,), "mlp")]


def megatron_llama_block(hidden: int, intermediate: int, *, heads: int, kv_heads: int, head_dim: int,
                         qkv_bias: bool = False) -> list[Submodule]:
    """Megatron-DeepSpeed's LLaMA block (--swiglu --normalization rmsnorm --disable-bias-linear
    --num-key-value-heads: megatron/model/transformer.py ParallelTransformerLayer at 73029edf) in forward order:
    input_layernorm; self_attention's query_key_value (Q, K and V fused: (heads + 2 kv_heads) x head_dim
    rows) and dense; post_attention_layernorm; the MLP's dense_h_to_4h (gate and up fused: 2 x intermediate
    rows) and dense_4h_to_h. No biases but Q/K/V's where given (--add-qkv-bias)."""
    h, i, qkv = hidden, intermediate, (heads + 2 * kv_heads) * head_dim
    return [Submodule("input_layernorm", (h,), "norm"),
            Submodule("query_key_value", (h * qkv, qkv) if qkv_bias else (h * qkv,), "attn"),
            Submodule("dense", (heads * head_dim * h,), "attn"), Submodule("post_attention_layernorm", (h,), "norm"),
            Submodule("dense_h_to_4h", (h * 2 * i,), "mlp"), Submodule("dense_4h_to_h", (i * h,), "mlp")]


def rerun_ranges(block: Sequence[Submodule], option: str) -> tuple[tuple[int, int], ...]:
    """The (start, stop) submodule ranges a ckplan recompute option reruns, each its own checkpoint: "full"
    the whole block; "op-sac" too (torch's checkpoint reruns the block's forward whole, its policy only
    serving the saved ops' outputs from the cache: torch/utils/checkpoint.py, so every submodule's
    pre-forward hook fires, and DeepSpeed's fetch with it); a selective option ("attn", "mlp", "attn,mlp")
    the block's submodules of each part it names; parts with no parameter here (core-attn, mlp-act: a
    function inside a module; norm-out: persistent norms) none; "none" and "offload" none."""
    if option in ("full", "op-sac"):
        return ((0, len(block)),)
    ranges = []
    for part in option.split(","):
        indices = [j for j, module in enumerate(block) if module.part == part and part != "norm"]
        if indices:
            ranges.append((indices[0], indices[-1] + 1))
    return tuple(sorted(ranges))


def kept_to_backward(block: Sequence[Submodule], *, max_reuse_numel: int, stop_at_equal: bool = False) -> list[bool]:
    """Per submodule of a checkpointed block: whether its parameters stay gathered from their
    recompute to their backward. After submodule j's recompute the walk counts the submodules
    after it (recompute), then the same in reverse (backward), then reaches j's backward: kept
    iff the walk has not stopped by then, i.e. twice the elements after j are within the distance
    (more than it stops at v0.6.2; `stop_at_equal`: at it or more, as at edaa7221)."""
    kept = []
    for j in range(len(block)):
        after = 2 * sum(m.numel for m in block[j + 1:])
        kept.append(after < max_reuse_numel if stop_at_equal else after <= max_reuse_numel)
    return kept


def gathered_numel(block: Sequence[Submodule], *, max_reuse_numel: int,
                   persistence_threshold: int = PARAM_PERSISTENCE_THRESHOLD_DEFAULT,
                   stop_at_equal: bool = False) -> tuple[int, int]:
    """(elements a checkpointed block gathers per microbatch, of them the third gathers): every
    partitioned parameter in forward and in its recompute, and again for its backward where its
    submodule is not kept to it. Persistent parameters (at most the threshold) are not gathered."""
    kept = kept_to_backward(block, max_reuse_numel=max_reuse_numel, stop_at_equal=stop_at_equal)
    twice = third = 0
    for module, stays in zip(block, kept):
        partitioned = sum(n for n in module.param_numels if n > persistence_threshold)
        twice += 2 * partitioned
        third += 0 if stays else partitioned
    return twice + third, third


# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (the same at v0.6.2's constants.py 51-112 and at
# edaa7221): stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9 (and the reuse distance above)
PREFETCH_BUCKET_DEFAULT = 50_000_000
MAX_LIVE_DEFAULT = 1_000_000_000


@dataclass(frozen=True)
class Moment:
    """One submodule's run in the simulated trace: which layer, "forward" / "recompute" / "backward",
    the submodule, the partitioned elements gathered (available or in flight) while it computes, the
    gradient elements held (backward: its own and the previous submodule's, not yet reduced), and the
    elements gathered for this run (by its own fetch or by an earlier run's prefetch)."""
    layer: int
    phase: str
    name: str
    gathered: int
    grads: int
    fetched: int


def trace(block: Sequence[Submodule], *, layers: int, checkpointed: bool,
          reruns: tuple[tuple[int, int], ...] | None = None,
          per_layer: Sequence[tuple[tuple[int, int], ...]] | None = None) -> list[tuple[int, str, int]]:
    """(layer, phase, submodule index) of every submodule run of a step of `layers` equal blocks:
    every forward, then each layer from the last: its backward, from its last submodule, where each rerun
    range (`reruns`; `checkpointed`: the whole block; `per_layer`: each layer's own) is recomputed when the
    backward reaches its last submodule (a checkpoint reruns when its first saved tensor is unpacked), then run
    backward."""
    if reruns is None:
        reruns = ((0, len(block)),) if checkpointed else ()
    runs = [(layer, "forward", j) for layer in range(layers) for j in range(len(block))]
    for layer in reversed(range(layers)):
        ends = {stop - 1: (start, stop) for start, stop in (reruns if per_layer is None else per_layer[layer])}
        for j in reversed(range(len(block))):
            if j in ends:
                runs += [(layer, "recompute", k) for k in range(*ends[j])]
            runs.append((layer, "backward", j))
    return runs


@dataclass(frozen=True)
class Call:
    """One run's coordinator actions, for the allocator's replay (planner/cost/reserve_deepspeed.py): the
    parameters (layer, submodule, tensor) its own fetch gathers in one all_gather_coalesced call, those its
    prefetch gathers in another, and those released after it runs."""
    fetched: tuple[tuple[int, int, int], ...]
    prefetched: tuple[tuple[int, int, int], ...]
    released: tuple[tuple[int, int, int], ...]


def simulate(block: Sequence[Submodule], *, layers: int, checkpointed: bool, max_reuse_numel: int,
             prefetch_bucket: int = PREFETCH_BUCKET_DEFAULT, max_live: int = MAX_LIVE_DEFAULT,
             persistence_threshold: int = PARAM_PERSISTENCE_THRESHOLD_DEFAULT,
             reruns: tuple[tuple[int, int], ...] | None = None) -> list[Moment]:
    """The coordinator at edaa7221 (partitioned_param_coordinator.py) run over a step's trace of `layers`
    equal blocks, a parameter a tensor (weight, bias), the embedding and head left out. fetch_sub_module
    (~400-485): the run's parameters not already fetched are popped from the trace's queue and gathered;
    then, while fewer than min(max_live - gathered, prefetch_bucket) elements are being prefetched, the
    queue's next entry is popped and gathered if it is not already (its use marked fetched either way).
    release_sub_module / __params_to_release (~510-664): the run's partitioned parameters are released but
    those a prefetch marked for a later use and those seen walking the trace from the next run until at
    least max_reuse elements were counted. Persistent parameters (at most the threshold) are never gathered
    nor released but count in the walk. `reruns`: the ranges each block recomputes (trace), where not the
    whole block (`checkpointed`) or nothing."""
    runs, states, gathered_for, _ = _walk(block, layers=layers, checkpointed=checkpointed, reruns=reruns,
                                          max_reuse_numel=max_reuse_numel, prefetch_bucket=prefetch_bucket,
                                          max_live=max_live, persistence_threshold=persistence_threshold)
    return [Moment(layer, phase, block[j].name, held, grads, gathered_for[step])
            for step, ((layer, phase, j), (held, grads)) in enumerate(zip(runs, states))]


def calls(block: Sequence[Submodule], *, layers: int, checkpointed: bool, max_reuse_numel: int,
          prefetch_bucket: int = PREFETCH_BUCKET_DEFAULT, max_live: int = MAX_LIVE_DEFAULT,
          persistence_threshold: int = PARAM_PERSISTENCE_THRESHOLD_DEFAULT,
          reruns: tuple[tuple[int, int], ...] | None = None,
          per_layer: Sequence[tuple[tuple[int, int], ...]] | None = None
          ) -> tuple[list[tuple[int, str, int]], list[Call]]:
    """`simulate`'s walk as the runs (`trace`; `per_layer`: each layer's rerun ranges) and each run's gathers and
    releases (Call), parameter by parameter."""
    runs, _, _, made = _walk(block, layers=layers, checkpointed=checkpointed, reruns=reruns, per_layer=per_layer,
                             max_reuse_numel=max_reuse_numel, prefetch_bucket=prefetch_bucket, max_live=max_live,
                             persistence_threshold=persistence_threshold)
    return runs, made


def _walk(block: Sequence[Submodule], *, layers: int, checkpointed: bool, reruns, max_reuse_numel: int,
          prefetch_bucket: int, max_live: int, persistence_threshold: int, per_layer=None):
    """simulate's and calls' walk: the runs, each run's (held, grads) state, the elements gathered for each run,
    and each run's Call."""
    runs = trace(block, layers=layers, checkpointed=checkpointed, reruns=reruns, per_layer=per_layer)
    params = [[(layer, j, t) for t in range(len(block[j].param_numels))] for layer, _, j in runs]
    numel = {p: block[p[1]].param_numels[p[2]] for ps in params for p in ps}
    persist = {p for p, n in numel.items() if n <= persistence_threshold}
    queue = [(p, step) for step, ps in enumerate(params) for p in ps]
    head, available, fetched_for = 0, set(), {p: -1 for p in numel}
    gathered_for = [0] * len(runs)
    states, made, previous_grad = [], [], 0
    for step, (_, phase, j) in enumerate(runs):
        for _ in [p for p in params[step] if fetched_for[p] < step]:  # the queue's next entries: this run's
            fetched_for[queue[head][0]] = queue[head][1]
            head += 1
        own = tuple(p for p in params[step] if p not in available and p not in persist)
        gathered_for[step] += sum(numel[p] for p in own)
        available |= set(own)
        gathered = sum(numel[p] for p in available)
        limit, prefetching, ahead = min(max_live - gathered, prefetch_bucket), 0, []
        while head < len(queue) and prefetching < limit:
            p, use = queue[head]
            head += 1
            fetched_for[p] = max(fetched_for[p], use)
            if p not in available and p not in persist:
                available.add(p)
                ahead.append(p)
                gathered_for[use] += numel[p]
                prefetching += numel[p]
        own_grad = block[j].numel if phase == "backward" else 0
        states.append((gathered + prefetching, own_grad + previous_grad))
        previous_grad = own_grad if phase == "backward" else previous_grad
        release, traversed = {p for p in params[step] if p not in persist and fetched_for[p] <= step}, 0
        for later in params[step + 1:] if release else ():
            if traversed >= max_reuse_numel:
                break
            release -= set(later)
            traversed += sum(numel[p] for p in later)
        available -= release
        made.append(Call(own, tuple(ahead), tuple(p for p in params[step] if p in release)))
    return runs, states, gathered_for, made


def peak_held(moments: Sequence[Moment], *, weight_bytes: float, grad_bytes: float) -> Moment:
    """The moment of `moments` at which the coordinator holds the most bytes: its gathered (or in-flight)
    elements at `weight_bytes` and its held gradients at `grad_bytes` each."""
    return max(moments, key=lambda m: m.gathered * weight_bytes + m.grads * grad_bytes)


def third_gather_share(block: Sequence[Submodule], moments: Sequence[Moment]) -> float:
    """Elements `moments` (a layer's recompute and backward, whole or selective) gather beyond one gather of the
    block's partitioned parameters, a share of them (0: all kept from the recompute to the backward)."""
    partitioned = sum(n for m in block for n in m.param_numels if n > PARAM_PERSISTENCE_THRESHOLD_DEFAULT)
    return max(0, sum(m.fetched for m in moments) - partitioned) / partitioned if partitioned else 0.0
