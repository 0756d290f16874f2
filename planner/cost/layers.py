"""A layer's numbers as the cost model uses them: kind-normalised (times the kind's mean, bytes its
maximum), with every recompute option it may take."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from statistics import fmean

from planner.schema import (
    OPTION_FULL,
    OPTION_NONE,
    Profile,
)


@dataclass(frozen=True)
class OptionCost:
    """One recompute option of a layer (kind-normalised): kept bytes per microbatch, what it
    adds to the backward (None: a whole forward, the profile measured none), its extra peak."""

    name: str
    kept_bytes: int
    recompute_ms: float | None
    peak_bytes: int
    split_held_bytes: int = 0  # a split backward: left by its input pass for its weight pass
    split_input_peak_bytes: int = 0  # a split backward: its input pass's peak over what is live before it
    split_peak_bytes: int = 0  # a split backward: its weight pass's peak over what is live before it
    # ... its first parameter group's peak and what its last group leaves for the next layer's (wgroups.py);
    # None: not recorded
    split_first_peak_bytes: int | None = None
    split_carry_bytes: int | None = None
    split_left_bytes: int | None = None  # ... of its carry, what stays to the stage's weight pass's end
    host_bytes: int = 0  # offload: what it keeps in host memory per microbatch until its backward
    # a split backward's two passes (the profile's input_grad_ms, weight_grad_ms: torch's
    # stage_backward_input and stage_backward_weight); None: not recorded (planner/cost/splittime.py)
    input_grad_ms: float | None = None
    weight_grad_ms: float | None = None


@dataclass(frozen=True)
class ExchangeCost:
    """A layer's attention exchange under context parallelism (the profile's LayerContextParallel)."""

    ranks: int
    q_bytes: int
    kv_bytes: int
    attention_fwd_ms: float
    attention_bwd_ms: float


@dataclass(frozen=True)
class LayerCost:
    """One layer's numbers as the cost model uses them (kind-normalised). A layer's choice is
    an index into `options`: 0 none, 1 full (a bool says which of the two), 2... selective."""

    name: str
    kind: str
    fwd_ms: float
    bwd_ms: float
    act_bytes: int
    input_bytes: int
    output_bytes: int
    input_in_act_bytes: int
    param_count: int
    transient_bytes: int
    step_ms: tuple[tuple[str, float], ...] = ()  # (optimizer, ms) pairs
    # cpu: (threads, (optimizer, ms) pairs) at each count the profile timed, its own threads' step_ms among them
    step_thread_ms: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()
    largest_param_count: int = 0  # its largest parameter tensor; 0: not known
    last_trained_param_count: int = 0  # its last trained parameter tensor; 0: not known (gloowork.py)
    param_tensors: int = 0  # its trained parameter tensors; 0: not known (stepcounts.py)
    lookup_param_count: int = 0  # of param_count, its embedding lookups' tables (the profile's; 0: none)
    recompute_ms: float | None = None  # None: not measured, a whole forward
    # the parameters it shares with other layers: (parameters, holders) per tied set (rules.tied_sum_ms)
    tied: tuple[tuple[int, int], ...] = ()
    # of param_count, those an earlier layer holds too (a tied head's weight): one nn.Parameter where both share a rank
    shared_before: int = 0
    extra_options: tuple[OptionCost, ...] = ()  # selective options, after none and full
    variant: str | None = None  # the profile's (LayerProfile.variant): normalised within kind and variant
    expert_param_count: int = 0  # of param_count, the routed experts' (expert parallelism splits them)
    a2a_bytes: int = 0  # a MoE block's token dispatch per microbatch (the all-to-all term)
    # none's and full's split backward bytes: (held, input peak, weight peak)
    split_bytes: tuple[tuple[int | None, ...], tuple[int | None, ...]] = ((0, 0, 0, None, None, None),
                                                                          (0, 0, 0, None, None, None))
    # none's and full's split backward times: (input pass, weight pass) ms, None where not recorded
    split_ms: tuple[tuple[float, float] | None, tuple[float, float] | None] = (None, None)
    expert_transient_bytes: int = 0  # of transient_bytes, the routed experts' weight gradients' (ep divides it)
    weight_grad_transient_bytes: int = 0  # of transient_bytes, autograd's fresh weight gradients' (freshgrads.py)
    # its tensor-parallel collectives per microbatch: (kind, tensor bytes, forward, backward,
    # recompute counts, AsyncTP's fused matmuls: (whole, chunk, copy, fp8 whole, fp8 chunk) ms or
    # None, TE's ring-exchange GEMM: (whole, chunk, pair, fp8 whole, fp8 chunk, fp8 pair) ms or None), as the
    # profile lists them (LayerCollective); charged by comm.layer_comm_ms
    collectives: tuple[tuple, ...] = ()
    # its attention's exchange under context parallelism (the profile's LayerContextParallel, the
    # kind's first layer's: a kind's blocks are alike); None: none (planner/cost/contextparallel.py)
    context_parallel: ExchangeCost | None = None
    float8_param_count: int = 0  # of param_count, Float8 linears' weights (the profile's record; 0: none)
    # its TE modules by num_gemms, where its Float8 record has a delayed scaling one (planner/cost/te_delayed.py)
    float8_module_gemms: tuple[int, ...] = ()
    # of the kind's act_bytes, this layer's output, which the next layer saves as its input and pays for
    # (layer_costs: shared_out); act_bytes is net of it
    output_shared_bytes: int = 0
    buffer_bytes: int = 0  # its registered buffers (the profile's)
    # of transient_bytes, the gradient of its output its backward runs on (the profile's incoming_grad_bytes, by
    # kind: max(T) - max(T - r), the kind's transient being its layers' max): planner/cost/boundgrad.py
    incoming_grad_bytes: int = 0
    # of transient_bytes, its forward's alone (the profile's, by kind; None where a layer of it records none)
    forward_transient_bytes: int | None = None
    # of param_count, those this layer holds frozen (requires_grad False: the profile's param_count less its
    # trained_param_count; 0 where it records none): held as weights, no gradient nor optimizer state
    frozen_param_count: int = 0
    # its trained tensors' elements (the profile's trained_param_numels), and those less the tensors an earlier layer
    # holds (a tied head's weight, one tensor where both share a stage): ZeRO 1's partition (zeroone.py). None: not known
    trained_numels: tuple[int, ...] | None = None
    own_numels: tuple[int, ...] | None = None
    # whether its input and its output require a gradient in the model's forward (the profile's input_requires_grad,
    # this layer's and the next one's): where not, torch's pipelining sends no gradient of a stage input and makes no
    # receive buffer for the gradient of a stage output (rules.first_layer_buffer_bytes, last_layer_buffer_bytes)
    input_grad: bool = True
    output_grad: bool = True

    def step_at(self, optimizer: str, threads: int | None) -> float:
        """The optimizer's step over the layer at `threads` torch threads (None: as profiled): linear between the
        two counts timed around it, the nearest end's outside them; the profiled step where none was timed."""
        timed = {count: dict(steps).get(optimizer, 0.0) for count, steps in self.step_thread_ms}
        if threads is None or not timed:
            return dict(self.step_ms).get(optimizer, 0.0)
        counts = sorted(timed)
        low = max((c for c in counts if c <= threads), default=counts[0])
        high = min((c for c in counts if c >= threads), default=counts[-1])
        share = 0.0 if high == low else (threads - low) / (high - low)
        return timed[low] + share * (timed[high] - timed[low])

    @cached_property
    def options(self) -> tuple[OptionCost, ...]:
        none_split, full_split = self.split_bytes
        none_ms, full_ms = (dict(zip(("input_grad_ms", "weight_grad_ms"), ms or (None, None))) for ms in self.split_ms)
        return (OptionCost(OPTION_NONE, self.act_bytes, 0.0, 0, *none_split, **none_ms),
                OptionCost(OPTION_FULL, self.input_bytes, self.recompute_ms, self.recompute_peak_bytes, *full_split,
                           **full_ms),
                *self.extra_options)

    def option_index(self, name: str) -> int:
        for index, option in enumerate(self.options):
            if option.name == name:
                return index
        raise ValueError(f"layer {self.name} has no recompute option {name!r}")

    @property
    def trained_count(self) -> int:
        """Its parameters requiring grad: those an optimizer (ZeroRedundancyOptimizer's partition: ZeRO 1's whole
        tensors) and a gradient reduction hold (runtime/mesh.py dp_optimizer; framework-facts §729)."""
        return self.param_count - self.frozen_param_count

    def zero_one_numels(self, stages: int) -> tuple[int, ...] | None:
        """Its tensors in its stage's ZeRO 1 partition (zeroone.py): on one stage, those no earlier layer holds. None
        where not known, or where their count is not the step counts static charges (stepcounts.py: param_tensors)."""
        if self.trained_numels is None or len(self.trained_numels) != self.param_tensors:
            return None
        return self.own_numels if stages == 1 else self.trained_numels

    @property
    def largest_trained_count(self) -> int:
        """Its largest tensor as ZeroRedundancyOptimizer's partition sees it: none where every parameter is frozen (the
        runtime hands it only those requiring grad: §729); the largest of all where some train (the profile records
        no largest trained tensor: an upper bound)."""
        return self.largest_param_count if self.trained_count else 0

    @property
    def recompute_saving_bytes(self) -> int:
        """Bytes per microbatch that checkpointing this layer frees."""
        return self.act_bytes - self.input_bytes

    @property
    def recompute_peak_bytes(self) -> int:
        """Extra bytes while this checkpointed layer is recomputed in backward (all it saves, its output too) beyond
        the input its checkpoint keeps: less only the part of what it saves that is that input (input_in_act_bytes).
        A layer that saves none of its input (Cohere's: its LayerNorm starts with a subtraction, and its attention and
        MLP read the norm's output) recomputes all of it on top of the kept input (§67.usertrial67)."""
        return max(self.act_bytes + self.output_shared_bytes - min(self.input_bytes, self.input_in_act_bytes), 0)


# ---------------------------------------------------------------- per-layer terms


BUFFER_ROWS = (("a layer's registered buffers, on its stage's device all along", "buffers", "layer",
                lambda layer, ckpt, ctx: layer.buffer_bytes,
                "the profile's module.buffers(); the CPU runtime's peak counts them (torch 2.13.0 mem_tracker.py "
                "573-618, 788-815: docs/framework-facts.md §548)"),)


_LAYER_COSTS: dict[int, tuple] = {}  # id(profile) -> (a weak reference to it, its parts' ids, its layer costs)


def _fused(collective) -> tuple | None:
    fused = collective.fused
    return None if fused is None else (fused.whole_ms, fused.chunk_ms, fused.copy_ms, fused.fp8_whole_ms,
                                       fused.fp8_chunk_ms)


def _ring(collective) -> tuple | None:
    ring = collective.ring
    return None if ring is None else (ring.whole_ms, ring.chunk_ms, ring.pair_ms, ring.fp8_whole_ms,
                                      ring.fp8_chunk_ms, ring.fp8_pair_ms)


def layer_costs(profile: Profile) -> list[LayerCost]:
    """Kind-normalised layer numbers: mean times, maximum bytes within a kind and variant. Remembered per
    profile object (its layers' and tied sets' objects unchanged): a solve asks for them in
    every baseline, bound and solver, and at 20,000 layers each asking took a second."""
    parts = (tuple(map(id, profile.layers)), tuple(map(id, profile.tied)))
    known = _LAYER_COSTS.get(id(profile))
    if known is not None and known[0]() is profile and known[1] == parts:
        return list(known[2])
    found = _layer_costs(profile)
    if len(_LAYER_COSTS) > 64:
        _LAYER_COSTS.clear()
    _LAYER_COSTS[id(profile)] = (weakref.ref(profile), parts, tuple(found))
    return found


def _kind_thread_steps(same, threads: int | None) -> tuple:
    """A kind's step at each thread count every one of its layers timed (the mean), the profile's own threads'
    step_ms among them; () where none was timed at fewer threads (cuda, 1 thread, older profiles)."""
    if not threads or not all(item.step_thread_ms for item in same):
        return ()
    counts = set.intersection(*(set(item.step_thread_ms) for item in same)) - {threads}
    at = {count: [item.step_thread_ms[count] for item in same] for count in counts}
    at[threads] = [item.step_ms for item in same]
    return tuple((count, tuple(sorted((name, fmean(steps.get(name, 0.0) for steps in rows))
                                      for name in {name for steps in rows for name in steps})))
                 for count, rows in sorted(at.items()))


def _layer_costs(profile: Profile) -> list[LayerCost]:
    by_kind: dict[tuple[str, str | None], list] = {}
    for layer in profile.layers:  # a kind's variants apart: a global layer is not its sliding ones' mean
        by_kind.setdefault((layer.kind, layer.variant), []).append(layer)
    per_kind = {
        kind: dict(
            fwd_ms=fmean(item.fwd_ms for item in same),
            bwd_ms=fmean(item.bwd_ms for item in same),
            act_bytes=max(item.act_bytes + item.input_shared_bytes for item in same),  # its input its own
            input_bytes=max(item.input_bytes for item in same),
            output_bytes=max(item.output_bytes for item in same),
            input_in_act_bytes=min(item.input_in_act_bytes + item.input_shared_bytes for item in same),
            param_count=max(item.param_count for item in same),
            expert_param_count=max(item.expert_param_count for item in same),
            a2a_bytes=max(item.a2a_bytes for item in same),
            split_bytes=tuple(_kind_split(same, index) for index in (0, 1)),
            split_ms=tuple(_kind_split_ms([item.recompute_options[index] for item in same
                                           if len(item.recompute_options) > index], len(same)) for index in (0, 1)),
            expert_transient_bytes=max(item.expert_transient_bytes for item in same),
            weight_grad_transient_bytes=max(item.weight_grad_transient_bytes or 0 for item in same),
            largest_param_count=max(item.largest_param_count or 0 for item in same),
            last_trained_param_count=max(_last_trained_param_count(item) for item in same),
            param_tensors=max(item.param_tensors for item in same),
            trained_numels=_kind_numels(same),
            lookup_param_count=max(item.lookup_param_count for item in same),
            buffer_bytes=max(item.buffer_bytes for item in same),
            transient_bytes=max(item.transient_bytes for item in same),
            forward_transient_bytes=(None if any(item.forward_transient_bytes is None for item in same)
                                     else max(item.forward_transient_bytes for item in same)),
            incoming_grad_bytes=max(item.transient_bytes for item in same)
            - max(item.transient_bytes - item.incoming_grad_bytes for item in same),
            recompute_ms=(None if any(item.recompute_ms is None for item in same)
                          else fmean(item.recompute_ms for item in same)),
            step_ms=tuple(sorted(
                (name, fmean(item.step_ms.get(name, 0.0) for item in same))
                for name in {name for item in same for name in item.step_ms}
            )),
            step_thread_ms=_kind_thread_steps(same, profile.device.threads),
            extra_options=_kind_options(same),
            collectives=tuple((c.kind, c.tensor_bytes, c.fwd, c.bwd, c.recompute, _fused(c), _ring(c))
                              for c in same[0].collectives),
            context_parallel=_exchange(same[0]),
            float8_param_count=max(item.float8.param_count if item.float8 is not None else 0 for item in same),
            float8_module_gemms=_module_gemms(same[0]),
        )
        for kind, same in by_kind.items()
    }
    tied = tied_sets(profile)
    before = {name: sum(item.param_count for item in profile.tied if name in item.layers[1:])
              for name in {name for item in profile.tied for name in item.layers[1:]}}
    out, grads = shared_out(profile.layers), input_grads(profile.layers)
    return [LayerCost(name=layer.name, kind=layer.kind, variant=layer.variant,
                      **{**per_kind[layer.kind, layer.variant],
                         "act_bytes": per_kind[layer.kind, layer.variant]["act_bytes"] - shared},
                      output_shared_bytes=shared, tied=tied.get(layer.name, ()), shared_before=before.get(layer.name, 0),
                      own_numels=_own_numels(per_kind[layer.kind, layer.variant]["trained_numels"],
                                             [item.param_count for item in profile.tied if layer.name in item.layers[1:]]),
                      frozen_param_count=frozen_count(layer), input_grad=grads[index], output_grad=grads[index + 1])
            for index, (layer, shared) in enumerate(zip(profile.layers, out))]


def input_grads(layers) -> list[bool]:
    """Whether each profile layer's input requires a gradient (LayerProfile.input_requires_grad; True where not
    recorded, as charged before), then True for the last layer's output: the loss's backward starts there."""
    return [layer.input_requires_grad is not False for layer in layers] + [True]


def frozen_count(layer) -> int:
    """A profile layer's frozen parameters (requires_grad False), its own and not its kind's: a kind's frozen
    blocks and trained ones share their times, never their gradients. 0 where the profile records no trained count
    (analytic profiles, those made before: every parameter trained)."""
    trained = layer.trained_param_count
    return 0 if trained is None else max(0, layer.param_count - trained)


def shared_out(layers) -> list[int]:
    """Per layer, its output's bytes that the next layer pays for. The profile charges a storage to the first
    layer saving it (planner/profiler/saved.py); a layer's kind-normalised act_bytes adds back its input's where the
    layer before saved it (input_shared_bytes), so the charge is exact where that layer is on another stage, and the
    layer before is charged net of it: the storage counted once wherever the stage is cut, the stage output (fwd_cache,
    rules.last_layer_kept_bytes) being that same tensor. The profile records it only where every option of the next
    layer keeps its input, so whatever that layer runs pays for it."""
    return [after.input_shared_bytes for after in layers[1:]] + [0]


def _module_gemms(layer) -> tuple[int, ...]:
    delayed = layer.float8.delayed if layer.float8 is not None else None
    return () if delayed is None else tuple(delayed.module_gemms)


def _exchange(layer) -> ExchangeCost | None:
    found = layer.context_parallel
    return None if found is None else ExchangeCost(found.ranks, found.q_bytes, found.kv_bytes, found.attention_fwd_ms,
                                                   found.attention_bwd_ms)


def _kind_split(same: list, index: int) -> tuple[int | None, ...]:
    """A kind's split-backward bytes of option `index` (0 none, 1 full): the most of any layer (a
    group's figure None unless every layer recorded it)."""
    listed = [item.recompute_options[index] for item in same if len(item.recompute_options) > index]
    return tuple(_most([getattr(o, field) for o in listed], field) for field in SPLIT_FIELDS)


def _most(values: list, field: str) -> int | None:
    if field in GROUP_FIELDS and (not values or any(v is None for v in values)):
        return None
    return max(values, default=0)


GROUP_FIELDS = ("split_first_peak_bytes", "split_carry_bytes", "split_left_bytes")
SPLIT_FIELDS = ("split_held_bytes", "split_input_peak_bytes", "split_peak_bytes", *GROUP_FIELDS)


def _kind_split_ms(listed: list, layers: int) -> tuple[float, float] | None:
    """A kind's split backward times of one option, the mean like its other times; None unless
    every layer of the kind recorded them."""
    if len(listed) < layers or not listed or any(o.input_grad_ms is None for o in listed):
        return None
    return fmean(o.input_grad_ms for o in listed), fmean(o.weight_grad_ms for o in listed)


def _kind_options(same: list) -> tuple[OptionCost, ...]:
    """The selective options every layer of a kind has, kind-normalised like the rest: bytes
    the most of any layer, times the mean."""
    names = [option.name for option in same[0].recompute_options[2:]]
    names = [name for name in names if all(any(o.name == name for o in item.recompute_options) for item in same)]
    found = []
    for name in names:
        mine = [next(o for o in item.recompute_options if o.name == name) for item in same]
        found.append(OptionCost(name, max(o.kept_bytes for o in mine), fmean(o.recompute_ms for o in mine),
                                max(o.recompute_peak_bytes for o in mine),
                                *(_most([getattr(o, field) for o in mine], field) for field in SPLIT_FIELDS),
                                host_bytes=max(o.host_bytes for o in mine),
                                **dict(zip(("input_grad_ms", "weight_grad_ms"), _kind_split_ms(mine, len(same)) or (None, None)))))
    return tuple(found)


def tied_sets(profile: Profile) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per layer, the tied sets it holds, as (parameters shared, holders): what the sum that keeps
    them tied moves (rules.tied_sum_ms charges it where the plan splits them). The copy each
    holding stage keeps is already in its param bytes: a layer's parameters are counted with the
    ones it shares."""
    held: dict[str, tuple[tuple[int, int], ...]] = {}
    for item in profile.tied:
        for name in item.layers:
            held[name] = (*held.get(name, ()), (item.param_count, len(item.layers)))
    return held


def _kind_numels(same: list) -> tuple[int, ...] | None:
    """A kind's trained tensors' elements (ZeRO 1's partition): its layers' largest set; None where one records none."""
    if any(item.trained_param_numels is None for item in same):
        return None
    return max((tuple(item.trained_param_numels) for item in same), key=lambda numels: (sum(numels), numels))


def _own_numels(numels: tuple[int, ...] | None, tied_before: list[int]) -> tuple[int, ...] | None:
    """`numels` less one tensor of each tied set's size an earlier layer holds (where it trains here)."""
    if numels is None:
        return None
    own = list(numels)
    for count in tied_before:
        if count in own:
            own.remove(count)
    return tuple(own)


def _last_trained_param_count(layer) -> int:
    """The layer's last trained parameter tensor's elements (gathered._gloo_bytes: its unsharded gradient FSDP2's
    foreach_reduce keeps past gloo's reduce-scatter wait, §839), as the profile records it; in a profile made before
    it was recorded (64c3c73a), its largest tensor, else all its parameters: bounds of it, as that gradient is one of
    the layer's tensors (issue 33: an untied embedding alone on its stage, whose one tensor is that gradient, was
    524,288 B under on such a profile, docs/published-runs.md §67.embedzero)."""
    if layer.last_trained_param_count is not None:
        return layer.last_trained_param_count
    return layer.largest_param_count if layer.largest_param_count is not None else layer.param_count
