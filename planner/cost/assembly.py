"""The stage accumulator and the evaluator: a stage's memory and time from the rows of TERMS, each
quantity combined as it declares, and a whole plan's iteration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.cost import (
    boundgrad,
    dataparallel,
    gathered,
    loss_records,
    megatron_fsdp_moments,
    stepcounts,
    te_offload,
    zeroone,
)
from planner.cost.layers import LayerCost, layer_costs
from planner.cost.rules import compute_ms, input_pass_peak_bytes, layer_step_ms, layer_time_ms
from planner.cost.stagelimits import (  # noqa: F401  (costmodel's names)
    async_tp_workspace_bytes,
    communicator_bytes,
    cublas_workspaces_bytes,
    fragmentation,
    host_cap_bytes,
    limit_bytes,
    workspace_bytes,
)
from planner.cost.terms import (
    Context,
    _rows_at,
    declared,
    layer_value,
    quantities,
    stage_value,
)
from planner.cost.wgroups import weight_pass_peak_bytes
from planner.schema import (
    OPTION_FULL,
    OPTION_NONE,
    Profile,
    StagePlan,
    StagePredicted,
    TrainSetup,
)

# A plan fits when every stage's peak stays this far below its cap. 4 KiB is nothing next
# to a device. Every solver and evaluate() take the same margin, so it absorbs no solver
# tolerance: the MILP is held to evaluate's verdict to the byte (milp.solve_within_caps).
FIT_MARGIN_BYTES = 4096


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
    # at the step's end, beyond static and buffers (the whole gradients a runtime allocates at its first
    # backward reduced and gone, as at the step): the outputs the schedule keeps and the last stage's merge
    step_end_bytes: int = 0
    comm_ms: float = 0.0  # per microbatch: the stage's sends and its schedule actions
    host_bytes: int = 0  # host memory this rank takes (the offloaded optimizer, offloaded activations)
    host_cap_bytes: int | None = None  # this rank's share of its node's host memory; None: not capped
    # cuda: the allocated peak the cap admits once the allocator's reserve and the communication
    # buffers are taken (limit_bytes); the reserved peak and those buffers. cpu: the cap, the peak, 0
    limit_bytes: int | None = None  # None: the cap
    reserved_bytes: int | None = None  # None: the peak
    reserved_by: str | None = None  # cuda: "replay" (planner/cost/reserve.py) or "divisor"
    # cuda, where the replay ran but the divisor's reserve is larger (replayed_reserve.with_replayed_reserve): the replay's
    replayed_reserved_bytes: int | None = None
    cap_replay: str | None = None  # where the replay ran: its fit under the cap (capped_reserve: fits, retried, oom)
    uncapped_reserved_bytes: int | None = None  # where the replay ran: its reserved peak without a cap
    workspace_bytes: int = 0
    nccl_buffers: dict[str, int] | None = None  # cuda: workspace_bytes' NCCL part by communicator (communicator_bytes)
    # allocated after the optimizer step: static and what the runtime keeps past it
    # (planner/cost/afterstep.py; what Megatron-LM logs as mem-allocated-bytes)
    after_step_bytes: int = 0

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
    def fits_allocated(self) -> bool:
        """The solvers' row: the allocated peak within what the cap admits once the divisor's
        reserve and the communication buffers are taken (limit_bytes)."""
        return self.peak_bytes + FIT_MARGIN_BYTES <= self.allocated_limit_bytes

    @property
    def replay_excess_bytes(self) -> int:
        """How far the replayed reserved peak and the buffers pass the cap (0 where the replay
        did not run, or they fit)."""
        if self.reserved_by != "replay":
            return 0
        return max(0, self.device_need_bytes - self.cap_bytes)

    @property
    def fits_device(self) -> bool:
        """The device's verdict: the replayed reserved peak and the buffers within the cap where
        the allocator replay ran (planner/cost/reserve.py), else the solvers' row."""
        if self.reserved_by == "replay":
            return self.device_need_bytes <= self.cap_bytes
        return self.fits_allocated

    @property
    def fits_host(self) -> bool:
        return self.host_cap_bytes is None or self.host_bytes + FIT_MARGIN_BYTES <= self.host_cap_bytes

    @property
    def fits(self) -> bool:
        return self.fits_device and self.fits_host

    def predicted(self) -> StagePredicted:
        return StagePredicted(
            reserved_bytes=self.reserved_bytes,
            reserved_by=self.reserved_by or ("divisor" if self.reserved_bytes is not None else None),
            replayed_reserved_bytes=self.replayed_reserved_bytes,
            workspace_bytes=self.workspace_bytes,
            peak_bytes=self.peak_bytes,
            static_bytes=self.static_bytes,
            after_step_bytes=self.after_step_bytes,
            activation_bytes=self.activation_bytes,
            buffer_bytes=self.buffer_bytes,
            transient_bytes=max(0, self.transient_bytes),  # below 0 where static lacks its shards (stage_floor):
            freed_bytes=max(0, -self.transient_bytes),  # said as what it is, so the parts still add up
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


def parallel_stages(setup: TrainSetup) -> int:
    return min(setup.pipeline.stages, setup.pipeline.parallel_stages or setup.pipeline.stages)


def pipeline_ms(total_ms: float, slowest_ms: float, slowest_step_ms: float, total_step_ms: float,
                setup: TrainSetup, drain_ms: float = 0.0) -> float:
    """A one-stage-per-rank plan's iteration (the evaluator's, score.plan_iteration_ms) from the
    stages' sums and maxima (busy time per microbatch, optimizer steps): the pipeline's critical
    path, fill and drain (every stage once) plus M - 1 steady steps of the slowest stage, then the
    slowest optimizer step; or, when fewer stages than there are compute at once, all the work
    spread over those that can (capacity_ms), if that is longer. The form the DP keeps them in
    while it grows a plan. `drain_ms`: the stages' reductions after their last backward, which the
    drain passes once each (pipereduce.drain_ms: the same whatever the cuts)."""
    pipeline = total_ms + (setup.pipeline.microbatches - 1) * slowest_ms + slowest_step_ms + drain_ms
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
    base = compute_ms(sum(layer_time_ms(layer, False) for layer in layers), setup.time)
    ctx = Context(profile, setup)
    base += sum(stage_value(quantity, s, ctx) for s in range(setup.pipeline.stages) for quantity in ("time", "comm"))
    base += sum(layer_step_ms(layer, setup) for layer in layers) / setup.pipeline.stages
    return (feasible_iteration_ms - base) / (setup.pipeline.microbatches - 1) * (1 + 1e-9) + 1e-9


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


def net_extra_bytes(extra_and_kept: Sequence[tuple[float, float]], floor: float = 0.0) -> float:
    """transient_extra_bytes from each layer's (extra, kept), in stage order; `floor`: the moment every microbatch is
    whole and nothing else live (0; less what it lacks of static: gathered.stage_floor)."""
    extra, later_kept = floor, 0
    for layer_extra, kept in reversed(extra_and_kept):
        extra = max(extra, layer_extra - later_kept)
        later_kept += kept
    return extra


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


def step_end_peak_bytes(held, *, late_grad_bytes, end_bytes):
    """A rank's bytes at its step's end, its own moment of the peak (score.rank_cost; the DP and
    the MILP take the same): what it holds all iteration (static + buffers), less the whole
    gradients its runtime allocates at a stage's first backward (reduced and gone by then, as at
    the step: gradtiming.lazy_grad_bytes), plus what the schedule still keeps then
    (chunked.step_end_bytes). Callers round."""
    return held - late_grad_bytes + end_bytes


@dataclass(frozen=True)
class StageSums:
    """One pipeline stage's quantities, each combined as it declares (terms.COMBINE): the stage
    accumulator. A rank's cost (score.py) adds its stages' sums and takes their in-flight
    microbatches from the schedule; the DP grows the same sums a layer at a time (StageRun)."""

    static_bytes: float  # held: weights, gradients, optimizer state (ZeRO 1's whole tensors included)
    buffer_bytes: float  # held: every other byte held all iteration
    kept_bytes: int  # per in-flight microbatch
    transient_bytes: int  # the largest extra, net of what the layers after it keep
    step_scratch_bytes: float
    host_bytes: float  # the rank's host bytes
    offloaded_bytes: float  # host bytes per in-flight microbatch
    time_ms: float
    comm_ms: float
    step_ms: float
    forward_ms: float  # the layers' forward compute (the schedule's F, for its simulation)
    weight_grad_bytes: int = 0  # per microbatch between a split backward's input and weight passes
    weight_pass_peak_bytes: int = 0  # a split backward's weight pass, over what is live before it
    input_pass_peak_bytes: int = 0  # a split backward's input pass, over what is live before it

    @property
    def held_bytes(self) -> float:
        return self.static_bytes + self.buffer_bytes

    @property
    def busy_ms(self) -> float:
        return self.time_ms + self.comm_ms


@dataclass
class StageRun:
    """The running sums of a stage's quantities that add up or take a maximum as layers join it at
    the end (those stage_sums adds, kept and extra aside, which depend on the options), so the DP
    grows a range one layer at a time with the accumulator's rules (held: with ZeRO 1's whole
    tensors; scratch: step_scratch_bytes)."""

    setup: TrainSetup
    device_type: str
    time_ms: float = 0.0
    layers_held_bytes: float = 0.0  # the layers' held quantities (static, and buffers charged per layer)
    step_ms: float = 0.0
    host_bytes: float = 0.0
    params: int = 0
    largest_params: int = 0
    scratch_sum: float = 0.0
    scratch_max: float = 0.0
    numels: list[int] | None = field(default_factory=list)  # its trained tensors' (None: a layer's not known)
    # whether ZeRO 1 partitions whole tensors here (zeroone.py); else no numels are gathered
    partitioned: bool = field(init=False)

    def __post_init__(self) -> None:
        self.partitioned = bool(dataparallel.whole_tensor_optim_bytes(self.setup))

    def add(self, *, time_ms: float, held_bytes: float, step_ms: float, host_bytes: float, params: int,
            largest_params: int, scratch_bytes: float, numels: tuple[int, ...] | None = None) -> None:
        self.time_ms += time_ms
        self.layers_held_bytes += held_bytes
        self.step_ms += step_ms
        self.host_bytes += host_bytes
        self.params += params
        self.largest_params = max(self.largest_params, largest_params)
        self.scratch_sum += scratch_bytes
        self.scratch_max = max(self.scratch_max, scratch_bytes)
        if self.partitioned:
            self.numels = None if self.numels is None or numels is None else self.numels + list(numels)

    @property
    def held_bytes(self) -> float:
        """The layers' held bytes with ZeRO 1's whole tensors (zeroone.excess_bytes)."""
        return self.layers_held_bytes + zeroone.excess_bytes(
            self.numels, param_count=self.params, largest=self.largest_params, setup=self.setup,
            step_bytes=stepcounts.device_bytes(self.device_type, self.setup))

    @property
    def step_scratch_bytes(self) -> float:
        per_layer = [self.scratch_sum] if self.device_type == "cuda" else [self.scratch_max]
        return step_scratch_bytes(per_layer, self.device_type)


def stage_sums(layers: Sequence[LayerCost], options: Sequence[int], *, stage: int, profile: Profile,
               setup: TrainSetup) -> StageSums:
    """Every row of TERMS for pipeline stage `stage` holding `layers` (in order) under `options`,
    each quantity combined as it declares. `setup` counts the pipeline's stages (placement.stages_view)."""
    ctx = Context(profile, setup)
    first, last = layers[0], layers[-1]
    names = declared()
    totals = dict.fromkeys(names, 0.0)
    rows = _rows_at("layer")
    per_layer = []  # each layer's value of every quantity (one pass over the rows per layer): extra, scratch by layer
    for layer, ckpt in zip(layers, options):
        values = dict.fromkeys(names, 0.0)
        for term in rows:
            values[term.quantity] += term.value(layer, ckpt, ctx)
        per_layer.append(values)
    # before the last stage, its receive buffer is the gradient its last layer's backward runs on (boundgrad.py)
    per_layer[-1]["extra"] -= boundgrad.closing_grad_bytes(last, int(options[-1]), stage=stage, profile=profile, setup=setup)
    per_layer = megatron_fsdp_moments.stage_moments(  # Megatron-FSDP's, then FSDP2's units beside a pipeline
        layers, options, te_offload.stage_window(layers, options, per_layer, rows, ctx) or per_layer, stage=stage, ctx=ctx)
    for values in per_layer:
        for quantity, value in values.items():
            totals[quantity] += value
    for term in _rows_at("open"):
        totals[term.quantity] += term.value(first, stage, ctx)
    for term in _rows_at("close"):
        totals[term.quantity] += term.value(last, stage, ctx)
    for term in _rows_at("stage"):
        totals[term.quantity] += term.value(stage, ctx)
    # FSDP2's units beside a pipeline at the stage's own moments (the DP's: solve/dpmoments.py)
    per_layer = gathered.stage_unit_moments(layers, options, per_layer, stage=stage, profile=profile, setup=setup,
                                            microbatch_kept=sum(totals[q] for q in quantities("kept")))
    static = totals["static"] + zeroone.layers_excess_bytes(layers, profile=profile, setup=setup)
    loss_extra = stage_value("extra", stage, ctx)
    # the loss's scratch is gone before the stage's layers run their backward, and what the loss keeps (the last
    # stage) is freed before any of them does: after the last layer; `floor`: what static lacks until then
    floor = gathered.stage_floor(layers, stage=stage, profile=profile, setup=setup)
    transient = max(net_extra_bytes([(v["extra"], v["kept"]) for v in per_layer] + [(floor, stage_value("kept", stage, ctx))],
                                    floor), loss_extra + floor)
    return StageSums(
        static_bytes=static,
        buffer_bytes=sum(totals[q] for q in quantities("held") if q != "static"),
        kept_bytes=int(round(sum(totals[q] for q in quantities("kept")))),
        transient_bytes=int(round(transient)),
        step_scratch_bytes=step_scratch_bytes([v["scratch"] for v in per_layer], profile.device.type),
        host_bytes=totals["host"],
        offloaded_bytes=totals["offloaded"],
        time_ms=totals["time"],
        comm_ms=sum(totals[q] for q in quantities("busy") if q != "time"),
        step_ms=sum(totals[q] for q in quantities("step")),
        forward_ms=sum(compute_ms(layer.fwd_ms, setup.time) for layer in layers),
        weight_grad_bytes=int(round(totals["wgrad"])),
        # the weight pass runs the stage's parameter groups one at a time, each a torch.autograd.grad
        # whose temporaries (and a checkpointed region's recompute) are gone before the next starts
        # (torch 2.13 pipelining/_backward.py 281-343 stage_backward_weight, retain_graph=False): its
        # peak over what was live before it is a layer's, not their sum (the sum put a V's rank 0 up
        # to 3.1% over its measured peak: tests/test_chunked_schedules.py), on top of the gradients
        # the layer before leaves bound to `dweights` (wgroups.py; 2,176 B under on dp_tiny's ZBV)
        weight_pass_peak_bytes=int(round(weight_pass_peak_bytes([(v["wpeak"], v["wfirst"], v["wcarry"], v["wleft"])
                                                                for v in per_layer]))),
        # the last stage's input pass starts with the loss's backward, whose gradient of the last
        # layer's output stays until the pass ends (a middle stage's is its receive buffer), and whose
        # saved tensors stay through it (retain_graph: loss_records.input_pass_retained_bytes)
        input_pass_peak_bytes=int(round(max(input_pass_peak_bytes([(v["ipeak"], v["wgrad"]) for v in per_layer])
                                            + (last.output_bytes if stage == setup.pipeline.stages - 1 else 0),
                                            loss_extra + _retained_at_input_pass(stage, profile, setup)))),
    )


def _retained_at_input_pass(stage: int, profile: Profile, setup: TrainSetup) -> int:
    last = stage == setup.pipeline.stages - 1
    return loss_records.input_pass_retained_bytes(profile, setup) if last else 0


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


def with_predictions(stages: Sequence[StagePlan], cost: PlanCost) -> list[StagePlan]:
    return [
        stage.model_copy(update={"predicted": stage_cost.predicted()})
        for stage, stage_cost in zip(stages, cost.stages)
    ]
