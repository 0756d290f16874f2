"""Each microbatch's input gradient beside torch's pipelining (RuntimeFacts.input_grads_held_to_step_end):
torch 2.6.0's stage_backward leaves it on the microbatch's receive buffer's .grad until the next step's
clear_runtime_states (torchtitan 9dec370 to 2c8b5947); since pytorch#164329 it is dropped once read
(b5bcd76c). Counted at 1F1B's peak (rules.held_input_grads) and made per backward in the replay
(fsdp2_chunks.one_stage_rank)."""

import pytest

from planner.cost import costmodel, reserve_fsdp2, runtimes
from planner.cost.allocator import Alloc
from planner.cost.fsdp2_chunks import rank_events
from planner.cost.layers import layer_costs
from planner.cost.rules import first_layer_buffer_bytes, held_input_grads
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

GIB = 2**30


def _titan(version="9dec370", **fields) -> TrainSetup:
    base = dict(stages=4, microbatches=8, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 4, precision="bf16-mixed",
                runtime="torchtitan", runtime_version=version, dp=4, zero=3, zero_gather="per-iteration")
    return TrainSetup(**(base | fields))


def test_the_records():
    for version in ("9dec370", "bbb1b616", "2c8b5947"):
        assert runtimes.facts("torchtitan", version).input_grads_held_to_step_end
    for runtime, version in (("torchtitan", "b5bcd76c"), ("ckplan", None), ("megatron", None)):
        assert not runtimes.facts(runtime, version).input_grads_held_to_step_end


@pytest.mark.parametrize("stage, held", [(1, 1 + 5), (2, 2 + 5), (3, 3 + 5)])
def test_1f1b_holds_every_backward_before_its_last_steady_one(stage, held):
    """P = 4, M = 8: stage s warms up with min(P - s, M) = 4 - s forwards, then each steady backward runs with
    4 - s in flight; the last of them comes after 8 - (4 - s) = 4 + s backwards, whose gradients stay, and
    makes its own: 5 + s."""
    assert held_input_grads(stage, _titan()) == held


def test_one_at_a_time_where_torch_drops_it_or_the_schedule_peaks_first():
    assert held_input_grads(2, _titan("b5bcd76c")) == 1  # dropped once read (pytorch#164329)
    assert held_input_grads(2, _titan(schedule="interleaved-1F1B", chunks=2)) == 1  # the walk holds its own


def test_gpipe_holds_none_at_its_first_backward():
    """torch 2.13.0's ScheduleGPipe runs every forward, then the backwards, waiting for their sends after the last:
    at the first backward no input gradient is made yet (the later ones' sends: gpipeheld, test_gpipeheld), and the one its first layer makes is in that
    layer's backward transient (measure._transient_bytes: the layer's input needs a gradient). Gemma 3's last stage
    (2 stages, 4 microbatches) measured the 4 receive buffers alone (docs/published-runs.md §44.smallfix)."""
    for version in ("9dec370", "b5bcd76c"):
        assert held_input_grads(2, _titan(version, schedule="GPipe")) == 0
    block = layer_costs(uniform_blocks(8))[3]
    assert first_layer_buffer_bytes(block, 2, _titan(schedule="GPipe")) == 8 * block.input_bytes
    assert first_layer_buffer_bytes(block, 2, _titan(schedule="1F1B")) == (8 + 7) * block.input_bytes


def test_the_buffers_term_counts_them():
    profile = uniform_blocks(8)
    block = layer_costs(profile)[3]
    # 8 receive buffers (one a microbatch) and stage 2's 7 input gradients; under b5bcd76c the one being sent
    assert first_layer_buffer_bytes(block, 2, _titan()) == (8 + 7) * block.input_bytes
    assert first_layer_buffer_bytes(block, 2, _titan("b5bcd76c")) == (8 + 1) * block.input_bytes
    assert first_layer_buffer_bytes(block, 0, _titan()) == 0


def _stage_one(held: bool, monkeypatch):
    """Stage 1 of a 2-stage 1F1B over 4 microbatches under torchtitan 9dec370, as the replay takes it, with
    the record's input gradients held to the step's end or not (the rest of the record as it is)."""
    import dataclasses

    from tests.test_fsdp2_chunks import _cuda

    record = dataclasses.replace(runtimes.facts("torchtitan", "9dec370"), input_grads_held_to_step_end=held)
    monkeypatch.setattr(runtimes, "of", lambda training: record)
    profile = _cuda(uniform_blocks(4))
    setup = _titan(stages=2, microbatches=4, mem_caps_bytes=[80 * GIB] * 2)
    stages = costmodel.split_to_stages([0, 3], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup)
    return profile, cost.stages[1], reserve_fsdp2.stage_of(stages[1], cost.stages[1], stage=1, profile=profile,
                                                           setup=setup)


def test_the_replay_makes_each_at_its_backward_and_keeps_it_to_the_next_step(monkeypatch):
    """Stage 1 of 2, M = 4 (1 in flight, so 4 - 1 + 1 = 4 counted among the buffers, 3 more than the one
    being sent): the replay makes one at each of the 4 backwards, in the order of torch's actions, and its
    buffers hold none of them (one fewer than where the one being sent is among them)."""
    profile, cost, rank = _stage_one(True, monkeypatch)
    grad = profile.layers[3].input_bytes
    _, one_cost, one_rank = _stage_one(False, monkeypatch)
    assert (rank.input_grad_bytes, one_rank.input_grad_bytes) == ((grad,), (0,))
    assert cost.buffer_bytes - one_cost.buffer_bytes == 3 * grad
    assert rank.buffer_bytes == one_rank.buffer_bytes - grad
    events = rank_events(rank, steps=1)
    made = [e.key for e in events if isinstance(e, Alloc) and e.key[0] == "input_grad"]
    assert made == [("input_grad", 0, mb) for mb in range(4)]
    # each made once its microbatch's backward has freed the first layer's kept input, before the next one's
    from planner.cost.allocator import Free

    freed = [events.index(Free(("chunk", 0, ("kept", mb, 0)))) for mb in range(4)]
    at = [events.index(Alloc(("input_grad", 0, mb), grad, 0)) for mb in range(4)]
    assert all(f < a for f, a in zip(freed, at)) and all(a < f for a, f in zip(at, freed[1:]))


def test_an_interleaved_rank_makes_each_once(monkeypatch):
    """A rank of two chunks past the first stage (P = 2 x V = 2, rank 1: stages 1 and 3): where torch holds the
    input gradients to the step's end (the record's sends_held_to_step_end: the walk's per microbatch), the
    replay makes one per backward and its buffers hold none of them (the rank's drop the one being sent)."""
    import dataclasses

    from tests.test_fsdp2_chunks import _cuda, _interleaved_ranks

    profile = _cuda(uniform_blocks(6))
    setup = _titan(stages=2, microbatches=4, mem_caps_bytes=[80 * GIB] * 2, schedule="interleaved-1F1B", chunks=2)
    ranks = _interleaved_ranks(profile, [0, 3, 5, 6])
    made = {}
    for held in (True, False):
        record = dataclasses.replace(runtimes.facts("torchtitan", "9dec370"), sends_held_to_step_end=held)
        monkeypatch.setattr(runtimes, "of", lambda training, record=record: record)
        cost = costmodel.evaluate(ranks, profile, setup)
        made[held] = (cost.stages[1].buffer_bytes,
                      reserve_fsdp2.stage_of(ranks[1], cost.stages[1], stage=1, profile=profile, setup=setup))
    grads = [profile.layers[3].input_bytes, profile.layers[6].input_bytes]  # stage 1's input, stage 3's
    assert made[True][1].input_grad_bytes == tuple(grads) and made[False][1].input_grad_bytes == (0, 0)
    # the rank's buffers drop the one being sent where the walk holds them (score.rank_cost), and so the replay's
    assert made[False][0] - made[True][0] == sum(grads)
    assert made[False][1].buffer_bytes - made[True][1].buffer_bytes == sum(grads)
