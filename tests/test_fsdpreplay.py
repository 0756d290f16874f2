"""Megatron-FSDP's step under its double buffer with Transformer Engine's window offload as the caching allocator's
replay (planner/cost/reserve_megatron_fsdp.py): a tiny stage counted by hand (an embedding, four blocks of which
the first two are offloaded, the head), the order of the offloaded groups' drops and reloads, the slots made once,
the head's gradient bucket freed at the second block's post-backward, and the hook choosing the replay."""

import json

from fixtures.cli import run_ok

from planner import io
from planner.cost import allocator, reserve_megatron_fsdp
from planner.cost.allocator import Alloc, Free
from planner.cost.reserve_megatron_fsdp import FsdpLayer, FsdpStatic, step_player
from planner.models.synthetic import uniform_blocks
from planner.schema import AllocRecord, TrainSetup

MIB = 2**20
GIB = 2**30


class _Option:
    def __init__(self, name, kept_bytes):
        self.name, self.kept_bytes = name, kept_bytes


class _Layer:  # what the passes read of a LayerProfile
    input_in_act_bytes = 0

    def __init__(self, kind, options=()):
        self.kind, self.recompute_options = kind, options


EMBED = AllocRecord(forward=[4 * MIB], output=1)
# a block: it saves 8 MiB and its 4 MiB input (none's kept 12 MiB > the 8 its record leaves: it keeps its input),
# makes a 4 MiB output; its backward makes the 4 MiB input gradient and frees what it saved
BLOCK = AllocRecord(forward=[8 * MIB, 4 * MIB], backward=[4 * MIB, -1], output=2, input_grad=3)
HEAD = AllocRecord(forward=[16 * MIB], backward=[4 * MIB], output=1, input_grad=2)  # the logits, kept by the loss
LOSS = AllocRecord(forward=[1 * MIB], backward=[-1])
LAYERS = [_Layer("embedding"), *[_Layer("decoder_block", (_Option("none", 12 * MIB),)) for _ in range(4)],
          _Layer("norm+lm_head")]
OPTIONS = ["none", "offload", "offload", "none", "none", "none"]
RECORDS = [EMBED, BLOCK, BLOCK, BLOCK, BLOCK, HEAD]
EDGE = FsdpLayer(shards=(), moment=0, step_grad=0, unit=False, gathered=(6 * MIB,), bucket=6 * MIB,
                 unfused=(6 * MIB,))
UNIT = FsdpLayer(shards=(), moment=0, step_grad=0, unit=True, gathered=(2 * MIB, 1 * MIB), bucket=2 * MIB,
                 unfused=(1 * MIB, 1 * MIB))
STATIC = FsdpStatic(layers=(EDGE, UNIT, UNIT, UNIT, UNIT, EDGE), rest_bytes=0)


def _step(index=0):
    static, one_step = step_player(LAYERS, OPTIONS, RECORDS, static=STATIC, num_microbatches=1, loss=LOSS,
                                   keeps_logits=True)
    return static, one_step


def test_a_step_by_hand_the_window_drops_and_reloads_the_slots_and_the_unfused_gradients():
    static, one_step = _step()
    state = allocator.CachingAllocator()
    allocator.play(state, static)
    allocator.play(state, one_step(0))
    # by hand (MiB): the embedding gathered 6 and its output 4; the first block's pre-forward makes both weight
    # slots (2 x (2 + 1)); blocks 1-4 each keep 8 + 4; group 1 (block 1's 8 and its input, the embedding's 4) is
    # dropped after block 2's forward (window [1, 3] over four blocks, two offloaded), group 2 (8 + block 1's
    # output 4) after block 4's: 40 held; the head gathered 6, the logits 16, block 4's output freed (the head
    # keeps no input), the loss 1: 59, 62 at the logits. Backward: the loss freed (58); the head's input
    # gradient 4 and its bf16 gradient 6 (68), the logits freed, its bucket 6 made and the gradient dropped
    # (52); block 4: group 2 reloaded before it (8 + 4: 64), its input gradient 4 and bf16 gradients 2: 70,
    # the step's most
    assert state.allocated_peak == 70 * MIB
    # what the step leaves: the four slots (2 x 3 weights, 2 x 2 gradients); the edges' gathers freed at reset()
    assert state.allocated == 10 * MIB
    assert (static, one_step(1)[:1]) == ([Alloc(("rest",), 0)], [Alloc(("edge", 1, 0), 6 * MIB)])


def test_the_offloaded_groups_leave_after_their_window_and_come_back_before_it():
    events = _step()[1](0)
    key = (0, 0)  # step 0, microbatch 0

    def at(event):
        return events.index(event)

    # group 1 (block 1's input, the embedding's output, then its saved tensor: TE's push order, §379) leaves once
    # block 2's forward ends
    assert at(Alloc((key, 2, 2), 4 * MIB)) < at(Free((key, 0, 1))) < at(Alloc((key, 3, 1), 8 * MIB))
    assert at(Free((key, 1, 1))) == at(Free((key, 0, 1))) + 1
    # and is made again before block 2's backward (its input gradient), freed with block 1's
    assert at(Alloc((key, 3, 3), 4 * MIB)) < at(Alloc(("back", key, 1, 1), 8 * MIB)) < at(Alloc((key, 2, 3), 4 * MIB))
    assert at(Alloc((key, 1, 3), 4 * MIB)) < at(Free(("back", key, 1, 1))) < at(Free(("back", key, 0, 1)))
    # group 2 comes back before block 4's backward, the last block's: with the head's bucket still queued
    assert at(Alloc(("gbucket", key, 5), 6 * MIB)) < at(Alloc(("back", key, 2, 1), 8 * MIB)) < at(Alloc((key, 4, 3), 4 * MIB))


def test_the_slots_are_made_once_and_the_heads_bucket_leaves_at_the_second_blocks_post_backward():
    static, one_step = _step()
    steps = [one_step(0), one_step(1)]
    slots = [e for step in steps for e in step if isinstance(e, Alloc) and e.key[0] in ("wslot", "gslot")]
    assert [e.key for e in slots] == [("wslot", 0, 0), ("wslot", 0, 1), ("wslot", 1, 0), ("wslot", 1, 1),
                                      ("gslot", 0), ("gslot", 1)]
    assert not [e for step in steps for e in step if isinstance(e, Free) and e.key[0] in ("wslot", "gslot")]
    events, key = steps[0], (0, 0)
    # _enforce_double_buffer_limit: block 4's bucket queued beside the head's; block 3's request waits for the head's
    assert events.index(Alloc(("gslot", 0), 2 * MIB)) < events.index(Free(("gbucket", key, 5))) \
        < events.index(Alloc(("gslot", 1), 2 * MIB))
    # each layer's bf16 gradients dropped in its post-backward, after its bucket is there
    assert events.index(Alloc(("gbucket", key, 0), 6 * MIB)) < events.index(Free(("wgrad", key, 0, 0)))


def _setup(double=True, stages=1, zero=3):
    setup = TrainSetup(stages=stages, microbatches=2, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * stages)
    return setup.model_copy(update={
        "training": setup.training.model_copy(update={"runtime": "megatron", "precision": "bf16-mixed"}),
        "data_parallel": setup.data_parallel.model_copy(update={"dp": 4, "zero": zero, "fsdp_double_buffer": double})})


def test_the_replay_runs_megatron_fsdps_double_buffer_on_one_stage_only():
    assert reserve_megatron_fsdp.replays(_setup())
    assert not reserve_megatron_fsdp.replays(_setup(double=False))  # buckets per unit, another stream: not read
    assert not reserve_megatron_fsdp.replays(_setup(stages=2))
    assert not reserve_megatron_fsdp.replays(_setup(zero=1))  # the distributed optimizer's replay (reserve_megatron)


def test_the_cli_reserve_of_a_double_buffered_megatron_fsdp_job_is_the_replays(tmp_path):
    base = uniform_blocks(4)
    record = AllocRecord(forward=[2 * MIB, 1 * MIB], backward=[1 * MIB, -1], output=2, input_grad=3)
    layers = [layer.model_copy(update={"alloc_records": {"none": record, "full": record}}) for layer in base.layers]
    profile = base.model_copy(update={"layers": layers, "device": base.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**base.assumptions, "gpu": "h100"}})
    path = tmp_path / "cuda.json"
    io.save_profile(profile, path)
    common = ["evaluate", "--profile", path, "--layers-per-stage", str(len(profile.layers)), "--ckpt-per-stage", "0",
              "--dp", "4", "--microbatches", "2", "--mem", "80GB", "--precision", "bf16-mixed", "--runtime",
              "megatron", "--zero", "3", "--json"]
    stages = [json.loads(run_ok(*common, *extra).stdout)["hand"]["stages"][0] for extra in ((), ("--fsdp-double-buffer",))]
    assert stages[0]["reserved_by"] != "replay"  # no double buffer: the divisor
    assert stages[1]["reserved_by"] == "replay"
    assert stages[1]["peak_bytes"] <= stages[1]["reserved_bytes"] < stages[0]["reserved_bytes"]
    # the allocator's setting reaches this replay (reserve_megatron.allocator_setting_refused lets it through)
    expandable = json.loads(run_ok(*common, "--fsdp-double-buffer", "--expandable-segments").stdout)
    assert expandable["hand"]["stages"][0]["reserved_by"] == "replay"


def _first_step_peak(count, handler):
    options = ["none", *["offload"] * count, *["none"] * (4 - count), "none"]
    static, one_step = step_player(LAYERS, options, RECORDS, static=STATIC, num_microbatches=1, loss=LOSS,
                                   keeps_logits=True, handler=handler)
    state = allocator.CachingAllocator()
    allocator.play(state, static)
    allocator.play(state, one_step(0))
    settled = allocator.settled_replay(static, one_step, min_steps=2, max_steps=4)
    return state.allocated_peak // MIB, settled.reserved_peak_bytes


def test_the_window_is_the_handlers_the_record_names_at_n_0_to_3():
    """The tiny stage's first step at N = 0..3 offloaded blocks (a group: a block's 8 saved and its 4 input, 12 MiB)
    under TE v2.9's map (L = 4: [3], [1, 3], [1, 2, 3]) and v2.10's (window[i] = L - N - 1 + i: [2], [1, 2],
    [0, 1, 2]), by hand (MiB). Every group is dropped by the head's forward (v2.9's last window is the last block,
    v2.10's the one before), so the head's backward holds 92 - 12 N (N = 0: the edges' 6 + 6, the embedding's
    output 4, the slots 6, four blocks' 12 less block 4's output, the logits 16, the head's input gradient 4 and
    bf16 gradient 6). The last block's backward starts at 76 - 12 N (the head's gradient 4 left, its bucket 6 for
    its gradient) and adds its input gradient 4 and bf16 gradients 2, and v2.9 reloads its last group there: 82 -
    12 N + 12, so v2.9 peaks there, 82 at N = 1 and 70 at N = 2; at N = 3 it is 58, and block 3 holds 60: block
    4's frees leave 66 - 12 N + 12 (the reloaded last group), block 3 reloads group 1 and adds 4 + 2. v2.10 reloads
    nothing before block 3's backward (its last window is block 3), where it holds 66 - 12 N + 12 + 6 at most: its
    peak is the head's, 92 - 12 N."""
    hand = {"v2.9": [92, 82, 70, 60], "v2.10": [92, 80, 68, 56]}
    found = {handler: [_first_step_peak(count, handler) for count in range(4)] for handler in hand}
    assert {handler: [peak for peak, _ in peaks] for handler, peaks in found.items()} == hand
    needs = {handler: [need for _, need in peaks] for handler, peaks in found.items()}
    assert needs["v2.10"][0] == needs["v2.9"][0]  # no window: one replay
    assert all(needs["v2.10"][n] <= needs["v2.9"][n] for n in range(4))


def test_v2_10_holds_a_reloaded_group_to_the_next_blocks_backward():
    # N = 2 under v2.10 (window [1, 2]): group 1 (block 2's 8 saved, block 1's output 4) comes back before block 3's
    # backward and stays allocated through block 2's own backward, released as block 1's begins (bwd_step, before
    # its reloads: §428); group 0 (block 1) comes back before block 2's and is released at the backward's end,
    # after the embedding's backward; v2.9 frees each with its own layer's backward
    options = ["none", "offload", "offload", "none", "none", "none"]
    events = step_player(LAYERS, options, RECORDS, static=STATIC, num_microbatches=1, loss=LOSS, keeps_logits=True,
                         handler="v2.10")[1](0)
    key = (0, 0)

    def at(event):
        return events.index(event)

    assert at(Alloc((key, 4, 3), 4 * MIB)) < at(Alloc(("back", key, 2, 1), 8 * MIB)) < at(Alloc((key, 3, 3), 4 * MIB))
    assert at(Alloc(("back", key, 2, 1), 8 * MIB)) < at(Alloc(("back", key, 1, 1), 8 * MIB)) < at(Alloc((key, 2, 3), 4 * MIB))
    assert at(Alloc((key, 2, 3), 4 * MIB)) < at(Free(("back", key, 2, 1))) < at(Alloc((key, 1, 3), 4 * MIB))
    assert at(Alloc(("wgrad", key, 0, 0), 6 * MIB)) < at(Free(("back", key, 1, 1)))
    # autograd's frees of the held tensors free nothing: they name ("held", ...) keys
    assert Free(("held", "back", key, 2, 1)) in events
