"""A split backward's two passes, as a zero-bubble schedule (ZB, ZBV, DualPipeV) runs them: torch
2.13's I (stage_backward_input: the input gradient, with every backward op but the weight-gradient
matmuls) and W (stage_backward_weight: those matmuls, one autograd call per parameter group).

Per layer, the profile's input_grad_ms and weight_grad_ms of its option (measured: torch's two
passes; analytic: the backward's work split by what each pass runs) are taken as fractions of the
backward they were recorded against (the layer's bwd_ms and what the option recomputes), then applied
to the backward the time row charges (compute_ms(...), a runtime's whole-forward recompute, a Float8
or fused-kernel record's bwd_ms): their sum is the split's own cost, more than a full backward where
torch's two engine calls and graph walks cost more (docs/framework-facts.md §56, §62). The rest of a
stage's backward (layers with nothing recorded, collectives, the loss) goes half to each pass.

On the pipeline's first stage torch's I runs nothing and its W the stage's whole backward as one
plain autograd call (torch 2.13.0 pipelining/stage.py 1018-1021, 1098-1106): I = 0, W = the full
backward, not the split's.

The evaluator (score.plan_iteration_ms) and the chunked solvers' linear time (chunked.chunked_linear_ms,
the MILP's rows: milp._stage_time) read a stage's passes through one function, stage_times: its
F + I + W is its full-backward busy time plus, past the first stage, each layer's layer_extra_ms
under its option, a constant per (layer, option), so the MILP's time stays linear and exact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost.layers import LayerCost
from planner.cost.rules import compute_ms, option_recompute_ms
from planner.cost.schedule_time import StageTimes
from planner.schema import TrainSetup


@dataclass(frozen=True)
class StageSplit:
    """A stage's recorded layers' part of its split backward, per microbatch (ms): their input
    passes, their weight passes, and the full backward the time row charges the same layers."""

    input_grad_ms: float = 0.0
    weight_grad_ms: float = 0.0
    charged_ms: float = 0.0


def layer_split_ms(layer: LayerCost, option: int, setup: TrainSetup) -> tuple[float, float, float] | None:
    """(input pass, weight pass, full backward as charged) of one layer under option `option`
    (an index; a bool: full or none), ms per microbatch; None where the profile recorded no split."""
    chosen = layer.options[int(option)]
    if chosen.input_grad_ms is None or chosen.weight_grad_ms is None:
        return None
    rerun = 0.0 if int(option) == 0 else (layer.fwd_ms if chosen.recompute_ms is None else chosen.recompute_ms)
    recorded_against = layer.bwd_ms + rerun  # the profiler's: options.recompute_options, analytic._layer
    charged = compute_ms(layer.bwd_ms + option_recompute_ms(layer, int(option), setup), setup.time)
    if recorded_against <= 0:
        return 0.0, 0.0, charged  # nothing recorded to split against: charge nothing more than the row
    scale = charged / recorded_against
    return chosen.input_grad_ms * scale, chosen.weight_grad_ms * scale, charged


def layer_extra_ms(layer: LayerCost, option: int, setup: TrainSetup) -> float:
    """What one layer's split passes under option `option` take beyond the full backward the time
    row charges it (layer_split_ms: I + W - charged), ms per microbatch, on any stage past the
    pipeline's first (the first runs its full backward: nothing more); 0 where nothing is recorded.
    Negative where the recorded pair came out under the backward it was recorded against."""
    found = layer_split_ms(layer, option, setup)
    return 0.0 if found is None else found[0] + found[1] - found[2]


def stage_split(layers: Sequence[LayerCost], options: Sequence[int], setup: TrainSetup) -> StageSplit:
    """The sums of layer_split_ms over a stage's layers that recorded one."""
    found = [layer_split_ms(layer, option, setup) for layer, option in zip(layers, options, strict=True)]
    found = [f for f in found if f is not None]
    return StageSplit(sum(f[0] for f in found), sum(f[1] for f in found), sum(f[2] for f in found))


def split_pass_ms(backward_ms: float, split: StageSplit, *, stage: int) -> tuple[float, float]:
    """A stage's (I, W) per microbatch from its whole backward as the full-backward schedules
    charge it (`backward_ms`: its layers' backward, recompute, collectives and loss) and its
    recorded layers' split: theirs as recorded, the rest half each; on the first stage (0),
    nothing and the full backward."""
    if stage == 0:
        return 0.0, backward_ms
    rest = max(backward_ms - split.charged_ms, 0.0)
    return split.input_grad_ms + rest / 2, split.weight_grad_ms + rest / 2


def stage_times(sums: Sequence, *, splits: Sequence[StageSplit] | None, reductions: Sequence[float] | None = None,
                beside: Sequence[tuple[float, float]] | None = None) -> list[StageTimes]:
    """Each pipeline stage's F, I, W per microbatch from its sums (assembly.StageSums, by stage):
    F its layers' forward and half its sends and actions, the rest its backward; a full backward
    (`splits` None: 1F1B, GPipe, interleaved) half each, a split one as split_pass_ms gives it
    (`splits`, per stage: stage_split). `reductions`, per stage: what its runtime reduces after its
    last backward (pipereduce.stage_reductions_ms). `beside`, per stage: the sends its runtime runs beside
    the compute (stagesends.beside_ms), out of its passes."""
    reductions = reductions or [0.0] * len(sums)
    times = []
    for index, (stage, waited) in enumerate(zip(sums, reductions, strict=True)):
        sent = sum(beside[index]) if beside else 0.0
        forward = stage.forward_ms + (stage.comm_ms - sent) / 2
        backward = max(stage.busy_ms - sent - forward, 0.0)
        halves = (backward / 2, backward / 2)
        if splits is not None:
            halves = split_pass_ms(backward, splits[index], stage=index)
        times.append(StageTimes(forward, *halves, reduce_ms=waited))
    return times
