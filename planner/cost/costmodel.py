"""THE cost model: memory and time of a pipeline plan, from a profile and a setup.

Pure functions, no I/O. Every term is one row of TERMS (below: what it is, which quantity it
adds to, whose numbers it reads, its source); stage_cost/evaluate(), the DP (dpsolve.Chain)
and the MILP's coefficients read the rows only, so every plan (the solvers', each
baseline's, every export's rounding) is scored alike and a new term is one row.

Per stage `s` of `P` with layers S (contiguous) and checkpointed C ⊆ S, `M`
microbatches, `k_s` in-flight microbatches (1F1B: min(P - s, M); GPipe: M):

    static_s     = Σ_S params · (w + g + o)                    bytes per parameter, ZeRO, offload
                   (routed experts under ep E: their 1/E, ZeRO over the dp / E expert-data-parallel ranks)
                   + ZeRO 1: o · max(0, max_S largest tensor - Σ_S params / K)   whole tensors per rank
    kept_s       = Σ_{S∖C} act + Σ_C input                      per microbatch
                   - input_in_act(first)                        the stage input lives in a buffer
                   + output(last)                               the stage output waits in fwd_cache
                   (+ loss_bytes on the last stage)
    buffers_s    = (M + 1) · input(first) [s > 0] + M · output(last) [s < P-1]   PipelineStage's recv
                   + M · batch_input [s = 0]             buffers, and the input gradient being sent
                   + M · batch_target [s = P-1]          the whole batch of targets
                   + FSDP2's for the layer it works on (ZeRO 2/3: gathered weights and
                     buffers, unsharded gradient; largest layer) + Σ_{S∖first} HSDP ZeRO 3's
                     reduced gradient shards
    transient_s  = max( max_{l∈S} (transient_l                       one layer's scratch, + its
                              + [l∈C]·(act_l - input_l)             recompute when checkpointed,
                              - Σ_{m>l} kept_m)⁺,                   net of what the layers after it
                        loss scratch [last stage] )                 do not hold then; the loss's is
                                                                    gone before any layer's backward
    scratch_s    = the optimizer step's temporaries (Adam: sqrt(v) as a new tensor; on cuda all
                   of the stage's parameters at once, on cpu two of the largest)
    peak_s       = static_s + max(k_s · kept_s + transient_s, scratch_s) + buffers_s
    cuda:          reserved_s = ⌈peak_s / (1 - f) / 2 MiB⌉ · 2 MiB, the caching allocator's segments at
                   fragmentation f; nccl_s = the communicators' buffers (planner/allocator.py). A stage
                   fits when reserved_s + nccl_s ≤ cap_s, which every solver reads as the allocated
                   peak_s ≤ limit_s (limit_bytes, its exact inverse); cpu: peak_s ≤ cap_s
    host_s       = Σ_S offloaded optimizer state + fp32 master + fp32 gradient (/ K)   ≤ host_mem / ranks a node
                   + k_s · Σ_{offloaded layers} host bytes per microbatch     activation offload
    time_s       = c · (Σ_S (fwd + bwd) + Σ_C recompute (+ loss on the last stage))   c: compute_scale
                   + Σ_{MoE layers} (4 + 2·[l∈C]) · a2a · (E-1)/E / bw_ep    ep E: the tokens' all-to-all
    comm_s       = send(output(last)) [s < P-1] + send(input(first)) [s > 0]      per microbatch: the
                   + 2 · action overhead                     output forward, its gradient back, each
                   send(bytes) = latency + bytes / bandwidth  send by its sender; one forward and one
                                                              backward action of the schedule
    step_s       = Σ_S optimizer step (once per iteration; ZeRO ≥ 1: / shard group; offload: copies
                   + host step) + gradient reduction + weight gathers   (planner/dataparallel.py)
    busy_s       = time_s + comm_s
    T_iter       = max(Σ_s busy_s + (M - 1) · max_s busy_s       the pipeline's critical path,
                         + max_s step_s,                          then the slowest step
                       h · (M · Σ_s busy_s + Σ_s step_s) / C)     C stages compute at once (C = P
                                                                  with a device each; fewer when
                                                                  ranks share CPU cores), h: cpu_sharing

Same-kind layers (structurally identical) share one set of numbers: times are the
kind's mean (averaging away timing noise), bytes the kind's maximum. Measured
refinements over DESIGN.md's version 1, each from a run that disagreed: the
receive buffers PipelineStage allocates for every microbatch, the stage output kept
per in-flight microbatch, the stage input shared with a buffer (received, or a slice
of the batch), the input gradient held by its send, the whole target batch on the
last stage, the recompute extra net of what the stage's later layers already freed,
the loss's scratch (which never meets a recompute), a layer's transient net of the
later layers' kept bytes too (the embedding's weight gradient at the end of stage 0's
backward meets only the other microbatches' activations), the optimizer step's
scratch (the peak of a stage with a large embedding and few activations), the capacity bound when
ranks share cores, the optimizer step, and the recompute as measured (less than a
whole forward: non-reentrant checkpointing stops recomputing once the last saved
tensor is back).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from statistics import fmean

from planner.cost import allocator, dataparallel, schedules
from planner.schema import (
    CHUNKED_SCHEDULES,
    OPTION_FULL,
    OPTION_NONE,
    OPTION_OFFLOAD,
    SPLIT_BACKWARD_SCHEDULES,
    Profile,
    StagePlan,
    StagePredicted,
    TrainSetup,
    runs_split_backward,
)

# A plan fits when every stage's peak stays this far below its cap. 4 KiB is nothing next
# to a device, and it absorbs the MILP solver's feasibility tolerance (~1e-7 GiB per row),
# so the solver, the baselines and any brute force agree on what fits.
FIT_MARGIN_BYTES = 4096

# (weights, grads, optimizer state) bytes per parameter before sharding.
_BYTES_PER_PARAM = dataparallel.BYTES_PER_PARAM


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
    host_bytes: int = 0  # offload: what it keeps in host memory per microbatch until its backward


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
    largest_param_count: int = 0  # its largest parameter tensor; 0: not known
    recompute_ms: float | None = None  # None: not measured, a whole forward
    tied_ms: float = 0.0  # summing the gradients of parameters it shares with other layers, per iteration
    extra_options: tuple[OptionCost, ...] = ()  # selective options, after none and full
    expert_param_count: int = 0  # of param_count, the routed experts' (expert parallelism splits them)
    a2a_bytes: int = 0  # a MoE block's token dispatch per microbatch (the all-to-all term)
    # none's and full's split backward bytes: (held, input peak, weight peak)
    split_bytes: tuple[tuple[int, int, int], tuple[int, int, int]] = ((0, 0, 0), (0, 0, 0))
    expert_transient_bytes: int = 0  # of transient_bytes, the routed experts' weight gradients' (ep divides it)

    @cached_property
    def options(self) -> tuple[OptionCost, ...]:
        none_split, full_split = self.split_bytes
        return (OptionCost(OPTION_NONE, self.act_bytes, 0.0, 0, *none_split),
                OptionCost(OPTION_FULL, self.input_bytes, self.recompute_ms, self.recompute_peak_bytes, *full_split),
                *self.extra_options)

    def option_index(self, name: str) -> int:
        for index, option in enumerate(self.options):
            if option.name == name:
                return index
        raise ValueError(f"layer {self.name} has no recompute option {name!r}")

    @property
    def recompute_saving_bytes(self) -> int:
        """Bytes per microbatch that checkpointing this layer frees."""
        return self.act_bytes - self.input_bytes

    @property
    def recompute_peak_bytes(self) -> int:
        """Extra bytes while this checkpointed layer is recomputed in backward."""
        return max(self.act_bytes - self.input_bytes, 0)


@dataclass(frozen=True)
class StageCost:
    static_bytes: int
    kept_bytes: int  # per in-flight microbatch
    in_flight: int
    activation_bytes: int
    buffer_bytes: int
    transient_bytes: int
    peak_bytes: int
    time_ms: float
    cap_bytes: int
    step_ms: float = 0.0
    step_scratch_bytes: int = 0  # the optimizer step's temporaries (activations are gone by then)
    comm_ms: float = 0.0  # per microbatch: the stage's sends and its schedule actions
    host_bytes: int = 0  # host memory this rank takes (the offloaded optimizer, offloaded activations)
    host_cap_bytes: int | None = None  # this rank's share of its node's host memory; None: not capped
    # cuda: the allocated peak the cap admits once the allocator's reserve and the communication
    # buffers are taken (limit_bytes); the reserved peak and those buffers. cpu: the cap, the peak, 0
    limit_bytes: int | None = None  # None: the cap
    reserved_bytes: int | None = None  # None: the peak
    workspace_bytes: int = 0
    weight_grad_bytes: int = 0  # per microbatch between a split backward's input and weight passes
    weight_pass_peak_bytes: int = 0  # a split backward's weight pass, over what is live before it
    input_pass_peak_bytes: int = 0  # a split backward's input pass, over what is live before it

    @property
    def busy_ms(self) -> float:
        """Per microbatch on the pipeline's critical path: compute, sends and actions."""
        return self.time_ms + self.comm_ms

    @property
    def allocated_limit_bytes(self) -> int:
        return self.cap_bytes if self.limit_bytes is None else self.limit_bytes

    @property
    def pressure(self) -> float:
        """(peak + margin) / the allocated peak the cap admits: at most 1 when the stage fits."""
        limit = self.allocated_limit_bytes
        return (self.peak_bytes + FIT_MARGIN_BYTES) / limit if limit > 0 else float("inf")

    @property
    def device_need_bytes(self) -> int:
        """What the device must have for this stage: the reserved peak (with the margin) and the
        communication buffers on cuda, the peak and the margin on cpu."""
        reserved = self.peak_bytes if self.reserved_bytes is None else self.reserved_bytes
        return reserved + self.workspace_bytes + FIT_MARGIN_BYTES

    @property
    def fits_device(self) -> bool:
        return self.peak_bytes + FIT_MARGIN_BYTES <= self.allocated_limit_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_cap_bytes is None or self.host_bytes + FIT_MARGIN_BYTES <= self.host_cap_bytes

    @property
    def fits(self) -> bool:
        return self.fits_device and self.fits_host

    def predicted(self) -> StagePredicted:
        return StagePredicted(
            reserved_bytes=self.reserved_bytes,
            workspace_bytes=self.workspace_bytes,
            peak_bytes=self.peak_bytes,
            static_bytes=self.static_bytes,
            activation_bytes=self.activation_bytes,
            buffer_bytes=self.buffer_bytes,
            transient_bytes=self.transient_bytes,
            time_ms=self.time_ms,
            step_ms=self.step_ms,
            comm_ms=self.comm_ms,
            host_bytes=self.host_bytes,
            host_cap_bytes=self.host_cap_bytes,
        )


@dataclass(frozen=True)
class PlanCost:
    stages: list[StageCost]
    iteration_ms: float

    @property
    def feasible(self) -> bool:
        return all(stage.fits for stage in self.stages)

    @property
    def peak_bytes_per_stage(self) -> list[int]:
        return [stage.peak_bytes for stage in self.stages]


# ---------------------------------------------------------------- per-layer terms


_LAYER_COSTS: dict[int, tuple] = {}  # id(profile) -> (a weak reference to it, its parts' ids, its layer costs)


def layer_costs(profile: Profile) -> list[LayerCost]:
    """Kind-normalised layer numbers: mean times, maximum bytes within a kind. Remembered per
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


def _layer_costs(profile: Profile) -> list[LayerCost]:
    by_kind: dict[str, list] = {}
    for layer in profile.layers:
        by_kind.setdefault(layer.kind, []).append(layer)
    per_kind = {
        kind: dict(
            fwd_ms=fmean(item.fwd_ms for item in same),
            bwd_ms=fmean(item.bwd_ms for item in same),
            act_bytes=max(item.act_bytes for item in same),
            input_bytes=max(item.input_bytes for item in same),
            output_bytes=max(item.output_bytes for item in same),
            input_in_act_bytes=min(item.input_in_act_bytes for item in same),
            param_count=max(item.param_count for item in same),
            expert_param_count=max(item.expert_param_count for item in same),
            a2a_bytes=max(item.a2a_bytes for item in same),
            split_bytes=tuple(_kind_split(same, index) for index in (0, 1)),
            expert_transient_bytes=max(item.expert_transient_bytes for item in same),
            largest_param_count=max(item.largest_param_count or 0 for item in same),
            transient_bytes=max(item.transient_bytes for item in same),
            recompute_ms=(None if any(item.recompute_ms is None for item in same)
                          else fmean(item.recompute_ms for item in same)),
            step_ms=tuple(sorted(
                (name, fmean(item.step_ms.get(name, 0.0) for item in same))
                for name in {name for item in same for name in item.step_ms}
            )),
            extra_options=_kind_options(same),
        )
        for kind, same in by_kind.items()
    }
    tied = tied_ms(profile)
    return [LayerCost(name=layer.name, kind=layer.kind, **per_kind[layer.kind], tied_ms=tied.get(layer.name, 0.0))
            for layer in profile.layers]


def _kind_split(same: list, index: int) -> tuple[int, int, int]:
    """A kind's split-backward bytes of option `index` (0 none, 1 full): the most of any layer."""
    listed = [item.recompute_options[index] for item in same if len(item.recompute_options) > index]
    return tuple(max((getattr(o, field) for o in listed), default=0) for field in SPLIT_FIELDS)


SPLIT_FIELDS = ("split_held_bytes", "split_input_peak_bytes", "split_peak_bytes")


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
                                *(max(getattr(o, field) for o in mine) for field in SPLIT_FIELDS),
                                host_bytes=max(o.host_bytes for o in mine)))
    return tuple(found)


def tied_ms(profile: Profile) -> dict[str, float]:
    """Per layer, the gradient sums that keep its shared parameters tied, once per
    iteration before the optimizer step. Charged to every holder wherever the plan puts
    it (on one stage there is nothing to sum: a small over-charge that keeps the term per
    layer, as the solver needs it). The copy each holding stage keeps is already in its
    param bytes: a layer's parameters are counted with the ones it shares."""
    charged: dict[str, float] = {}
    for item in profile.tied:
        for name in item.layers:
            charged[name] = charged.get(name, 0.0) + item.sum_ms
    return charged


def bytes_per_param(setup: TrainSetup) -> float:
    """Weights + grads + optimizer state per parameter on one device, after ZeRO (over the
    shard group) and offload (planner/dataparallel.py)."""
    return dataparallel.bytes_per_param(setup)


def in_flight(setup: TrainSetup, stage: int) -> int:
    """Microbatches whose activations stage `stage` holds at its peak."""
    if setup.pipeline.schedule == "GPipe":
        return setup.pipeline.microbatches
    return min(setup.pipeline.stages - stage, setup.pipeline.microbatches)


def static_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """Weights, gradients and optimizer state of the layer on one rank: its dense parameters at
    the setup's bytes per parameter; under expert parallelism its 1/E of the routed experts' at
    those of their expert-data-parallel group (ZeRO over dp / E ranks, dataparallel.expert_setup)."""
    return per_param_bytes(layer, setup, dataparallel.bytes_per_param)


def per_param_bytes(layer: LayerCost, setup: TrainSetup, per_param: Callable[[TrainSetup], float]) -> float:
    """Σ over the layer's parameters of `per_param` bytes (a dataparallel function of the
    setup): the dense ones with the setup, the rank's 1/E of the routed experts with their
    expert-data-parallel group's."""
    if not layer.expert_param_count:
        return layer.param_count * per_param(setup)
    dense = layer.param_count - layer.expert_param_count
    held = dataparallel.held_expert_params(layer.expert_param_count, setup)
    return dense * per_param(setup) + held * per_param(dataparallel.expert_setup(setup))


def all_to_all_ms(layer: LayerCost, option: int, setup: TrainSetup) -> float:
    """A MoE block's token all-to-all per microbatch under expert parallelism E: the dispatch
    before the experts and the combine after them in forward, both again (their gradients) in
    backward, and the forward's two once more when the option recomputes the whole layer; each
    a2a_bytes · (E-1)/E over the expert-parallel group's link (dataparallel.all_to_all_ms). On the
    critical path: the experts wait for their tokens, and Megatron-LM hides the all-to-all only
    with its 1F1B A2A overlap (--overlap-moe-expert-parallel-comm, off by default), torchtitan
    not at all. 0 without ep, for a dense layer, and where the link is not known."""
    ep = setup.data_parallel.ep
    if ep == 1 or not layer.a2a_bytes:
        return 0.0
    count = 4 + 2 * (option == 1)
    return count * dataparallel.all_to_all_ms(layer.a2a_bytes, ep, setup.data_parallel.ep_gb_per_s)


def tied_once_bytes(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """A tied parameter whose holders all share a stage exists there once, while each holder's
    param bytes count it: minus the copies beyond the first. Known from the stage's position
    only on a single-stage pipeline, where every holder is on stage 0. With more stages each
    holder is charged a copy: exact for the sets that hold the first and the last layer (the
    token embedding and the LM head, always split), over by the copies for a set whose holders
    share an inner stage (a cost that can only over-state memory)."""
    if setup.pipeline.stages != 1:
        return 0.0
    copies = sum((len(item.layers) - 1) * item.param_count for item in profile.tied)
    return -copies * bytes_per_param(setup)


def input_pass_peak_bytes(layers: Sequence[tuple[float, float]]) -> float:
    """A stage's split-backward input pass over what is live before it, from each layer's (input
    peak, what it leaves for the weight pass) in stage order: the pass runs the layers last to
    first, each on top of what the later ones left."""
    peak, left = 0.0, 0.0
    for input_peak, held in reversed(layers):
        peak = max(peak, left + input_peak)
        left += held
    return peak


def rank_tied_once_bytes(profile: Profile, layers: set[str], setup: TrainSetup) -> float:
    """A chunked schedule's rank holds a tied parameter once however many of its chunks hold it
    (a V puts the token embedding and the LM head on rank 0; one module, one nn.Parameter):
    minus the copies its chunks were charged beyond the first."""
    copies = sum(max(0, len(set(item.layers) & layers) - 1) * item.param_count for item in profile.tied)
    return -copies * bytes_per_param(setup)


def reduced_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """HSDP's ZeRO 3: the reduced gradient shard FSDP2 keeps for this layer through the rest of
    the stage's backward (dataparallel.reduced_bytes_per_param). Charged for every layer, with
    the buffers; the stage's first layer takes its own back (first_layer_buffer_bytes): the
    most are held while it computes, one for each layer after it."""
    return per_param_bytes(layer, setup, dataparallel.reduced_bytes_per_param)


def kept_bytes(layer: LayerCost, option: int) -> int:
    """Bytes per microbatch this layer keeps until its backward under option `option` (False:
    none, its activations; True: full, its input)."""
    if option < 2:  # the hot path: plans of whole layers
        return layer.input_bytes if option else layer.act_bytes
    return layer.options[option].kept_bytes


# Runtimes whose checkpointing reruns a layer's whole forward: Megatron-LM's own
# CheckpointFunction and DeepSpeed's (reentrant), Hugging Face's gradient_checkpointing
# (reentrant by default: ColossalAI's path), and torchtitan, whose checkpoint wrapper turns
# early stopping off (early_stop=False, torchtitan/distributed/activation_checkpoint.py).
# ckplan's runtime calls torch.utils.checkpoint without reentry and with torch's default early
# stop: it reruns ops only until the last tensor the backward needs is back.
WHOLE_FORWARD_RECOMPUTE = ("megatron", "deepspeed", "colossalai", "torchtitan")


def recompute_ms(layer: LayerCost, setup: TrainSetup | None = None) -> float:
    """What checkpointing adds to the layer's backward: the profile's recompute (measured, or
    from FLOPs), which stops once the last saved tensor is back; a whole forward where it was
    not measured, or where the setup's runtime reruns whole forwards."""
    whole = setup is not None and setup.training.runtime in WHOLE_FORWARD_RECOMPUTE
    return layer.fwd_ms if layer.recompute_ms is None or whole else layer.recompute_ms


def option_recompute_ms(layer: LayerCost, option: int, setup: TrainSetup | None = None) -> float:
    """What option `option` adds to the layer's backward: nothing for none, recompute_ms for
    full, the option's own (measured, or from its FLOPs) for a selective one."""
    if option == 0:
        return 0.0
    if option == 1:
        return recompute_ms(layer, setup)
    return layer.options[option].recompute_ms


def layer_time_ms(layer: LayerCost, option: int, setup: TrainSetup | None = None) -> float:
    """Forward + backward, plus what the option recomputes."""
    return layer.fwd_ms + layer.bwd_ms + option_recompute_ms(layer, option, setup)


def compute_ms(time_ms: float, setup: TrainSetup) -> float:
    """A profiled compute time as the run will take it: times the calibrated compute scale
    (the launch's threads against the profile's, ranks sharing cores; 1 uncalibrated)."""
    return time_ms * setup.time.compute_scale


def send_ms(num_bytes: int, setup: TrainSetup) -> float:
    """One point-to-point send: latency + bytes / bandwidth (calibrated; 0 uncalibrated)."""
    if setup.time.send_gb_per_s is None:
        return setup.time.send_latency_ms
    return setup.time.send_latency_ms + num_bytes / (setup.time.send_gb_per_s * 1e6)


def first_layer_comm_ms(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """Per microbatch, a stage past the first sends its input's gradient back."""
    return send_ms(layer.input_bytes, setup) if stage > 0 else 0.0


def last_layer_comm_ms(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """Per microbatch, a stage before the last sends its output forward."""
    return send_ms(layer.output_bytes, setup) if stage < setup.pipeline.stages - 1 else 0.0


def stage_constant_comm_ms(stage: int, setup: TrainSetup) -> float:
    """Per microbatch every stage runs two schedule actions (forward, backward)."""
    return 2 * setup.time.action_overhead_ms


def layer_step_ms(layer: LayerCost, setup: TrainSetup) -> float:
    """What this layer costs once per iteration: the setup's optimizer step over its
    parameters (ZeRO ≥ 1: the rank's 1/shard-group of them; offload: copies and the host
    step) and data parallelism's gradient reduction and weight gathers
    (dataparallel.step_term_ms); the step is 0 when the profile has no step time for that
    optimizer. Plus the sums that keep its tied parameters tied, which run as part of the step."""
    step = dict(layer.step_ms).get(setup.training.optimizer, 0.0)
    return dataparallel.step_term_ms(layer.param_count, step, setup, fwd_ms=compute_ms(layer.fwd_ms, setup),
                                     bwd_ms=compute_ms(layer.bwd_ms, setup),
                                     expert_count=layer.expert_param_count) + layer.tied_ms


# What each runtime's 1F1B pipeline holds besides the layers' own saved tensors (read from
# their code):
# - ckplan's runtime and torchtitan run torch.distributed.pipelining: one receive buffer per
#   microbatch for the stage input (the first layer's saved input is that buffer) and for the
#   output's gradient, each output kept in fwd_cache to its backward, the whole batch held.
# - Megatron-LM (megatron/core/pipeline_parallel/schedules.py) receives each input as a fresh
#   tensor the first layer saves, frees each output's storage once sent (deallocate_output_tensor;
#   its training sets deallocate_pipeline_outputs = True), takes one gradient at a time, and
#   fetches one microbatch of data per forward.
# - ColossalAI (colossalai/pipeline/schedule/one_f_one_b.py, 0.5): the received input is the
#   forward's input, outputs are kept in output_objs to their backward, one gradient at a time,
#   and load_batch holds the whole batch on every stage.
# - DeepSpeed (deepspeed/runtime/pipe/engine.py, 0.19): max(2, min(P - s, M)) pipe buffers, each
#   holding a received input (a clone of the one receive buffer) whose clone the forward saves,
#   outputs kept to their backward, one gradient buffer, microbatches loaded into the buffers.


def _runtime(setup: TrainSetup) -> str:
    return setup.training.runtime


def deepspeed_buffers(stage: int, setup: TrainSetup) -> int:
    """DeepSpeed's TrainSchedule.num_pipe_buffers."""
    return max(2, min(setup.pipeline.stages - stage, setup.pipeline.microbatches))


def first_layer_kept_bytes(layer: LayerCost, setup: TrainSetup) -> int:
    """Correction to kept bytes for the layer that opens a stage: under torch's pipelining its
    input is a receive buffer (past stage 0) or a slice of the whole batch the schedule holds
    (stage 0), both counted in buffers, so the layer's saved copy of it is not kept twice. The
    frameworks' own pipelines hand the layer a tensor of its own, kept as the layer's."""
    return -layer.input_in_act_bytes if _runtime(setup) in ("ckplan", "torchtitan") else 0


def last_layer_kept_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> int:
    """The stage output waits until its backward (fwd_cache, output_objs, DeepSpeed's buffers);
    Megatron frees its storage once sent (the last stage's output, the logits, stays for the loss)."""
    if _runtime(setup) == "megatron" and stage < setup.pipeline.stages - 1:
        return 0
    return layer.output_bytes


def first_layer_buffer_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> float:
    """What holds the stage input besides the first layer (none on stage 0): torch's pipelining
    one receive buffer per microbatch plus the input's gradient being sent; Megatron-LM and
    ColossalAI only that gradient; DeepSpeed its pipe buffers and the receive buffer."""
    if stage == 0:
        return 0
    runtime = _runtime(setup)
    if runtime in ("megatron", "colossalai"):
        copies = 1
    elif runtime == "deepspeed":
        copies = deepspeed_buffers(stage, setup) + 1
    else:
        copies = setup.pipeline.microbatches + 1
    return copies * layer.input_bytes


def first_layer_reduced_back_bytes(layer: LayerCost, setup: TrainSetup) -> float:
    """The stage's first layer's own reduced gradient shard (reduced_bytes), charged with every
    layer's, is not yet made while that layer computes, when the most are held: taken back."""
    return -reduced_bytes(layer, setup)


def last_layer_buffer_bytes(layer: LayerCost, stage: int, setup: TrainSetup) -> int:
    """Receive buffers for the gradient of the stage output (none on the last stage): one per
    microbatch under torch's pipelining; the frameworks take one gradient at a time."""
    if stage == setup.pipeline.stages - 1:
        return 0
    return (setup.pipeline.microbatches if _runtime(setup) in ("ckplan", "torchtitan") else 1) * layer.output_bytes


def batch_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """The data the schedule holds: torch's pipelining the whole batch, inputs on the first stage
    and targets on the last; Megatron-LM one microbatch per forward (the inputs are the first
    layer's, the targets of those in flight stay); ColossalAI the whole batch on every stage;
    DeepSpeed a microbatch per pipe buffer."""
    first, last = stage == 0, stage == setup.pipeline.stages - 1
    inputs, targets = profile.batch_input_bytes, profile.batch_target_bytes
    runtime = _runtime(setup)
    if runtime == "megatron":
        return in_flight(setup, stage) * targets * last
    if runtime == "colossalai":
        return setup.pipeline.microbatches * (inputs + targets)
    held = deepspeed_buffers(stage, setup) if runtime == "deepspeed" else setup.pipeline.microbatches
    return held * (inputs * first + targets * last)


def loss_kept_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """What the loss keeps for backward, per microbatch, on the last stage."""
    return profile.loss_bytes if stage == setup.pipeline.stages - 1 else 0


def unsharded_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """ZeRO 3's gathered weights in flight and ZeRO 2/3's one unsharded gradient, for the
    model's largest layer (dataparallel.unsharded_bytes): counted with the buffers, a
    constant per stage."""
    ep = setup.data_parallel.ep  # under expert parallelism a layer holds 1/E of its routed experts
    largest = max(layer.param_count - layer.expert_param_count + layer.expert_param_count // ep
                  for layer in profile.layers)
    return int(round(dataparallel.unsharded_bytes(largest, setup)))


def stage_constant_transient_bytes(profile: Profile, stage: int, setup: TrainSetup) -> int:
    """The loss's scratch (e.g. cross-entropy's gradients) on the last stage. An analytic
    profile's is the logits' fp32 gradient; Megatron-LM's vocab-parallel cross-entropy writes
    that gradient into the fp32 softmax it saved (in place: megatron/core/tensor_parallel/
    cross_entropy.py), so only its cast back to the logits' dtype is new."""
    if stage != setup.pipeline.stages - 1:
        return 0
    if setup.training.runtime == "megatron" and profile.source == "analytic":
        from planner.profiler.analytic import DTYPE_BYTES

        return profile.loss_transient_bytes * DTYPE_BYTES.get(profile.dtype, 4) // 4
    return profile.loss_transient_bytes


def stage_constant_ms(profile: Profile, stage: int, setup: TrainSetup) -> float:
    """The loss's forward + backward on the last stage (scaled like the layers' compute)."""
    return compute_ms(profile.loss_ms, setup) if stage == setup.pipeline.stages - 1 else 0.0


def parallel_stages(setup: TrainSetup) -> int:
    return min(setup.pipeline.stages, setup.pipeline.parallel_stages or setup.pipeline.stages)


def iteration_ms(stage_times_ms: Sequence[float], setup: TrainSetup, step_ms: Sequence[float] = ()) -> float:
    """From each stage's busy time per microbatch (compute + comm): the pipeline's
    critical path — fill and drain (every stage once) plus M - 1 steady
    steps of the slowest stage, then the slowest optimizer step (a bound: stages past
    the first finish their backward earlier, during the drain) — or, when fewer stages
    than there are can compute at once (ranks sharing CPU cores), all the work spread
    over those that can, if that is longer."""
    return pipeline_ms(sum(stage_times_ms), max(stage_times_ms), max(step_ms, default=0.0), sum(step_ms), setup)


def pipeline_ms(total_ms: float, slowest_ms: float, slowest_step_ms: float, total_step_ms: float,
                setup: TrainSetup) -> float:
    """iteration_ms from the stages' sums and maxima (busy time per microbatch, optimizer
    steps), the form the DP solver keeps them in while it grows a plan."""
    pipeline = total_ms + (setup.pipeline.microbatches - 1) * slowest_ms + slowest_step_ms
    return max(pipeline, capacity_ms(total_ms, total_step_ms, setup))


def capacity_ms(total_stage_ms: float, total_step_ms: float, setup: TrainSetup) -> float:
    """All the work spread over the stages that compute at once, times cpu_sharing (what
    sharing cores costs beyond its share, calibrated; 1 uncalibrated): a bound only when
    fewer compute at once than there are stages."""
    if parallel_stages(setup) >= setup.pipeline.stages:
        return 0.0
    work = setup.pipeline.microbatches * total_stage_ms + total_step_ms
    return setup.time.cpu_sharing * work / parallel_stages(setup)


def bottleneck_bound_ms(profile: Profile, setup: TrainSetup, feasible_iteration_ms: float) -> float:
    """No stage of an optimal plan is slower than this, given any feasible plan's iteration
    time: T_iter ≥ Σ_s time_s + (M - 1)·τ + max_s step_s, Σ_s time_s is at least every
    layer's fwd + bwd (+ loss) and the slowest step at least the mean one, so
    (M - 1)·τ* ≤ T_feasible - those two."""
    if setup.pipeline.microbatches == 1:
        return float("inf")
    layers = layer_costs(profile)
    base = compute_ms(sum(layer_time_ms(layer, False) for layer in layers), setup)
    ctx = Context(profile, setup)
    base += sum(stage_value(quantity, s, ctx) for s in range(setup.pipeline.stages) for quantity in ("time", "comm"))
    base += sum(layer_step_ms(layer, setup) for layer in layers) / setup.pipeline.stages
    return (feasible_iteration_ms - base) / (setup.pipeline.microbatches - 1) * (1 + 1e-9) + 1e-9


# ---------------------------------------------------------------- the description
#
# Every term the cost model charges a stage, one row each. The solvers and evaluate() read
# the rows only through layer_value / edge_value / stage_value (summed by quantity), so a
# new term of a known quantity is one row here and its test; each quantity enters a
# stage's cost one way (stage_cost, dpsolve's segments, milp's rows):
#   static, buffers  bytes held all iteration                      added up
#   kept             bytes per microbatch until its backward        x in-flight microbatches
#   extra            a layer's peak beyond what it keeps            max over layers, net of what
#                                                                   the layers after it keep; at
#                                                                   least the stage's own
#   scratch          the optimizer step's temporaries               cuda: added up; cpu: 2 x largest
#   host             host bytes of the rank                         added up, against the rank's
#                                                                   share of its node's host memory
#   offloaded        host bytes per microbatch until its backward   x in-flight microbatches, into host
#   time, comm       ms per microbatch (compute; sends, actions)   added up (busy = time + comm)
#   step             ms once per iteration                          added up
# `where` says whose numbers a row reads: each layer of the stage (with its checkpoint
# choice), the layer that opens or closes the stage (with the stage's index), or the stage's
# position alone.

@dataclass(frozen=True)
class Quantity:
    """One quantity a term adds to, and how a stage's values of it combine (one of COMBINE):
    the stage accumulator (stage_cost), the DP's chain and the MILP's rows all read `combine`,
    so a quantity that combines as an existing one does is one declaration here, no solver edit."""

    name: str
    combine: str
    meaning: str


# How each kind of quantity enters a stage's cost, and what the solvers may prune by (every
# kind grows with each layer a stage takes, none falls: the DP's Pareto fronts and the MILP's
# windows rest on that):
COMBINE = {
    "held": "bytes held all iteration: added up, into the peak as they are",
    "kept": "bytes per microbatch until its backward: added up, times the in-flight microbatches",
    "extra": "a layer's peak beyond what it keeps: the largest, net of what the layers after it keep",
    "scratch": "the optimizer step's temporaries: cuda added up, cpu twice the largest",
    "host": "host bytes of the rank: added up, against its share of its node's host memory",
    "offloaded": "host bytes per microbatch: added up, times the in-flight microbatches, into host",
    "busy": "ms per microbatch on the critical path: added up",
    "step": "ms once per iteration: added up",
    "split": "a split backward's bytes per pass (chunked zero-bubble schedules): see schedules.ChunkBytes",
}

QUANTITY_DECLARATIONS: tuple[Quantity, ...] = (
    Quantity("static", "held", "weights, gradients, optimizer state"),
    Quantity("buffers", "held", "receive buffers, the batch, FSDP2's gathered tensors"),
    Quantity("kept", "kept", "activations kept for backward"),
    Quantity("extra", "extra", "a layer's scratch and what its option recomputes at once"),
    Quantity("scratch", "scratch", "the optimizer step's temporaries"),
    Quantity("host", "host", "the offloaded optimizer on the host"),
    Quantity("offloaded", "offloaded", "activations offloaded to the host"),
    Quantity("time", "busy", "compute per microbatch"),
    Quantity("comm", "busy", "sends and schedule actions per microbatch"),
    Quantity("step", "step", "optimizer step, gradient reduction, weight gathers"),
    Quantity("wgrad", "split", "what a split backward's input pass leaves for its weight pass"),
    Quantity("ipeak", "split", "a split backward's input pass over what is live before it"),
    Quantity("wpeak", "split", "a split backward's weight pass over what is live before it"),
)
QUANTITIES = tuple(q.name for q in QUANTITY_DECLARATIONS)


def quantities(combine: str) -> tuple[str, ...]:
    """The declared quantities that combine as `combine` (read when asked: a declaration added
    later is seen by every solver)."""
    return tuple(q.name for q in QUANTITY_DECLARATIONS if q.combine == combine)


@dataclass(frozen=True)
class Context:
    """What a term may read besides its layer and stage."""

    profile: Profile
    setup: TrainSetup
    split_backward: bool = False  # one stage of a chunked schedule that splits its backward (setup is the stage's)
    chunked: bool = False  # one stage of a chunked schedule (setup is the stage's)

    @property
    def device_type(self) -> str:
        return self.profile.device.type


@dataclass(frozen=True)
class Term:
    name: str
    quantity: str  # one of QUANTITIES
    where: str  # "layer": value(layer, option, ctx); "open"/"close": value(layer, stage, ctx);
    #             "stage": value(stage, ctx)
    value: Callable
    source: str  # the measurement or publication that put it here


TERMS: tuple[Term, ...] = (
    # -- every layer of the stage
    Term("weights, gradients, optimizer state", "static", "layer",
         lambda layer, ckpt, ctx: static_bytes(layer, ctx.setup),
         "bytes per parameter by precision and optimizer, ZeRO and offload (dataparallel.bytes_per_param)"),
    Term("HSDP ZeRO 3's reduced gradient shards", "buffers", "layer",
         lambda layer, ckpt, ctx: reduced_bytes(layer, ctx.setup),
         "FSDP2 keeps each layer's reduce-scatter output until the backward ends (bench_dp_static.py)"),
    Term("activations kept for backward", "kept", "layer",
         lambda layer, ckpt, ctx: kept_bytes(layer, ckpt),
         "saved-tensor hooks per layer and recompute option (profiler); a checkpointed layer keeps its input"),
    Term("what a split backward's input pass leaves for its weight pass", "wgrad", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_held_bytes,
         "live bytes after torch's stage_backward_input beyond the kept ones, per option (profiler)"),
    Term("a split backward's input pass over what is live before it", "ipeak", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_input_peak_bytes,
         "peak of torch's stage_backward_input, per option (profiler)"),
    Term("a split backward's weight pass over what is live before it", "wpeak", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].split_peak_bytes,
         "peak of torch's stage_backward_weight, per option (profiler): it recomputes checkpointed regions again"),
    Term("scratch, and what the option recomputes at once", "extra", "layer",
         lambda layer, ckpt, ctx: layer_extra_bytes(layer, ckpt) - expert_parallel_transient_back(layer, ctx.setup),
         "allocator peak per layer beyond what it keeps (profiler); a rank's routed experts' weight-gradient "
         "temporaries are as large as the experts it holds (measured on the runtime with --ep)"),
    Term("optimizer step temporaries", "scratch", "layer",
         lambda layer, ckpt, ctx: layer_step_scratch_bytes(layer, ctx.setup, ctx.device_type),
         "Adam's sqrt(v) as a new tensor (torch.optim.Adam; measured on the runtime)"),
    Term("offloaded optimizer state, master and gradient on the host", "host", "layer",
         lambda layer, ckpt, ctx: per_param_bytes(layer, ctx.setup, dataparallel.host_bytes_per_param),
         "the runtime's offload (runtime/offload.py): optimizer state, fp32 master, fp32 gradient"),
    Term("activations offloaded to the host", "offloaded", "layer",
         lambda layer, ckpt, ctx: layer.options[int(ckpt)].host_bytes,
         "saved-tensor hooks under recompute.offloaded_activations: the bytes it copies out (profiler); "
         "analytic: a block's saved bytes less its input"),
    Term("forward, backward, recompute", "time", "layer",
         lambda layer, ckpt, ctx: compute_ms(layer_time_ms(layer, ckpt, ctx.setup), ctx.setup),
         "timed per layer (profiler), times the calibrated compute scale"),
    Term("the tokens' all-to-all of a MoE block under expert parallelism", "time", "layer",
         lambda layer, ckpt, ctx: all_to_all_ms(layer, ckpt, ctx.setup),
         "dispatch + combine, forward and backward (Megatron-LM's alltoall token dispatcher, torchtitan's "
         "MoE): routed token copies x hidden x dtype bytes x (E-1)/E over the expert-parallel link"),
    Term("optimizer step, gradient reduction, weight gathers, tied sums", "step", "layer",
         lambda layer, ckpt, ctx: layer_step_ms(layer, ctx.setup),
         "timed step per layer (profiler); ring collectives over the links (dataparallel.step_term_ms)"),
    # -- the layer that opens the stage
    Term("stage input shared with its receive buffer or batch slice", "kept", "open",
         lambda layer, stage, ctx: first_layer_kept_bytes(layer, ctx.setup),
         "PipelineStage's receive buffers hold the input the first layer saves (measured on the runtime)"),
    Term("receive buffers for the input, and its gradient being sent", "buffers", "open",
         lambda layer, stage, ctx: first_layer_buffer_bytes(layer, stage, ctx.setup),
         "PipelineStage allocates one receive buffer per microbatch (measured on the runtime)"),
    Term("first layer's reduced gradient shard, not yet made", "buffers", "open",
         lambda layer, stage, ctx: first_layer_reduced_back_bytes(layer, ctx.setup),
         "FSDP2 under HSDP ZeRO 3 (bench_dp_static.py)"),
    Term("input gradient sent back", "comm", "open",
         lambda layer, stage, ctx: first_layer_comm_ms(layer, stage, ctx.setup),
         "calibrated send line: latency + bytes / bandwidth (ckplan calibrate)"),
    # -- the layer that closes the stage
    Term("stage output waiting in fwd_cache", "kept", "close",
         lambda layer, stage, ctx: last_layer_kept_bytes(layer, stage, ctx.setup),
         "PipelineStage keeps each forward's output until its backward (measured on the runtime)"),
    Term("receive buffers for the output's gradient", "buffers", "close",
         lambda layer, stage, ctx: last_layer_buffer_bytes(layer, stage, ctx.setup),
         "PipelineStage allocates one per microbatch (measured on the runtime)"),
    Term("output sent forward", "comm", "close",
         lambda layer, stage, ctx: last_layer_comm_ms(layer, stage, ctx.setup),
         "calibrated send line (ckplan calibrate)"),
    # -- the stage's position
    Term("what the loss keeps", "kept", "stage",
         lambda stage, ctx: loss_kept_bytes(ctx.profile, stage, ctx.setup), "saved-tensor hooks on the loss (profiler)"),
    Term("tied parameters held once where all their holders share the stage", "static", "stage",
         lambda stage, ctx: tied_once_bytes(ctx.profile, stage, ctx.setup),
         "one nn.Parameter in one process (planner/tied.py); a Qwen2.5 config counted its embedding twice"),
    Term("the whole batch of inputs or targets", "buffers", "stage",
         lambda stage, ctx: batch_bytes(ctx.profile, stage, ctx.setup),
         "the schedule splits the whole batch it holds (measured on the runtime)"),
    Term("FSDP2's gathered weights and unsharded gradient of the largest layer", "buffers", "stage",
         lambda stage, ctx: unsharded_bytes(ctx.profile, stage, ctx.setup),
         "live tensors at the measured peak under ZeRO 2/3 (dataparallel.unsharded_bytes)"),
    Term("the loss's scratch", "extra", "stage",
         lambda stage, ctx: stage_constant_transient_bytes(ctx.profile, stage, ctx.setup),
         "allocator peak of the loss beyond what it keeps (profiler)"),
    Term("the loss's forward and backward", "time", "stage",
         lambda stage, ctx: stage_constant_ms(ctx.profile, stage, ctx.setup), "timed (profiler)"),
    Term("two schedule actions per microbatch", "comm", "stage",
         lambda stage, ctx: stage_constant_comm_ms(stage, ctx.setup), "calibrated action cost (ckplan calibrate)"),
)


def _rows(quantity: str, where: str) -> tuple[Term, ...]:
    return _BY_PLACE.get((quantity, where), ())


def index_terms(terms: Sequence[Term]) -> dict[tuple[str, str], tuple[Term, ...]]:
    """The rows by (quantity, where), as layer_value / edge_value / stage_value read them."""
    found: dict[tuple[str, str], tuple[Term, ...]] = {}
    for term in terms:
        if term.quantity not in {q.name for q in QUANTITY_DECLARATIONS} or term.where not in ("layer", "open", "close",
                                                                                           "stage"):
            raise ValueError(f"term {term.name!r}: unknown quantity {term.quantity!r} or place {term.where!r}")
        found[term.quantity, term.where] = found.get((term.quantity, term.where), ()) + (term,)
    return found


_BY_PLACE = index_terms(TERMS)


def _rows_at(where: str) -> list[Term]:
    return [term for (_, place), terms in _BY_PLACE.items() if place == where for term in terms]


def layer_value(quantity: str, layer: LayerCost, option: int, ctx: Context) -> float:
    """What one layer of a stage adds to `quantity` under its recompute option (index; a bool:
    full or none)."""
    return sum(term.value(layer, option, ctx) for term in _rows(quantity, "layer"))


def edge_value(quantity: str, where: str, layer: LayerCost, stage: int, ctx: Context) -> float:
    """What `layer` adds to `quantity` by opening (where="open") or closing stage `stage`."""
    return sum(term.value(layer, stage, ctx) for term in _rows(quantity, where))


def stage_value(quantity: str, stage: int, ctx: Context) -> float:
    """What stage `stage` adds to `quantity` for its position alone."""
    return sum(term.value(stage, ctx) for term in _rows(quantity, "stage"))


def useful_options(layer: LayerCost, ctx: Context) -> list[int]:
    """The options past none a plan may choose for this layer: each keeps fewer bytes than
    none, and no other keeps no more, adds no more time and no more extra peak while better in
    one (a dominated option never lowers a peak or a time; host bytes count as one more
    resource). Whole-layer plans (the setup's recompute): full alone. A chunked schedule's
    stages take no option that offloads (their host bytes per rank are not modelled yet)."""
    whole_layer = ctx.setup.training.recompute == "whole-layer"
    candidates = [1] if whole_layer else range(1, len(layer.options))
    if ctx.setup.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES or ctx.split_backward:
        candidates = [o for o in candidates if runs_split_backward(layer.options[o].name)]
    if ctx.chunked or ctx.setup.pipeline.schedule in CHUNKED_SCHEDULES:
        candidates = [o for o in candidates if not layer.options[o].host_bytes]
    rows = {o: (layer_value("kept", layer, o, ctx), layer_value("time", layer, o, ctx),
                layer_value("extra", layer, o, ctx), layer_value("offloaded", layer, o, ctx))
            for o in range(len(layer.options))}
    found = []
    for o in candidates:
        if rows[o][0] >= rows[0][0]:
            continue
        if any(p != o and all(a <= b for a, b in zip(rows[p], rows[o])) and rows[p] != rows[o]
               for p in candidates):
            continue
        found.append(o)
    return found


def fragmentation(setup: TrainSetup, device_type: str) -> float:
    """The share of reserved memory the caching allocator loses at the peak: cuda only, the
    setup's or the published mean (allocator.DEFAULT_FRAGMENTATION)."""
    if device_type != "cuda":
        return 0.0
    stated = setup.pipeline.fragmentation
    return allocator.DEFAULT_FRAGMENTATION if stated is None else stated


def workspace_bytes(stage: int, ctx: Context) -> int:
    """The communication library's buffers on the rank holding `stage` (cuda): a two-rank
    communicator per pipeline neighbour; one per data-parallel group it reduces in (HSDP: its
    shard group and its replica group); one for the tensor-parallel group of an analytic
    profile. gloo on cpu allocates in the tensors' memory: nothing."""
    if ctx.device_type != "cuda":
        return 0
    setup = ctx.setup
    neighbours = (stage > 0) + (stage < setup.pipeline.stages - 1)
    if setup.pipeline.schedule in CHUNKED_SCHEDULES:  # a rank's chunks talk to both its neighbours
        neighbours = min(2, setup.pipeline.stages - 1)
    groups = [2] * neighbours
    dp, shard, ep = setup.data_parallel.dp, setup.data_parallel.shard_group, setup.data_parallel.ep
    groups += [shard, dp // shard] if shard is not None else [dp]
    if ep > 1 and any(layer.expert_param_count for layer in ctx.profile.layers):
        groups += [ep, dp // ep]  # the expert-parallel group and the experts' data-parallel group
    tp = ctx.profile.assumptions.get("tp", 1)
    groups.append(tp if isinstance(tp, int) else 1)
    return sum(allocator.communicator_bytes(size) for size in groups)


def limit_bytes(stage: int, ctx: Context) -> int:
    """The allocated peak stage `stage` may reach: its cap on cpu; on cuda what stays once the
    communication buffers are taken, less the allocator's fragmentation margin and segment
    rounding (allocator.allocated_limit: its reserved peak then stays within the cap)."""
    cap = ctx.setup.pipeline.mem_caps_bytes[stage]
    if ctx.device_type != "cuda":
        return cap
    return int(allocator.allocated_limit(cap - workspace_bytes(stage, ctx),
                                         fragmentation(ctx.setup, ctx.device_type)))


def host_cap_bytes(setup: TrainSetup) -> int | None:
    """A rank's share of its node's host memory: the node's ranks may hold any stage, so each
    gets host_mem / the ranks on a node (dataparallel.host_bytes_per_node). None: not capped."""
    if setup.data_parallel.host_mem_bytes is None:
        return None
    return setup.data_parallel.host_mem_bytes // min(setup.data_parallel.devices_per_node, setup.pipeline.stages * setup.data_parallel.dp)


# ---------------------------------------------------------------- stages and plans


def transient_extra_bytes(layers: Sequence[LayerCost], checkpointed: Sequence[int], ctx: Context) -> float:
    """Extra bytes, beyond every in-flight microbatch's kept bytes, while one layer of the
    stage runs: its transient (scratch, a weight's whole gradient) plus, when checkpointed,
    its recompute. The layers after it hold nothing of that microbatch then (in backward
    they have freed it, in forward not made it yet), so only what exceeds their kept bytes
    counts: max over l of (transient_l + [l∈C]·(act_l - input_l) - Σ_{m after l} kept_m),
    at least 0. Measured: stage 0's embedding gradient meets only the other microbatches."""
    return net_extra_bytes([(layer_value("extra", layer, ckpt, ctx), layer_value("kept", layer, ckpt, ctx))
                            for layer, ckpt in zip(layers, checkpointed)])


def net_extra_bytes(extra_and_kept: Sequence[tuple[float, float]]) -> float:
    """transient_extra_bytes from each layer's (extra, kept), in stage order."""
    extra, later_kept = 0, 0
    for layer_extra, kept in reversed(extra_and_kept):
        extra = max(extra, layer_extra - later_kept)
        later_kept += kept
    return extra


def expert_parallel_transient_back(layer: LayerCost, setup: TrainSetup) -> int:
    """What expert parallelism over E ranks takes off a MoE layer's transient: the temporaries of
    its routed experts' weight gradients, of which a rank holds 1/E."""
    ep = setup.data_parallel.ep
    return layer.expert_transient_bytes * (ep - 1) // ep


def layer_extra_bytes(layer: LayerCost, option: int) -> int:
    """A layer's peak beyond what it keeps: its transient, plus what its option recomputes at once."""
    if option < 2:
        return layer.transient_bytes + (layer.recompute_peak_bytes if option else 0)
    return layer.transient_bytes + layer.options[option].peak_bytes


# Bytes per parameter of the temporaries torch's optimizer step allocates: Adam computes
# sqrt(v) / bias correction as a new (fp32 master) tensor and updates in place; SGD with
# momentum updates in place.
_STEP_SCRATCH_PER_PARAM = {"adam": 4, "sgd": 0}


def layer_step_scratch_bytes(layer: LayerCost, setup: TrainSetup, device_type: str) -> float:
    """The optimizer step's temporaries for this layer's parameters (offload: the step runs on
    the host). ZeRO ≥ 1 steps 1/K of them: FSDP2 (ZeRO 2/3) 1/K of every tensor; ZeRO 1
    (ZeroRedundancyOptimizer) whole tensors, 1/K of them, so on cpu, where the step's scratch
    is that of its largest tensor (step_scratch_bytes), a rank may hold the whole of it."""
    if setup.data_parallel.offload:
        return 0.0
    per_param = _STEP_SCRATCH_PER_PARAM[setup.training.optimizer]
    if setup.data_parallel.zero == 1 and device_type != "cuda":
        return per_param_bytes(layer, setup, lambda _: per_param)
    return per_param_bytes(layer, setup, lambda part: per_param / dataparallel.shard_size(part))


def step_scratch_bytes(per_layer: Sequence[float], device_type: str) -> float:
    """The stage's optimizer-step peak beyond static + buffers, from layer_step_scratch_bytes
    of its layers. cuda steps every parameter at once (foreach): all of them; cpu one
    parameter at a time, two temporaries of the largest (measured: 2 x 16 MiB + 12 B for a
    16 MiB embedding), bounded here by the layer whose parameters are largest."""
    if device_type == "cuda":
        return sum(per_layer)
    return 2 * max(per_layer, default=0.0)


def peak_bytes(held, in_flight, kept, transient, scratch, maximum=max):
    """A stage's peak: what it holds all iteration (static + buffers) + max(in-flight
    activations + transient, the optimizer step's scratch). `maximum=np.maximum` scores many
    checkpoint sets at once (the DP solver's arrays); callers round."""
    return held + maximum(in_flight * kept + transient, scratch)


def stage_cost(
    layers: Sequence[LayerCost],
    checkpointed: Sequence[int],
    *,
    stage: int,
    profile: Profile,
    setup: TrainSetup,
) -> StageCost:
    """Memory and time of one stage holding `layers` (in order), some checkpointed: every
    row of TERMS, each quantity entering as the description says."""
    ctx = Context(profile, setup)
    first, last = layers[0], layers[-1]
    names = [q.name for q in QUANTITY_DECLARATIONS]
    totals = dict.fromkeys(names, 0.0)
    rows = _rows_at("layer")
    per_layer = []  # each layer's value of every quantity: the extra and scratch aggregate by layer
    for layer, ckpt in zip(layers, checkpointed):  # one pass over the rows per layer
        values = dict.fromkeys(names, 0.0)
        for term in rows:
            values[term.quantity] += term.value(layer, ckpt, ctx)
        per_layer.append(values)
        for quantity, value in values.items():
            totals[quantity] += value
    for term in _rows_at("open"):
        totals[term.quantity] += term.value(first, stage, ctx)
    for term in _rows_at("close"):
        totals[term.quantity] += term.value(last, stage, ctx)
    for term in _rows_at("stage"):
        totals[term.quantity] += term.value(stage, ctx)

    static = totals["static"] + dataparallel.zero_one_excess_bytes(
        sum(layer.param_count for layer in layers), max(layer.largest_param_count for layer in layers), setup)
    buffers = sum(totals[q] for q in quantities("held") if q != "static")  # every other byte held all iteration
    kept = int(round(sum(totals[q] for q in quantities("kept"))))
    # the loss's scratch is gone before the stage's layers run their backward, and what the
    # loss keeps (the last stage) is freed before any of them does: after the last layer
    transient = int(round(max(net_extra_bytes([(v["extra"], v["kept"]) for v in per_layer]
                                              + [(0.0, stage_value("kept", stage, ctx))]),
                              stage_value("extra", stage, ctx))))
    scratch = step_scratch_bytes([v["scratch"] for v in per_layer], profile.device.type)
    k = in_flight(setup, stage)
    peak = int(round(peak_bytes(static + buffers, k, kept, transient, scratch)))
    cuda = ctx.device_type == "cuda"
    return StageCost(
        comm_ms=sum(totals[q] for q in quantities("busy") if q != "time"),
        step_ms=sum(totals[q] for q in quantities("step")),
        static_bytes=int(round(static)),
        kept_bytes=kept,
        in_flight=k,
        activation_bytes=k * kept,
        buffer_bytes=int(round(buffers)),
        transient_bytes=transient,
        peak_bytes=peak,
        limit_bytes=limit_bytes(stage, ctx),
        reserved_bytes=allocator.reserved_bytes(peak, fragmentation(setup, ctx.device_type)) if cuda else None,
        workspace_bytes=workspace_bytes(stage, ctx),
        time_ms=totals["time"],
        cap_bytes=setup.pipeline.mem_caps_bytes[stage],
        step_scratch_bytes=int(round(scratch)),
        host_bytes=int(round(totals["host"] + k * totals["offloaded"])),
        host_cap_bytes=host_cap_bytes(setup),
        weight_grad_bytes=int(round(totals["wgrad"])),
        weight_pass_peak_bytes=int(round(totals["wpeak"])),
        # the last stage's input pass starts with the loss's backward
        input_pass_peak_bytes=int(round(max(input_pass_peak_bytes([(v["ipeak"], v["wgrad"]) for v in per_layer]),
                                            stage_value("extra", stage, ctx)))),
    )


def split_to_stages(
    bounds: Sequence[int], options: Sequence[int], profile: Profile
) -> list[StagePlan]:
    """Stage plans from stage start indices (`bounds[s]` = first layer of stage s) and every
    layer's option index (a bool: full or none)."""
    costs = layer_costs(profile)
    names = [layer.name for layer in costs]
    ends = list(bounds[1:]) + [len(names)]
    chosen = {names[i]: costs[i].options[int(o)].name for i, o in enumerate(options) if o}
    return [
        StagePlan(
            index=s,
            layers=names[start:end],
            recompute={name: chosen[name] for name in names[start:end] if name in chosen},
            checkpointed=[name for name in names[start:end] if chosen.get(name) == OPTION_FULL],
        )
        for s, (start, end) in enumerate(zip(bounds, ends))
    ]


def option_indices(stage: StagePlan, layers: Sequence[LayerCost]) -> list[int]:
    """Each layer's option index in the plan (ValueError for an option it does not have), as
    StagePlan.option reads it: checkpointed full, the selective ones from recompute."""
    full = set(stage.checkpointed)
    indices = []
    for layer in layers:
        option = OPTION_FULL if layer.name in full else stage.recompute.get(layer.name, OPTION_NONE)
        indices.append(1 if option == OPTION_FULL and layer.name in full else
                       0 if option in (OPTION_NONE, OPTION_FULL) else layer.option_index(option))
    return indices


def evaluate(stages: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """Score any plan. Raises ValueError if the stages are not a contiguous, complete,
    in-order cover of the profile's layers."""
    if setup.pipeline.schedule in CHUNKED_SCHEDULES:
        return evaluate_chunked(stages, profile, setup)
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    if len(stages) != setup.pipeline.stages:
        raise ValueError(f"plan has {len(stages)} stages, setup has {setup.pipeline.stages}")
    flat = [name for stage in stages for name in stage.layers]
    if flat != [layer.name for layer in costs]:
        unknown = [name for name in flat if name not in position]
        detail = f"unknown layers {unknown[:3]}" if unknown else "layers missing, repeated or out of order"
        raise ValueError(f"stages do not cover the profile's layers in order: {detail}")
    result = []
    for s, stage in enumerate(stages):
        layers = [costs[position[name]] for name in stage.layers]
        result.append(stage_cost(layers, option_indices(stage, layers), stage=s, profile=profile, setup=setup))
    return PlanCost(stages=result, iteration_ms=iteration_ms([c.busy_ms for c in result], setup,
                                                             [c.step_ms for c in result]))


# ---------------------------------------------------------------- schedules with chunks
#
# Interleaved 1F1B, ZB, ZBV and DualPipeV give each rank several stages (chunks). Every
# stage is scored by stage_cost as the stage of a P·V-stage pipeline (its layers' rows, its
# position's: the batch on the first, the loss on the last, PipelineStage's receive buffers on
# each), and a rank adds its stages up, with two things the schedule decides, read from its
# simulation of torch's own action order (planner/schedules.py):
#   activations_r = max over the rank's steps t of Σ_c live_c(t) · kept_c   (the peak step
#                   depends on the chunks' bytes); zero-bubble schedules (ZB, ZBV, DualPipeV)
#                   keep a microbatch's activations until its weight-gradient pass: all of
#                   kept_c counted until W, an upper bound (W needs only the linears' inputs)
#   T_iter        = the simulated makespan (each stage's forward, and its backward split
#                   evenly into input and weight gradient where the schedule splits it, as
#                   Qi et al. 2023 take T_B ≈ T_W for transformer layers) + the slowest step
# and the rank's peak = static + buffers + max(activations + the largest transient, scratch).


def schedule_of(setup: TrainSetup) -> schedules.Schedule:
    return schedules.build_schedule(setup.pipeline.schedule, num_ranks=setup.pipeline.stages,
                                    num_microbatches=setup.pipeline.microbatches, num_chunks=setup.pipeline.chunks)


def stage_setup(setup: TrainSetup, order: schedules.Schedule) -> TrainSetup:
    """The setup each stage is scored under: one of P·V stages, its rank's cap."""
    caps = [setup.pipeline.mem_caps_bytes[rank] for rank in order.stage_to_rank]
    return setup.model_copy(update={"stages": order.num_stages, "schedule": "GPipe", "chunks": 1,
                                    "mem_caps_bytes": caps, "parallel_stages": None})


def ranks_of(stages: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """The pipeline's P·V stages (in order) as the P ranks that hold them, chunk 0 first, as
    the schedule places them (interleaved loops, ZBV and DualPipeV run a V)."""
    order = schedule_of(setup)
    ranks = []
    for rank in range(setup.pipeline.stages):
        mine = [stages[k] for k in order.stages_of(rank)]
        ranks.append(StagePlan(index=rank, layers=[name for stage in mine for name in stage.layers],
                               chunks=[list(stage.layers) for stage in mine],
                               recompute={name: option for stage in mine for name, option in stage.recompute.items()},
                               checkpointed=[name for stage in mine for name in stage.checkpointed]))
    return ranks


def pipeline_stages(ranks: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """A plan's P·V pipeline stages in order (the inverse of ranks_of), each with its layers'
    recompute; the plan's own stages where each rank holds one."""
    if setup.pipeline.chunks == 1:
        return list(ranks)
    order = schedule_of(setup)
    placed = {}
    for rank, plan in enumerate(ranks):
        for chunk, stage in zip(plan.chunks, order.stages_of(rank)):
            placed[stage] = StagePlan(index=stage, layers=list(chunk),
                                      recompute={n: o for n, o in plan.recompute.items() if n in chunk},
                                      checkpointed=[n for n in plan.checkpointed if n in chunk])
    return [placed[stage] for stage in range(order.num_stages)]


def evaluate_chunked(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> PlanCost:
    """Score a plan of a chunked schedule: one StagePlan per rank whose `chunks` are its
    stages' layers, chunk 0 first (see the section's comment)."""
    order = schedule_of(setup)
    if len(ranks) != setup.pipeline.stages:
        raise ValueError(f"plan has {len(ranks)} ranks, setup has {setup.pipeline.stages}")
    staged: dict[int, tuple[list[str], StagePlan]] = {}
    for rank, plan in enumerate(ranks):
        if len(plan.chunks) != setup.pipeline.chunks:
            raise ValueError(f"rank {rank} holds {len(plan.chunks)} chunks, the schedule gives it {setup.pipeline.chunks}")
        for chunk, stage in zip(plan.chunks, order.stages_of(rank)):
            staged[stage] = (chunk, plan)
        offloaded = [name for name in plan.layers if plan.option(name) == OPTION_OFFLOAD]
        if offloaded:  # useful_options never gives a chunked stage one
            raise ValueError(f"rank {rank}'s layer {offloaded[0]} offloads its activations, which a chunked schedule "
                             f"does not model yet; recompute it instead")
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    if [name for stage in range(order.num_stages) for name in staged[stage][0]] != [layer.name for layer in costs]:
        raise ValueError("the ranks' chunks do not cover the profile's layers in pipeline order")
    inner = stage_setup(setup, order)
    per_stage, held = [], []
    split = setup.pipeline.schedule in SPLIT_BACKWARD_SCHEDULES
    for stage in range(order.num_stages):
        names, plan = staged[stage]
        layers = [costs[position[name]] for name in names]
        cost = stage_cost(layers, option_indices(plan, layers), stage=stage, profile=profile, setup=inner)
        output, input_grad = sends_held_bytes(layers[0], layers[-1], stage, order, setup)
        # the single-stage buffers' one input gradient being sent is counted by the sends here
        per_stage.append(dataclasses.replace(cost, buffer_bytes=cost.buffer_bytes - input_grad))
        kept = (0.0, cost.kept_bytes) if split else (cost.kept_bytes, 0.0)
        held.append(schedules.ChunkBytes(*kept, sent_output=output, sent_input_grad=input_grad,
                                         held_for_weight_grad=cost.weight_grad_bytes if split else 0,
                                         transient=cost.transient_bytes,
                                         input_pass_transient=cost.input_pass_peak_bytes if split else 0,
                                         weight_pass_transient=cost.weight_pass_peak_bytes if split else 0))
    peaks = schedules.peak_in_flight(order, stage_bytes=held)
    ctx = Context(profile, setup)
    rank_costs = []
    for rank in range(setup.pipeline.stages):
        mine = [per_stage[stage] for stage in order.stages_of(rank)]
        names = {name for stage in order.stages_of(rank) for name in staged[stage][0]}
        static = sum(c.static_bytes for c in mine) + rank_tied_once_bytes(profile, names, setup)
        buffers = sum(c.buffer_bytes for c in mine)
        # the rank's peak is after an action, or during a chunk's backward with that chunk's transient
        activations = int(round(peaks[rank].live - peaks[rank].transient))
        transient = int(round(peaks[rank].transient))
        scratch = (sum if profile.device.type == "cuda" else max)(c.step_scratch_bytes for c in mine)
        peak = int(round(peak_bytes(static + buffers, 1, activations, transient, scratch)))
        cuda = ctx.device_type == "cuda"
        rank_costs.append(StageCost(
            static_bytes=static, kept_bytes=sum(c.kept_bytes for c in mine),
            in_flight=peaks[rank].activations or peaks[rank].weight_grad_inputs, activation_bytes=activations,
            buffer_bytes=buffers, transient_bytes=transient, peak_bytes=peak,
            time_ms=sum(c.time_ms for c in mine), cap_bytes=setup.pipeline.mem_caps_bytes[rank],
            step_ms=sum(c.step_ms for c in mine), step_scratch_bytes=scratch, comm_ms=sum(c.comm_ms for c in mine),
            host_bytes=sum(c.host_bytes for c in mine), host_cap_bytes=host_cap_bytes(setup),
            limit_bytes=limit_bytes(rank, ctx),
            reserved_bytes=allocator.reserved_bytes(peak, fragmentation(setup, ctx.device_type)) if cuda else None,
            workspace_bytes=workspace_bytes(rank, ctx)))
    return PlanCost(stages=rank_costs, iteration_ms=chunked_iteration_ms(per_stage, costs, staged, order, setup))


def as_ranks(stages: Sequence[StagePlan], setup: TrainSetup) -> list[StagePlan]:
    """A plan's pipeline stages (P·V of them, in order) as its ranks, each with its chunks: the
    stages themselves where each rank holds one (ranks_of)."""
    return list(stages) if setup.pipeline.chunks == 1 else ranks_of(stages, setup)


def chunked_linear_ms(ranks: Sequence[StagePlan], profile: Profile, setup: TrainSetup) -> float:
    """The chunked MILP's linear time for a plan (milp._chunked_time, from each of its P·V
    stages' busy time as evaluate_chunked scores them): M·Σ a rank's stages' busy + (P - 1)·the
    slowest stage + the slowest rank's step. The search holds the MILP's objective to it; the
    plan reports the simulated schedule's time (evaluate)."""
    order = schedule_of(setup)
    inner = stage_setup(setup, order)
    costs = layer_costs(profile)
    position = {layer.name: idx for idx, layer in enumerate(costs)}
    per_stage = []
    for k, stage in enumerate(pipeline_stages(ranks, setup)):
        layers = [costs[position[name]] for name in stage.layers]
        per_stage.append(stage_cost(layers, option_indices(stage, layers), stage=k, profile=profile, setup=inner))
    busy = [cost.busy_ms for cost in per_stage]
    work = max(setup.pipeline.microbatches * sum(busy[k] for k in order.stages_of(r)) for r in range(order.num_ranks))
    step = max(sum(per_stage[k].step_ms for k in order.stages_of(r)) for r in range(order.num_ranks))
    return work + (order.num_ranks - 1) * max(busy) + step


def sends_held_bytes(first: LayerCost, last: LayerCost, stage: int, order: schedules.Schedule,
                     setup: TrainSetup) -> tuple[int, int]:
    """Per microbatch, the stage's output and input gradient held until the step ends
    (schedules.ChunkBytes): torch's runtime for several stages per rank waits for its sends only
    then, and a neighbour on the same rank (a V's turn) keeps the tensor it was handed in its
    receive buffer as long (measured on the runtime: a rank's live bytes grew by one boundary
    tensor per send or hand-over)."""
    if _runtime(setup) not in ("ckplan", "torchtitan"):
        return 0, 0
    output = last.output_bytes if stage + 1 < order.num_stages else 0
    input_grad = first.input_bytes if stage > 0 else 0
    return output, input_grad


def chunked_iteration_ms(per_stage: Sequence[StageCost], costs: Sequence[LayerCost], staged: dict,
                         order: schedules.Schedule, setup: TrainSetup) -> float:
    """The simulated makespan of the schedule with each stage's forward and backward (its sends
    and actions with them), plus the slowest rank's optimizer step."""
    forward = {layer.name: compute_ms(layer.fwd_ms, setup) for layer in costs}
    times = []
    for stage, cost in enumerate(per_stage):
        fwd = sum(forward[name] for name in staged[stage][0]) + cost.comm_ms / 2
        backward = max(cost.busy_ms - fwd, 0.0)
        times.append(schedules.StageTimes(fwd, backward / 2, backward / 2))
    steps = [sum(per_stage[stage].step_ms for stage in order.stages_of(rank)) for rank in range(order.num_ranks)]
    return schedules.simulate_time(order, stage_times=times).makespan_ms + max(steps)


def with_predictions(stages: Sequence[StagePlan], cost: PlanCost) -> list[StagePlan]:
    return [
        stage.model_copy(update={"predicted": stage_cost.predicted()})
        for stage, stage_cost in zip(stages, cost.stages)
    ]
