"""torch 2.6.0's all-gather context-parallel ring as the allocations it makes (planner/cost/cpring.py), counted by
hand request by request on a tiny shape, its peak as the cost model's buffer charge
(contextparallel.buffer_bytes), and played inside a block's backward in FSDP2's replay
(fsdp2_layers.backward_hand_ring): where, beside what, and leaving the replay's allocated peak the cost model's."""

from planner.cost import allocator, contextparallel, cpring
from planner.cost.fsdp2_events import Fsdp2Layer, Fsdp2Stage, _PipelineStep
from planner.cost.fsdp2_layers import backward_hand, backward_hand_ring, grads_order
from planner.cost.layers import ExchangeCost
from planner.profiler.allocseq import synthesised
from planner.schema import LayerProfile

Q, KV = 10, 100  # Q (and O) bytes, K with V bytes, bf16


def test_the_eager_forward_at_cp_2_request_by_request():
    # K, V copies (1, 2), the concatenation (3), the gathered K/V (4), step 0's output (5) and its fp32 cast (6);
    # step 1: the wait frees the concatenation and the copies; its output (7), step 0's freed; the cast (8), the
    # difference (9), the product (10), the difference freed, the new running output (11), the product, the old
    # running output and the cast freed; the end: the gathered, the last output and the running output freed
    assert cpring.forward_program(2, Q, KV, compiled=False) == (
        50, 50, 100, 200, 10, 20, -3, -1, -2, 10, -5, 20, 20, 20, -9, 20, -10, -6, -8, -4, -7, -11)
    # its peak: before the wait, 50 + 50 + 100 + 200 + 10 + 20
    assert cpring.peak(cpring.forward_program(2, Q, KV, compiled=False)) == 430


def test_the_compiled_backward_after_its_rerun_at_cp_2_request_by_request():
    program = cpring.backward_program(2, Q, KV, compiled=True, rerun=True, reuse_gather=True)
    # the rerun: the concatenation (1, repeat_kv's copy), the gathered K/V (2), step 0's output (3); the wait frees
    # the concatenation; step 1's output (4), the merge kernel's fp32 output (5), both outputs dead after it; the
    # merged output freed at the end (the bf16 cast is the record's); the gathered K/V kept: the backward reuses it
    rerun = (100, 200, 10, -1, 10, 20, -4, -3, -5)
    # the backward, each buffer freed after its last use: step 0's dq, dk, dv (6, 7, 8) and, inside the call,
    # flash's fp32 dQ accumulator (9, 2 Q, freed when it returns); fp32 dQ (10) from dq; the send buffer (11) from
    # dk, dv; the received (12); step 1's dq, dk, dv on half the keys (13, 14, 15), its accumulator (16); the
    # gathered K/V's last use; the sent buffer freed at the wait, the next (17) from the received one and dk, dv,
    # all three freed; the received (18); a new fp32 dQ (19), the old and dq freed; the end: dQ in bf16 (20), the
    # fp32 freed, the last sent freed at the wait, dK/dV in bf16 (21), the received freed; the bf16 outputs freed
    backward = (10, 50, 50, 20, -9, 20, -6, 200, -7, -8, 200, 10, 25, 25, 20, -16, -2, -11, 200, -12, -14, -15,
                200, 20, -10, -13, 10, -19, -17, 100, -18, -20, -21)
    assert program == rerun + backward
    # at step 1's flash call: the gathered K/V, fp32 dQ, the sent and the received buffers, the step's gradients
    # and flash's accumulator
    assert cpring.peak(program) == 200 + 20 + 200 + 200 + 10 + 25 + 25 + 20


def test_the_eager_backwards_peak_at_cp_8_by_hand():
    # at a middle step's new received buffer: fp32 dQ (2 Q), the gathered K/V (8 KV), the concatenation (KV), a
    # step's gradients (Q + KV / 2), dK and dV's partial updates (2 KV), the send buffer and the received ones,
    # old and new (6 KV)
    program = cpring.backward_program(8, Q, KV, compiled=False, rerun=False, reuse_gather=False)
    assert cpring.peak(program) == 2 * Q + 8 * KV + KV + Q + KV // 2 + 2 * KV + 6 * KV
    # every tensor freed by the end
    assert sum(1 for code in program if code > 0) == sum(1 for code in program if code < 0)
    # where Q is half of K with V (torchtitan's repeated K/V: C8's 128 and 256 MiB) the peak is step 1's flash call
    # instead: fp32 dQ, the gathered K/V, the concatenation, step 0's gradients (Q + KV) beside step 1's (Q +
    # KV / 2), the fp32 dK, dV, the sent and received buffers (4 KV) and flash's fp32 dQ accumulator (2 Q)
    q, kv = 128, 256
    program = cpring.backward_program(8, q, kv, compiled=False, rerun=False, reuse_gather=False)
    assert cpring.peak(program) == 2 * q + 8 * kv + kv + q + kv + q + kv // 2 + 2 * kv + 4 * kv + 2 * q == 4992


def test_flashs_accumulator_is_the_compiled_backwards_peak_at_c8s_shape():
    # C8: Q 128 MiB, K with V 256 MiB (repeated to the 16 query heads a TP rank holds), CP 8: at a later step's
    # flash call the gathered K/V (8 KV), fp32 dQ (2 Q), sent and received (4 KV), the step's dq (Q) and half-width
    # dK, dV (KV / 2), the accumulator (2 Q): (cp + 4.5) KV + 5 Q, 128 MiB over the (cp + 4) KV + 5 Q before it
    q, kv = 128, 256
    program = cpring.backward_program(8, q, kv, compiled=True, rerun=True, reuse_gather=True)
    assert cpring.peak(program) == 8 * kv + 2 * q + 4 * kv + q + kv // 2 + 2 * q == 3840


def test_the_cost_models_charge_is_the_programs_peak():
    ring = ExchangeCost(ranks=4, q_bytes=Q, kv_bytes=KV, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
    for compiled in (False, True):
        assert contextparallel.buffer_bytes(ring, "allgather", compiled=compiled) == (
            cpring.peak(cpring.forward_program(4, Q, KV, compiled=compiled)),
            cpring.peak(cpring.backward_program(4, Q, KV, compiled=compiled, rerun=False, reuse_gather=False)))
    # compiled, the merge's intermediates and the per-step concatenations are fused away: less held
    eager, compiled = (contextparallel.buffer_bytes(ring, "allgather", compiled=c) for c in (False, True))
    assert compiled[0] < eager[0] and compiled[1] < eager[1]


def _block() -> LayerProfile:
    # kept: the input (100), 200, 400; output 100; transient 550 = the incoming 100 + SwiGLU's three 150s
    fields = dict(name="b", kind="decoder_block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2,
                  bwd_ms_max=2, act_bytes=700, input_bytes=100, output_bytes=100, input_in_act_bytes=100,
                  param_count=10, param_bytes=20, transient_bytes=550)
    return synthesised(LayerProfile(**fields), [100, 200, 400], scratch_terms=[150, 150, 150], scratch_freed_early=1)


def test_the_ring_is_played_after_the_rerun_and_the_program_peaks_at_the_charge():
    ring = (300, 400, -1, 200, -2, -3)  # its peak 700
    # the charge as the cost model makes it: the ring's peak + the received gradient over the transient
    charge = 700 + 100 - 550
    program, hands, ring_ids = backward_hand_ring(_block(), "full", 1150 + charge, ring, charge)
    # incoming 100; the rerun 200, 400; then the ring (ids 4-6), nothing beside it (its peak is the charge's); then
    # the record's scratch, its input gradient (id 10, handed on) as before
    assert program == (100, 200, 400, 300, 400, -4, 200, -5, -6, 150, 150, 150, -7, 100, -9, -8, -3, -2)
    assert hands == 10 and ring_ids == frozenset({4, 5, 6})
    assert cpring.peak(program) == 1150 + charge
    # the weights' gradients: w2's where the record makes the first tensor it frees (code 9), not the ring's
    assert grads_order("decoder_block", 9, program, hands, input_grad_first=False, skip=ring_ids)[0] == (9, 5)
    # a charge above the ring's own peak: the rest one tensor beside it, freed with it
    program, hands, ring_ids = backward_hand_ring(_block(), "full", 1150 + charge + 40, ring, charge + 40)
    assert program[3:10] == (40, 300, 400, -5, 200, -6, -7) and program[10] == -4
    assert cpring.peak(program) == 1150 + charge + 40 and hands == 11
    # no ring (another exchange): backward_hand's, the charge in the one tensor after the incoming
    assert backward_hand_ring(_block(), "full", 1200, (), 50) == (*backward_hand(_block(), "full", 1200), frozenset())


def test_without_a_recompute_the_ring_comes_first_and_the_replay_holds_the_charge():
    ring = (300, 400, -1, 200, -2, -3)
    charge = 700 + 100 - 550
    # none: the record's backward is the scratch alone; the ring before it
    program, hands, _ = backward_hand_ring(_block(), "none", 550 + charge, ring, charge)
    assert program[:7] == (100, 300, 400, -2, 200, -3, -4)
    mib = 2**20  # in MiB, so the allocator's rounding leaves the sizes as they are
    layer = Fsdp2Layer(unit=0, kept_bytes=0, extra_bytes=(550 + charge) * mib, gathered=(), grads=(), shard=(),
                       state=(), scratch=(), extra_program=tuple(c * mib if c > 0 else c for c in program), hands=hands)
    stage = Fsdp2Stage(layers=(layer,), kept_from_forward=frozenset({0}), shard_group=1, reduce_ratio=2.0,
                       buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0, actions=(("F", 0), ("B", 0)))
    events: list = []
    _PipelineStep(stage, events).run()
    assert allocator.replay(events).allocated_peak_bytes == (550 + charge) * mib
