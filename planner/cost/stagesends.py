"""Pipeline sends a runtime runs beside the compute (issue 35; docs/framework-facts.md §214-§216).

The cost model's terms charge each stage's two sends, its output to the next stage and its input's
gradient to the one before, over the pipeline's link (terms.py: "output sent forward over the
pipeline's link, uncalibrated", "input gradient sent back ..."), with its passes: the sender's rank
is held while they run, and its receiver waits for the sender's pass, send included.

Megatron-core's interleaved schedule with overlap_p2p_comm (on by default with virtual stages) posts a
send with `isend` after its pass and waits for it (`Work.wait()`: the compute stream waits for the NCCL
stream) only at the next send of that direction, after its rank's next compute; a receive is waited for
just before the pass that reads it. So a send it overlaps holds none of the sender's passes, and the
receiver's pass starts once the sender's pass and the send are done. At Megatron-LM d98e8a64 the
output's send is waited at once where deallocate_pipeline_outputs is set (training sets it): held, as
the terms charge it; the input gradient's is overlapped. megatron-core 92c8482e (Megatron-Bridge 25.11)
waits for both at the next send (RuntimeFacts.stage_sends_beside: "backward", "both").

`beside_ms` gives, per stage, the sends that run beside the compute (the same terms' values): splittime.
stage_times takes them out of the stage's passes and schedule_time.simulate_time adds them to the
receiver's wait. Only under a schedule of several stages a rank (overlap_p2p_comm is forced off without
virtual stages: training/arguments.py 1010-1012) and only the uncalibrated sends (a calibrated send
line is a measured pass cost, left as it is).

The warm-up is not the steady state: without overlap_p2p_comm_warmup_flush (False by default,
model_parallel_config.py 298 at 92c8482e; Bridge does not set it) every warm-up forward, the last one
included, sends its output with a blocking send_forward_recv_forward (wait_on_reqs: schedules.py
1633-1660 at d98e8a64, 1462-1490 at 92c8482e), so those sends hold the sender and the receiver waits
for nothing more. A rank's warm-up is its first (P - rank - 1) x 2 + (V - 1) x P forwards, at most
M x V (get_pp_rank_microbatches; schedule_time.warmup_forwards, whose sends simulate_time holds on
the sender), the forwards torch's interleaved order also runs first (tests/test_stagesends.py;
docs/framework-facts.md §217-§218). Not modelled: two sends to one peer sharing an NCCL stream at P = 2."""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost import comm, runtimes
from planner.cost.layers import LayerCost
from planner.cost.schedule_time import warmup_forwards
from planner.cost.schedules import Schedule
from planner.schema import TrainSetup


def beside_ms(
    order: Schedule, stage_layers: Sequence[Sequence[LayerCost]], view: TrainSetup
) -> list[tuple[float, float]] | None:
    """Per stage (its output's send, its input gradient's send), ms per microbatch, that its runtime runs
    beside the compute (RuntimeFacts.stage_sends_beside), each where it crosses ranks; None where none
    does. `view`: the setup over the schedule's stages (chunked.stages_view), as the terms read it."""
    if not stage_layers:
        return None
    sends = [(output_beside_ms(layers[-1], k, order, view), input_grad_beside_ms(layers[0], k, order, view))
             for k, layers in enumerate(stage_layers)]
    return sends if any(out or back for out, back in sends) else None


def output_beside_ms(last: LayerCost, stage: int, order: Schedule, view: TrainSetup) -> float:
    """The send of `last`'s output, closing pipeline stage `stage`, where the runtime runs it beside the
    compute ("both") and it crosses ranks: the terms' uncalibrated send (comm.stage_send_ms); else 0."""
    if not _beside(order, view, "both") or stage + 1 >= order.num_stages:
        return 0.0
    if order.stage_to_rank[stage] == order.stage_to_rank[stage + 1]:
        return 0.0
    return comm.stage_send_ms(last.output_bytes, view, stage=stage, to=stage + 1)


def input_grad_beside_ms(first: LayerCost, stage: int, order: Schedule, view: TrainSetup) -> float:
    """The send of `first`'s input gradient, opening pipeline stage `stage`, where the runtime runs it
    beside the compute ("backward" or "both") and it crosses ranks; else 0."""
    if not _beside(order, view, "backward", "both") or stage == 0:
        return 0.0
    if order.stage_to_rank[stage] == order.stage_to_rank[stage - 1]:
        return 0.0
    return comm.stage_send_ms(first.input_bytes, view, stage=stage, to=stage - 1)


def warmup_sends(order: Schedule) -> list[dict[int, int]]:
    """Per rank, per stage: how many of the stage's forwards in the rank's warm-up send their output to
    another rank (schedule_time.warmup_forwards): the sends the sender waits for at once, as
    simulate_time holds them, each the stage's output_beside_ms."""
    counts: list[dict[int, int]] = []
    for rank, actions in enumerate(order.actions):
        mine: dict[int, int] = {}
        for a in actions[:warmup_forwards(order, rank)]:
            if a.kind == "F" and a.stage + 1 < order.num_stages and \
                    order.stage_to_rank[a.stage + 1] != rank:
                mine[a.stage] = mine.get(a.stage, 0) + 1
        counts.append(mine)
    return counts


def _beside(order: Schedule, view: TrainSetup, *which: str) -> bool:
    return order.several_stages_a_rank and runtimes.of(view.training).stage_sends_beside in which
