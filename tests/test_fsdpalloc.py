"""Megatron-FSDP's allocated peak in the cost model as the code holds it (planner/cost/megatron_fsdp_moments.py): the
double buffer's stage constant is the edges and the slots only; the output layer's bucket is queued through the
last unit's backward and its bf16 gradient lives in its own backward and post-backward; a unit's backward frees what
Transformer Engine's nodes saved node by node (te_block_backward.program). By hand on the tiny LLaMA of
tests/test_bridge_memory.py under Float8 on GB200's neighbour b200 (no FP8 transpose), and against the caching
allocator's replay of the same step (reserve_megatron_fsdp.py)."""

from __future__ import annotations

import pytest
from test_bridge_memory import profile, setup

from planner.cost import (
    costmodel,
    float8,
    megatron_fsdp,
    megatron_fsdp_moments,
    te_block_backward,
    te_kept,
)
from planner.cost.allocator import Alloc
from planner.cost.layers import layer_costs
from planner.cost.reserve import plan_records
from planner.cost.reserve_megatron import _output_bytes, last_stage_loss
from planner.cost.reserve_megatron_fsdp import (
    backward_programs,
    replay_stage,
    static_of,
    step_player,
)
from planner.cost.terms import Context
from planner.schema import StagePlan

SIX = (128, 16384, 8192, 128, 40960, 20480)  # Megatron's six bf16 gradients of the tiny block (tests/test_b3replay.py)


def _job(unfused=True, double=True):
    job = setup(float8=True, fp8_all_gather=True, dp=4, zero=3, fsdp_double_buffer=double, microbatches=2,
                unfused_grad_accumulation=unfused, grad_reduce_bf16=True)
    tiny = float8.float8_profile(profile("b200"), job)
    return tiny, job, StagePlan(index=0, layers=[layer.name for layer in tiny.layers], checkpointed=[])


def test_the_blocks_backward_peak_node_by_node_and_in_the_records_order_by_hand():
    tiny, job, _ = _job()
    record = tiny.layers[1].alloc_records["none"]
    program = te_block_backward.program(record, te_kept.te_saved_inputs(tiny))
    # over what the forward left: node by node the most is at SwiGLU's second half, fc2's gradient 20480 + its
    # wgrad 20480 - its FP8 input 10240 + the 2f-wide gradient 2 x 20480; in the record's order its three 20480
    # (the gradients then freed at the layer's end), and with the six gradients at its last allocation (the
    # input's 8192, fc2's gradient gone): 3 x 20480 - 20480 + 8192 + 86272
    assert megatron_fsdp_moments.backward_peak(record, program, SIX) == 20480 + 20480 - 10240 + 2 * 20480
    assert megatron_fsdp_moments.backward_peak(record, None, ()) == 3 * 20480
    assert megatron_fsdp_moments.backward_peak(record, None, SIX) == 3 * 20480 - 20480 + 8192 + sum(SIX)
    # the shift from the record's order the extra holds: fc2's gradient made, its FP8 input freed: +10240;
    # fused, no gradient made: fc2's FP8 input freed before SwiGLU's two halves: -10240
    count = megatron_fsdp.held(tiny, job)[1][0]
    assert count * 2 == sum(SIX)
    assert megatron_fsdp_moments.unit_shift(tiny.layers[1], "none", count, tiny, job) == 10240
    fused_tiny, fused, _ = _job(unfused=False)
    assert megatron_fsdp_moments.unit_shift(fused_tiny.layers[1], "none", count, fused_tiny, fused) == -10240


def test_the_double_buffers_constant_is_the_edges_and_the_slots_and_the_moments_are_the_layers_extras():
    tiny, job, plan = _job()
    # the embedding's and the head's weights gathered whole in bf16 (8192 + 8256 parameters: 32,896 B), two slots of
    # a block's weights (43,008 Float8 at 1 B, the two norms' 128 at 2 B) and two of its bf16 gradient bucket
    # (43,136 x 2 B); nothing of the head's bucket or gradient (main charged the larger moment here)
    assert [row[0] for row in megatron_fsdp.held(tiny, job)] == [8192, 43136, 43136, 8256]
    constant = 32896 + 2 * (43008 + 128 * 2 + 43136 * 2)
    assert megatron_fsdp.buffer_bytes(tiny, 0, job) == constant
    stage = costmodel.evaluate([plan], tiny, job).stages[0]
    assert stage.buffer_bytes == constant + 512  # the batch: rules.batch_bytes
    # the last block's extra: its profiled 69,632 + the head's bucket queued (8256 x 2 B) + its node-by-node shift
    # 10240; net of the head's kept 16,640 and the loss's logits 32,772, gone by then
    assert stage.transient_bytes == 69632 + 8256 * 2 + 10240 - 16640 - 32772
    # fused: the shift is fc2's FP8 input freed before SwiGLU's peak, no gradient made
    fused_tiny, fused, fused_plan = _job(unfused=False)
    assert costmodel.evaluate([fused_plan], fused_tiny, fused).stages[0].transient_bytes == \
        69632 + 8256 * 2 - 10240 - 16640 - 32772


def _replay_live_peak(tiny, job, plan, cost) -> int:
    """The replay's allocated peak without the caching allocator's 512 B rounding: the sum of its live requests."""
    layers, options, records = plan_records(plan, tiny)
    loss, keeps = last_stage_loss(tiny, job, _output_bytes(records[-1]))
    events, one_step = step_player(layers, options, records, static=static_of(layers, cost, profile=tiny, setup=job),
                                   num_microbatches=job.pipeline.microbatches, loss=loss, keeps_logits=keeps,
                                   programs=backward_programs(layers, records, tiny))
    live, now, peak = {}, 0, 0
    for event in [*events, *one_step(0), *one_step(1), *one_step(2)]:
        if isinstance(event, Alloc):
            live[event.key] = event.nbytes
            now += event.nbytes
        else:
            now -= live.pop(event.key, 0)
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("unfused", [True, False])
def test_the_cost_models_allocated_peak_is_the_replays(unfused):
    tiny, job, plan = _job(unfused)
    cost = costmodel.evaluate([plan], tiny, job).stages[0]
    # the same bytes at the same instant (the last block's SwiGLU backward, step 1): the cost model holds 512 B
    # more, the token ids the embedding's profile keeps that its record does not make (not Megatron-FSDP's)
    assert cost.peak_bytes - _replay_live_peak(tiny, job, plan, cost) == 512
    # the allocator's rounding (the 256 B statistics at 512) lifts the replay's own figure alike either way
    replayed = replay_stage(plan, cost, profile=tiny, setup=job)
    assert replayed.allocated_peak_bytes - cost.peak_bytes == 8704


def test_each_moment_goes_to_its_layer_and_only_under_the_double_buffer():
    tiny, job, _ = _job()
    layers = layer_costs(tiny)
    ctx = Context(tiny, job)
    zero = [{"extra": 0.0, "kept": 0.0} for _ in layers]
    head_input = layers[3].input_bytes
    got = megatron_fsdp_moments.stage_moments(layers, [0] * 4, zero, stage=0, ctx=ctx)
    # the embedding: nothing of its own here; block 1: its shift 10240, or its post-backward (its six bf16 gradients
    # 86,272 and its input's gradient, nothing kept here) where larger; block 2, the last: the head's bucket (8256 x
    # 2 B) queued beside either; the head: its post-backward, its bucket and its bf16 gradient beside its input's
    # gradient (its extra 0 + its gradient is the smaller arm)
    assert [values["extra"] for values in got] == [
        0.0, max(10240, 86272 + layers[1].input_bytes), 16512 + max(10240, 86272 + layers[2].input_bytes),
        16512 + 16512 + head_input]
    # a large profiled extra: the moments ride on it; the head's gradient beside its own backward's scratch
    big = [{"extra": 10**6, "kept": 0.0} for _ in layers]
    got = megatron_fsdp_moments.stage_moments(layers, [0] * 4, big, stage=0, ctx=ctx)
    assert [values["extra"] for values in got] == [10**6, 10**6 + 10240, 10**6 + 16512 + 10240, 10**6 + 16512]
    # without the double buffer the stage constant keeps them (megatron_fsdp.buffer_bytes): nothing moves here
    single = setup(float8=True, fp8_all_gather=True, dp=4, zero=3, microbatches=2, unfused_grad_accumulation=True,
                   grad_reduce_bf16=True)
    assert megatron_fsdp_moments.stage_moments(layers, [0] * 4, big, stage=0, ctx=Context(tiny, single)) is big
