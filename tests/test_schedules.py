"""planner/cost/schedules.py against the closed forms published for each schedule.

Counts are in microbatch-chunks (one microbatch's activations of one chunk, L/(P·V) layers of
an L-layer model split evenly); "layer-range microbatches" (L/P layers, what a 1F1B stage
keeps per microbatch) are those divided by V. Sources:
- 1F1B: stage s of P keeps min(P - s, M) (Narayanan et al. 2021, PipeDream-Flush).
- interleaved 1F1B: Megatron-LM's warm-up, (P - r - 1)·2 + (V - 1)·P forwards, plus the first
  steady forward; rank 0 then keeps L·(1 + (P - 1)/(P·V)) layers' activations (Korthikanti et
  al. 2022); bubble (P - 1)/V·(t_f + t_b) (Narayanan et al. 2021). torch
  counts rounds of M // max(1, M // P) microbatches where Megatron has P.
- ZB-H1 / ZB1P: the activation memory of 1F1B, P·M_B per rank, and bubble (P - 1)(T_F + T_B - T_W)
  with T_B the input-gradient pass (Qi et al. 2023, ZB-H1; DualPipe's README: (PP-1)(F+B-2W),
  B the full backward), for T_W <= T_F.
- ZB-V: P·M_B on every rank, the peak of 1F1B's first stage (Qi et al. 2023, ZB-V; Qi et al. 2024,
  "Pipeline Parallelism with Controllable Memory": V-ZB, 1x of 1F1B).
- DualPipeV: PP + 1 stage-microbatches per device, PP the number of stages, and bubble
  (PP/2 - 1)(F&B + B - 3W) (deepseek-ai/DualPipe README).
Where torch's order and a published form part, the test holds torch's: interleaved rounds
(above); ZB-V and torch's interleaved ZB idle (P - 1)·T_F per rank at T_F = T_I = T_W (the
last rank's wait for its first input, which no order avoids), not zero; DualPipeV's bubble
meets the README only at equal times (a pair costs F + B here, no overlap).
"""

from fractions import Fraction
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from planner.cost.schedule_time import StageTimes, simulate_time
from planner.cost.schedules import (
    SCHEDULES,
    Action,
    ChunkBytes,
    Schedule,
    build_schedule,
    peak_in_flight,
)
from planner.errors import UserError


def activations(schedule):
    return [peak.activations for peak in peak_in_flight(schedule)]


def per_chunk(schedule, **kwargs):
    return [tuple(c.activations for c in peak.chunks)
            for peak in peak_in_flight(schedule, **kwargs)]


def held_for_weight_grad(schedule):
    """Per rank, the peak when everything is kept until W (ChunkBytes(0, 1))."""
    every = [ChunkBytes(freed_at_input_grad=0.0, kept_for_weight_grad=1.0)] * schedule.num_stages
    return [peak.weight_grad_inputs for peak in peak_in_flight(schedule, stage_bytes=every)]


def timeline(schedule, forward_ms, input_grad_ms, weight_grad_ms, send_ms=0.0):
    times = [StageTimes(forward_ms, input_grad_ms, weight_grad_ms)] * schedule.num_stages
    return simulate_time(schedule, stage_times=times, send_ms=send_ms)


def idle_ms(tl):
    return [tl.makespan_ms - busy for busy in tl.busy_ms]


def torch_refuses(cls, *, P, V, M):
    stages = [SimpleNamespace(num_stages=P * V, group_size=P, group_rank=0, submod=None)
              for _ in range(V)]
    single = issubclass(cls, torch_schedules.PipelineScheduleSingle)
    try:
        cls(stages[0] if single else stages, M)
    except ValueError:
        return True
    return False


# --- the orders ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("P,M", [(1, 4), (2, 4), (3, 6), (4, 8), (4, 10), (4, 12), (8, 16)])
def test_every_stage_runs_every_microbatch_once(name, P, M):
    schedule = build_schedule(name, num_ranks=P, num_microbatches=M)
    for stage in range(schedule.num_stages):
        rank = schedule.stage_to_rank[stage]
        kinds = [(a.kind, a.microbatch) for a in schedule.actions[rank] if a.stage == stage]
        forwards = sorted(mb for kind, mb in kinds if kind == "F")
        input_grads = sorted(mb for kind, mb in kinds if kind in "BI")
        weight_grads = sorted(mb for kind, mb in kinds if kind in "BW")
        assert forwards == input_grads == weight_grads == list(range(M))
    simulate_time(schedule, stage_times=[StageTimes(1, 1, 1)] * schedule.num_stages)  # no deadlock


def test_placement_loop_and_v():
    interleaved = build_schedule("interleaved-1F1B", num_ranks=4, num_microbatches=8, num_chunks=3)
    assert [interleaved.stages_of(r) for r in range(4)] == [
        (0, 4, 8), (1, 5, 9), (2, 6, 10), (3, 7, 11)]
    for name in ("ZBV", "DualPipeV"):
        v = build_schedule(name, num_ranks=4, num_microbatches=8)
        assert [v.stages_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]


def test_one_f_one_b_order_is_torchs_but_for_its_last_rank():
    """torch's Schedule1F1B.pipeline_order (visualiser only) agrees with what its runtime runs
    on every rank but the last, where it numbers the forwards 1..M. If this fails on the last
    rank, torch fixed it: read 1F1B's order from torch like GPipe's."""
    P, M = 4, 8
    ours = build_schedule("1F1B", num_ranks=P, num_microbatches=M)
    stage = SimpleNamespace(num_stages=P, group_size=P, group_rank=0, submod=None)
    theirs = torch_schedules.Schedule1F1B(stage, M).pipeline_order
    for rank in range(P):
        torch_actions = [(a.stage_index, a.computation_type.value, a.microbatch_index)
                         for a in theirs[rank]
                         if a is not None and a.computation_type.value in "FB"]
        our_actions = [(a.stage, a.kind, a.microbatch) for a in ours.actions[rank]]
        assert [kind for _, kind, _ in torch_actions] == [kind for _, kind, _ in our_actions]
        if rank < P - 1:
            assert torch_actions == our_actions
        else:
            assert [mb for _, kind, mb in torch_actions if kind == "F"] == list(range(1, M + 1))


# --- refusals: the same as torch's ------------------------------------------------------------


@pytest.mark.parametrize("name,cls,V", [
    ("1F1B", torch_schedules.Schedule1F1B, 1),
    ("GPipe", torch_schedules.ScheduleGPipe, 1),
    ("interleaved-1F1B", torch_schedules.ScheduleInterleaved1F1B, 2),
    ("interleaved-1F1B", torch_schedules.ScheduleInterleaved1F1B, 3),
    ("ZB", torch_schedules.ScheduleInterleavedZeroBubble, 1),
    ("ZB", torch_schedules.ScheduleInterleavedZeroBubble, 2),
    ("ZBV", torch_schedules.ScheduleZBVZeroBubble, 2),
    ("DualPipeV", torch_schedules.ScheduleDualPipeV, 2),
])
def test_refuses_what_torch_refuses(name, cls, V):
    for P in (1, 2, 3, 4, 8):
        for M in range(1, 3 * P + 2):
            try:
                build_schedule(name, num_ranks=P, num_microbatches=M, num_chunks=V)
                refused = False
            except UserError as exc:
                refused = True
                assert str(exc).count(". ") == 0  # one sentence
            assert refused == torch_refuses(cls, P=P, V=V, M=M), (P, M)


def test_refusals_say_why():
    with pytest.raises(UserError, match="at least as many microbatches as stages"):
        build_schedule("1F1B", num_ranks=4, num_microbatches=3)
    with pytest.raises(UserError, match=r"multiple of its 2 rounds.*try 8 or 12"):
        build_schedule("interleaved-1F1B", num_ranks=4, num_microbatches=9)
    with pytest.raises(UserError, match="exactly two chunks"):
        build_schedule("ZBV", num_ranks=4, num_microbatches=8, num_chunks=3)
    with pytest.raises(UserError, match="8 < 16"):
        build_schedule("DualPipeV", num_ranks=8, num_microbatches=8)
    with pytest.raises(UserError, match="one stage per rank"):
        build_schedule("GPipe", num_ranks=4, num_microbatches=8, num_chunks=2)
    with pytest.raises(UserError, match="Unknown pipeline schedule"):
        build_schedule("1f1b", num_ranks=4, num_microbatches=8)


# --- memory: in-flight counts ---------------------------------------------------------------


@pytest.mark.parametrize("P,M", [(1, 1), (2, 2), (4, 4), (4, 9), (8, 16)])
def test_one_f_one_b_keeps_min_p_minus_s_m(P, M):
    schedule = build_schedule("1F1B", num_ranks=P, num_microbatches=M)
    assert activations(schedule) == [min(P - s, M) for s in range(P)]
    assert held_for_weight_grad(schedule) == [min(P - s, M) for s in range(P)]  # B frees it all


@pytest.mark.parametrize("P,M", [(1, 3), (4, 2), (4, 8)])
def test_gpipe_keeps_m(P, M):
    assert activations(build_schedule("GPipe", num_ranks=P, num_microbatches=M)) == [M] * P


def megatron_in_flight(P, V, M, rank):
    """Megatron-LM's interleaved warm-up plus the first steady forward, capped at all of them."""
    return min((P - rank - 1) * 2 + (V - 1) * P + 1, M * V)


@pytest.mark.parametrize("V", [2, 3, 4])
@pytest.mark.parametrize("P,M", [(2, 4), (4, 4), (4, 8), (4, 12), (8, 8), (8, 16), (8, 32)])
def test_interleaved_matches_megatron_when_p_divides_m(P, V, M):
    schedule = build_schedule("interleaved-1F1B", num_ranks=P, num_microbatches=M, num_chunks=V)
    assert activations(schedule) == [megatron_in_flight(P, V, M, r) for r in range(P)]


@pytest.mark.parametrize("P,V", [(2, 2), (4, 2), (4, 4), (8, 2), (8, 3)])
def test_interleaved_rank0_keeps_korthikanti_layers(P, V):
    """L·(1 + (P-1)/(P·V)) layers = P + (P-1)/V layer-range microbatches (L/P layers each)."""
    schedule = build_schedule("interleaved-1F1B", num_ranks=P, num_microbatches=4 * P, num_chunks=V)
    assert Fraction(activations(schedule)[0], V) == P * (1 + Fraction(P - 1, P * V))


@pytest.mark.parametrize("P,M,V", [(4, 10, 2), (4, 6, 2), (4, 3, 2), (8, 20, 2), (4, 15, 3)])
def test_interleaved_uses_torchs_rounds_when_p_does_not_divide_m(P, M, V):
    """torch's warm-up is (V-1)·(M // rounds) + 2·(P-1-r), rounds = max(1, M // P): Megatron's
    with the round size M // rounds in place of P."""
    per_round = M // max(1, M // P)
    schedule = build_schedule("interleaved-1F1B", num_ranks=P, num_microbatches=M, num_chunks=V)
    expected = [min((V - 1) * per_round + 2 * (P - 1 - r) + 1, M * V) for r in range(P)]
    assert activations(schedule) == expected
    if per_round != P:
        assert expected != [megatron_in_flight(P, V, M, r) for r in range(P)]


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_zb_h1_keeps_one_f_one_b_activations_and_p_until_w(P, M):
    """ZB with one chunk (ZB-H1 / ZB1P): the input-gradient pass frees as 1F1B's backward does;
    rank r holds r more microbatches' weight-gradient inputs, P in all: 1F1B's P·M_B."""
    schedule = build_schedule("ZB", num_ranks=P, num_microbatches=M, num_chunks=1)
    assert activations(schedule) == [P - r for r in range(P)]
    assert held_for_weight_grad(schedule) == [P] * P


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (8, 16)])
def test_interleaved_zb_stays_within_one_f_one_b(P, M):
    """torch's ZB with two chunks: P layer-range microbatches until W on every rank."""
    schedule = build_schedule("ZB", num_ranks=P, num_microbatches=M, num_chunks=2)
    assert per_chunk(schedule) == [(P, P - r) for r in range(P)]
    assert held_for_weight_grad(schedule) == [2 * P] * P


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zbv_keeps_p_layer_ranges_on_every_rank(P, M):
    schedule = build_schedule("ZBV", num_ranks=P, num_microbatches=M)
    assert per_chunk(schedule) == [(2 * P - r - 1, r + 1) for r in range(P)]
    assert held_for_weight_grad(schedule) == [2 * P] * P  # = P·M_B, 1F1B's first stage


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_dualpipev_keeps_pp_plus_one_stages(P, M):
    schedule = build_schedule("DualPipeV", num_ranks=P, num_microbatches=M)
    assert held_for_weight_grad(schedule) == [2 * P + 1] * P
    assert per_chunk(schedule) == [(2 * P - r, r + 1) for r in range(P)]


def test_peak_step_depends_on_chunk_bytes():
    """Rank 0 of interleaved P=4, V=2, M=8 runs 0F0-0F6 with 4F0-4F3 in between, then 4B0,
    0F7: (7, 4) in flight after 0F6 (step 10), (8, 3) after 0F7 (step 12)."""
    schedule = build_schedule("interleaved-1F1B", num_ranks=4, num_microbatches=8)

    def rank0(chunk0, chunk1):
        stage_bytes = [ChunkBytes(chunk0 if s < 4 else chunk1) for s in range(8)]
        peak = peak_in_flight(schedule, stage_bytes=stage_bytes)[0]
        return peak.step, peak.live, tuple(c.activations for c in peak.chunks)

    assert rank0(1, 1) == (10, 11, (7, 4))
    assert rank0(1, 2) == (10, 15, (7, 4))
    assert rank0(2, 1) == (12, 19, (8, 3))


# --- time -----------------------------------------------------------------------------------


@pytest.mark.parametrize("P,M", [(1, 3), (2, 2), (4, 4), (4, 8), (8, 16)])
def test_one_f_one_b_makespan_and_bubble(P, M):
    tl = timeline(build_schedule("1F1B", num_ranks=P, num_microbatches=M), 1, 0.5, 0.5)
    assert tl.makespan_ms == (M + P - 1) * 2
    assert tl.bubble_fraction == pytest.approx([(P - 1) / (M + P - 1)] * P)


def test_start_times_by_hand():
    """1F1B, P = M = 2, F = 1, B = 2. Rank 1: F0 1-2, B0 2-4, F1 4-5 (its input came at 2),
    B1 5-7. Rank 0: F0 0-1, F1 1-2, B0 waits for rank 1's B0 (4), B1 for its B1 (7): ends 9."""
    tl = timeline(build_schedule("1F1B", num_ranks=2, num_microbatches=2), 1, 1, 1)
    assert tl.start_ms == ((0, 1, 4, 7), (1, 2, 4, 5))
    assert tl.makespan_ms == 9 and tl.busy_ms == (6, 6)


def test_an_overlapped_pair_waits_for_both_inputs_and_sends_after_both_halves():
    """Two ranks, rank 0 running (F1 of stage 0; B0 of stage 0) as one unit, F = 1, B = 2.
    Rank 1: F0 1-2, B0 2-4. The pair starts at 4 (B0's input), F1 4-5, B0 5-7, and sends F1's
    output at 7: rank 1's F1 7-8, B1 8-10; rank 0's B1 10-12. (Were F1 sent at 5: 10.)"""
    def act(stage, kind, mb, unit):
        return Action(stage, 0, kind, mb, unit)

    toy = Schedule("toy", num_ranks=2, num_chunks=1, num_microbatches=2, stage_to_rank=(0, 1),
                   actions=((act(0, "F", 0, 0), act(0, "F", 1, 1), act(0, "B", 0, 1),
                             act(0, "B", 1, 2)),
                            (act(1, "F", 0, 0), act(1, "B", 0, 1), act(1, "F", 1, 2),
                             act(1, "B", 1, 3))))
    tl = timeline(toy, 1, 1, 1)
    assert tl.start_ms == ((0, 4, 5, 10), (1, 2, 7, 8))
    assert tl.makespan_ms == 12


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_sends_cost_each_crossing_twice_per_boundary(P):
    """One microbatch through GPipe: P forwards and P backwards in a row, 2(P-1) sends."""
    gpipe = build_schedule("GPipe", num_ranks=P, num_microbatches=1)
    tl = timeline(gpipe, 1, 0.5, 0.5, send_ms=0.25)
    assert tl.makespan_ms == 2 * P + 2 * (P - 1) * 0.25


def test_v_turn_sends_nothing():
    tl = timeline(build_schedule("ZBV", num_ranks=1, num_microbatches=4), 1, 1, 1, send_ms=10)
    assert tl.makespan_ms == tl.busy_ms[0] == 24


@pytest.mark.parametrize("V", [2, 3])
@pytest.mark.parametrize("P,M", [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_interleaved_bubble_is_narayanans(P, V, M):
    """Chunks of 1/V of a stage: bubble (P-1)/V·(t_f + t_b) per rank."""
    schedule = build_schedule("interleaved-1F1B", num_ranks=P, num_microbatches=M, num_chunks=V)
    tl = timeline(schedule, 1 / V, 1 / V, 1 / V)
    assert idle_ms(tl) == pytest.approx([(P - 1) / V * 3] * P)


@pytest.mark.parametrize("f,i,w", [(1, 1, 1), (1, 1.5, 0.5), (1, 2, 1), (2, 1, 1), (2, 1, 0.5)])
@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (8, 16)])
def test_zb_h1_bubble_is_qis(P, M, f, i, w):
    tl = timeline(build_schedule("ZB", num_ranks=P, num_microbatches=M, num_chunks=1), f, i, w)
    assert idle_ms(tl) == pytest.approx([(P - 1) * (f + i - w)] * P)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_dualpipev_bubble_at_equal_times(P, M):
    """(PP/2 - 1)(F&B + B - 3W) with F = I = W = 1 (B = 2) and F&B = F + B, as torch runs a pair."""
    tl = timeline(build_schedule("DualPipeV", num_ranks=P, num_microbatches=M), 1, 1, 1)
    assert idle_ms(tl) == pytest.approx([(P - 1) * (3 + 2 - 3)] * P)


@pytest.mark.parametrize("name", ["ZBV", "ZB"])
@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (8, 16)])
def test_zero_bubble_schedules_idle_only_while_the_first_forward_arrives(name, P, M):
    """F = I = W: the last rank of stage P-1 waits (P-1) forwards for its first input; nothing
    else idles."""
    tl = timeline(build_schedule(name, num_ranks=P, num_microbatches=M), 1, 1, 1)
    assert idle_ms(tl) == pytest.approx([P - 1] * P)


@pytest.mark.parametrize("P,M", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_zb_bubble_below_one_f_one_b(P, M):
    """Same work per rank (a stage's F = 1, I + W = B = 2), split or not."""
    one = timeline(build_schedule("1F1B", num_ranks=P, num_microbatches=M), 1, 1, 1)
    zb_h1 = timeline(build_schedule("ZB", num_ranks=P, num_microbatches=M, num_chunks=1), 1, 1, 1)
    zb = timeline(build_schedule("ZB", num_ranks=P, num_microbatches=M), 0.5, 0.5, 0.5)
    assert one.busy_ms == zb_h1.busy_ms == zb.busy_ms
    assert zb.mean_bubble_fraction < zb_h1.mean_bubble_fraction < one.mean_bubble_fraction
