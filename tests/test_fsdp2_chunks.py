"""FSDP2's step replayed on a rank of several chunks (planner/cost/fsdp2_chunks.py): each chunk its own FSDP2
root (its own copy-in and reduce-scatter streams, its own kept reduce-scatter input), the rank's actions in
torch's order, a chunk reduced after its own M-th backward, each part's optimizer in turn; the outputs kept
from each forward to the next step and the last stage's merge; the reserve taken from it under torchtitan
for interleaved 1F1B, as for 1F1B."""

from planner.cost import allocator, costmodel, fsdp2_chunks, reserve_fsdp2
from planner.cost.allocator import Alloc, Free
from planner.cost.fsdp2_chunks import Fsdp2Rank
from planner.cost.fsdp2_events import Fsdp2Layer, Fsdp2Stage
from planner.models.synthetic import layer, profile_of, uniform_blocks
from planner.schema import TrainSetup

MIB = 2**20
GIB = 2**30

# Each chunk one layer, its own unit, sharded over K = 2: a 12 MiB tensor gathered (bf16) and as its gradient,
# a 12 MiB fp32 shard and two 12 MiB states, 10 MiB kept from its forward to its backward, no scratch; the
# reduce dtype fp32 (the upcast copy and the reduce-scatter input 24 MiB, the sharded gradient 12 MiB).
LAYER = Fsdp2Layer(unit=0, kept_bytes=10 * MIB, extra_bytes=0, gathered=(12 * MIB,), grads=(12 * MIB,),
                   shard=(12 * MIB,), state=(12 * MIB, 12 * MIB), scratch=())
CHUNK = Fsdp2Stage(layers=(LAYER,), kept_from_forward=frozenset({0}), shard_group=2, reduce_ratio=2.0,
                   buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0, keeps_last_input=True)
# one microbatch: chunk 0's forward, chunk 1's, then chunk 1's backward before chunk 0's (a rank's two stages)
RANK = Fsdp2Rank(chunks=(CHUNK, CHUNK), actions=((0, "F", 0), (1, "F", 0), (1, "B", 0), (0, "B", 0)),
                 num_microbatches=1, buffer_bytes=0)


def _ops(events):
    """(chunk, what) of each allocation, in order (None: the rank's own)."""
    return [(e.key[1], e.key[2][0]) if e.key[0] == "chunk" else (None, e.key[0])
            for e in events if isinstance(e, Alloc) and e.nbytes]


def test_each_chunk_runs_its_own_streams_and_reduces_after_its_own_last_backward():
    events = fsdp2_chunks.rank_events(RANK, steps=1)
    streams = {(e.key[1], e.key[2][0]): e.stream for e in events if isinstance(e, Alloc) and e.key[0] == "chunk"}
    # chunk c's copy-in stream 1 + 2c, its reduce-scatter stream 2 + 2c, the default stream shared
    assert [streams[(c, kind)] for c in (0, 1) for kind in ("ag_out", "sharded_grad", "kept")] == [1, 2, 0, 3, 4, 0]
    assert _ops(events) == [
        (0, "shard"), (1, "shard"),  # static: each part's shards (no buffers)
        (0, "staging"), (0, "ag_out"), (0, "unsharded"), (0, "kept"),  # chunk 0's forward
        (1, "staging"), (1, "ag_out"), (1, "unsharded"), (1, "kept"),  # chunk 1's forward
        (1, "grad"), (1, "acc"), (1, "rs_in"), (1, "sharded_grad"),  # chunk 1's backward: its last, so reduced
        (0, "grad"), (0, "acc"), (0, "rs_in"), (0, "sharded_grad"),  # then chunk 0's
        (0, "state"), (0, "state"), (1, "state"), (1, "state"),  # part 0's AdamW, then part 1's
    ]


def test_two_chunks_counted_by_hand():
    """The first step (the optimizer's state made at its end). Static: the two shards, a 12 MiB segment each.
    Chunk 0's forward: staging 6 MiB takes a 20 MiB segment of its copy-in stream, the 12 MiB output the
    14 MiB rest; the unsharded weight a default segment (12), kept 10 another (10). Chunk 1's forward: the
    same on its own copy-in stream (20 + 12 + 10): the 20 MiB of chunk 0's stream lie free, not its. Chunk 1's
    backward: its gradient a segment (12); its kept freed (10 free); the fp32 copy finds no 24 MiB: a segment
    (24); the reduce-scatter input after the gradient and the weight are freed (10, 12, 12 free) a segment
    (24); the sharded gradient a segment of chunk 1's reduce-scatter stream (12). Chunk 0's backward reuses
    a 12 (gradient) and the 24 (copy) and takes a segment for its own reduce-scatter input, kept beside
    chunk 1's (24), and one of its reduce-scatter stream (12). The four states take the free 12s and split
    the 24. Reserved: 24 + (20 + 12 + 10) + (20 + 12 + 10) + (12 + 24 + 24 + 12) + (24 + 12) = 216 MiB.
    Allocated peak at the step's end: shards 24, both kept reduce-scatter inputs 48, sharded gradients 24,
    states 48 = 144 MiB (chunk 0's backward reaches 108)."""
    once = allocator.replay(fsdp2_chunks.rank_events(RANK, steps=1))
    assert (once.allocated_peak_bytes, once.reserved_peak_bytes) == (144 * MIB, 216 * MIB)
    steady = fsdp2_chunks.replay(RANK)
    assert steady == allocator.replay(fsdp2_chunks.rank_events(RANK, steps=3))  # the second step is every later one's


def test_outputs_stay_from_their_forward_to_the_next_step_and_the_last_stage_merges_them():
    """output_chunks: a microbatch's output from its forward until the next step's clear_runtime_states; the
    input's gradient on its receive buffer's .grad from its backward as long; the last stage's merge made and
    dropped once every action has run, before the optimizer steps."""
    rank = Fsdp2Rank(**{**RANK.__dict__, "output_bytes": (4 * MIB, 6 * MIB), "input_grad_bytes": (0, 2 * MIB),
                        "merged_bytes": 6 * MIB})
    events = fsdp2_chunks.rank_events(rank, steps=2)
    made = [i for i, e in enumerate(events) if isinstance(e, Alloc) and e.key[0] in ("output", "input_grad", "merged")]
    assert [events[i].key for i in made[:4]] == [("output", 0, 0), ("output", 1, 0), ("input_grad", 1, 0), ("merged",)]
    merged = made[3]
    assert events[merged + 1] == Free(("merged",))
    assert [e.key[2][0] for e in events[merged + 2:] if isinstance(e, Alloc) and e.key[0] == "chunk"][:4] == \
        ["state"] * 4
    second = events.index(Free(("output", 0, 0)), merged)  # the next step's start frees them
    assert {e.key[0] for e in events[merged + 1:second] if isinstance(e, Alloc)} == {"chunk"}


def _cuda(profile):
    return profile.model_copy(update={"device": profile.device.model_copy(update={"type": "cuda"}),
                                      "assumptions": {**profile.assumptions, "gpu": "h100"}})


def _titan(**fields) -> TrainSetup:
    base = dict(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2, precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3, zero_gather="per-iteration")
    return TrainSetup(**(base | fields))


def _interleaved_ranks(profile, cuts):
    """P = 2 x V = 2 from the pipeline's four stages' first layers (`cuts`), placed as interleaved 1F1B places
    them: rank r holds stages r and r + 2."""
    names = [layer.name for layer in profile.layers]
    bounds = [*cuts, len(names)]
    stages = [names[a:b] for a, b in zip(bounds, bounds[1:])]
    return [costmodel.StagePlan(index=r, layers=stages[r] + stages[r + 2], chunks=[stages[r], stages[r + 2]])
            for r in range(2)]


def test_torchtitans_interleaved_reserve_is_the_replays():
    profile = _cuda(uniform_blocks(6))
    setup = _titan(schedule="interleaved-1F1B", chunks=2)
    ranks = _interleaved_ranks(profile, [0, 3, 5, 6])
    cost = costmodel.evaluate(ranks, profile, setup)
    for index, (c, plan) in enumerate(zip(cost.stages, ranks)):
        made = reserve_fsdp2.stage_of(plan, c, stage=index, profile=profile, setup=setup)
        assert isinstance(made, Fsdp2Rank) and len(made.chunks) == 2
        replayed = reserve_fsdp2.replay(made, expandable=reserve_fsdp2.expandable_segments(profile, setup))
        assert c.reserved_by == "replay" and c.reserved_bytes == reserve_fsdp2.reserved_bytes(replayed, c.peak_bytes)
    # the schedules that split a backward (ZB) keep the margin; so does interleaved 1F1B with gradients reduced
    # every microbatch, and any other runtime's
    for other in (_titan(schedule="ZB", chunks=2), _titan(schedule="interleaved-1F1B", chunks=2, zero_gather="per-microbatch"),
                  _titan(schedule="interleaved-1F1B", chunks=2, runtime="ckplan", runtime_version=None)):
        assert {c.reserved_by for c in costmodel.evaluate(ranks, profile, other).stages} == {None}


def test_a_one_stage_pipeline_rank_runs_the_same_driver():
    """1F1B's rank is the one-chunk case of the same replay: its outputs kept from their forward (not among
    the buffers), the last stage's merge at the step's end."""
    profile = _cuda(uniform_blocks(4))
    setup = _titan()
    stages = costmodel.split_to_stages([0, 3], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup)
    made = [reserve_fsdp2.stage_of(plan, c, stage=i, profile=profile, setup=setup)
            for i, (c, plan) in enumerate(zip(cost.stages, stages))]
    assert all(isinstance(rank, Fsdp2Rank) and len(rank.chunks) == 1 for rank in made)
    assert made[0].merged_bytes == 0 and made[1].merged_bytes == 4 * profile.layers[-1].output_bytes
    assert made[0].output_bytes == (profile.layers[2].output_bytes,)
    # every microbatch replayed (each leaves its output to the next step), not 1F1B's warm-up and two pairs
    # (3 on the last stage: fsdp2_layers.replayed_microbatches); past REPLAYED_MAX those, the rest among the buffers
    assert [rank.num_microbatches for rank in made] == [4, 4]
    assert fsdp2_chunks.replayed_microbatches(_titan(microbatches=200).pipeline, 1) == 3
    assert fsdp2_chunks.replayed_microbatches(_titan(microbatches=200, schedule="interleaved-1F1B", chunks=2).pipeline) == 4


def test_the_interleaved_first_rank_reserves_less_than_1f1bs_first_stage():
    """M18 against M17 in miniature (torchtitan 9dec370, LLaMA 3.1 405B, M = P: 1F1B 82.5 GiB reserved,
    interleaved 72.7): the same layers on rank 0, once as 1F1B's stage 0 and once as interleaved's two chunks,
    blocks whose fp32 gradients outweigh a microbatch's activations (405B at TP 8: 1.48 GiB against 0.125).
    1F1B's stage 0 holds its blocks' fp32 gradients from its first backward to the step's end beside the
    microbatches still in flight; interleaved's rank 0 runs every forward first and frees its later chunk's
    gradients at that chunk's last backward, before the earlier chunk's are made."""
    layers = [layer("embed", "Embedding", fwd_ms=0.5, act_mib=0.1, input_mib=0.01, output_mib=8, param_count=50_000_000)]
    layers += [layer(f"blocks.{i}", "Block", fwd_ms=10, act_mib=136, input_mib=8, param_count=200_000_000,
                     transient_mib=24) for i in range(14)]
    layers.append(layer("head", "Head", fwd_ms=12, act_mib=40, input_mib=8, output_mib=100, param_count=50_000_000,
                        transient_mib=100))
    profile = _cuda(profile_of(layers, name="m18-shaped"))
    plans = costmodel.split_to_stages([0, 8], [False] * len(layers), profile)
    f1b = costmodel.evaluate(plans, profile, _titan(microbatches=2)).stages[0]
    # interleaved: rank 0 holds stages 0 (embed, blocks 0-2) and 2 (blocks 7-10): eight layers as 1F1B's stage 0
    ranks = _interleaved_ranks(profile, [0, 4, 8, 12])
    first = costmodel.evaluate(ranks, profile, _titan(microbatches=2, schedule="interleaved-1F1B", chunks=2)).stages[0]
    assert (f1b.reserved_by, first.reserved_by) == ("replay", "replay")
    assert first.peak_bytes < f1b.peak_bytes and first.reserved_bytes < f1b.reserved_bytes


def test_a_stage_input_its_receive_buffer_holds_is_not_kept_twice():
    """A stage's kept bytes less its layers' and its output (the ends) are negative where the first layer saves
    the stage input, which its receive buffer holds among the buffers: the layer keeps that much less."""
    fewer = fsdp2_chunks.with_ends(CHUNK, -4 * MIB)
    assert (fewer.layers[0].kept_bytes, fewer.loss_kept_bytes) == (6 * MIB, 0)
    more = fsdp2_chunks.with_ends(CHUNK, 3 * MIB)
    assert (more.layers, more.loss_kept_bytes) == (CHUNK.layers, 3 * MIB)
