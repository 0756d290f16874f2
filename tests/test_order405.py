"""The last pipeline stage's forward as torch 2.6.0 makes it (docs/published-runs.md §27.order405, framework-facts
§118): the output (output_chunks) before the loss, and the loss's log-softmax result made inside loss_parallel's
`_log_softmax` (after exp's is freed, while the copy and the shifted logits are alive) and kept to the microbatch's
backward. By hand on a one-layer rank (as tests/test_fsdp2_chunks.py), F = 2 MiB the fp32 logits."""

from __future__ import annotations

from dataclasses import replace

from planner.cost import fsdp2_chunks
from planner.cost.allocator import Alloc
from planner.cost.fsdp2_chunks import Fsdp2Rank, with_ends
from planner.cost.fsdp2_events import Fsdp2Layer, Fsdp2Stage
from planner.cost.fsdp2_layers import program_kept_bytes

MIB = 2**20
F = 2 * MIB
PARALLEL = (F, F, F, -3, F, -2, -1)  # loss_parallel's forward: copy, shifted, exp, exp freed, result, ...
LAYER = Fsdp2Layer(unit=0, kept_bytes=3 * MIB, extra_bytes=0, gathered=(4 * MIB,), grads=(4 * MIB,),
                   shard=(4 * MIB,), state=(4 * MIB, 4 * MIB), scratch=())
LAST = Fsdp2Stage(layers=(LAYER,), kept_from_forward=frozenset({0}), shard_group=2, reduce_ratio=2.0,
                  buffer_bytes=0, loss_kept_bytes=1 * MIB, loss_extra_bytes=0, loss_forward=PARALLEL)


def name(key):
    inner = key[2] if key[0] == "chunk" else key
    return inner if inner[0] in ("output", "merged", "loss_forward") else inner[0]


def test_what_a_program_leaves_alive():
    assert program_kept_bytes(PARALLEL) == F  # the result, id 4
    assert program_kept_bytes((F, F, -1)) == F  # aten's: the copy freed, the result kept
    assert program_kept_bytes((F, 5, -2, -1)) == 0
    assert program_kept_bytes(()) == 0


def test_the_output_then_the_loss_its_result_made_in_place_and_kept_to_the_backward():
    """torch 2.6.0's `_log_softmax` (distributed/tensor/parallel/loss.py 127-151) frees exp's once summed, makes the
    result while the copy and the shifted logits live, returns (shifted freed), cross_entropy returns (the copy
    freed). The result is freed at the microbatch's backward after the loss's scratch, beside the ends. The output
    (output_chunks) is made before the loss's requests, as torch makes it (forward_one_chunk, stage.py 703, then
    _maybe_compute_loss), now that the replay plays the layers' forward requests around it (docs/published-runs.md
    §29.reserve405)."""
    rank = Fsdp2Rank(chunks=(LAST,), actions=((0, "F", 0), (0, "B", 0)), num_microbatches=1, buffer_bytes=0,
                     output_bytes=(1 * MIB,), merged_bytes=1 * MIB)
    events = fsdp2_chunks.rank_events(rank, steps=1)
    seq = [("A" if isinstance(e, Alloc) else "F", name(e.key)) for e in events
           if name(e.key) in ("kept", "rest") or isinstance(name(e.key), tuple)]
    lf = lambda n: ("loss_forward", 0, n)  # noqa: E731
    assert seq == [
        ("F", ("output", 0, 0)),  # clear_runtime_states (nothing yet)
        ("A", "kept"), ("A", ("output", 0, 0)),
        ("A", lf(1)), ("A", lf(2)), ("A", lf(3)), ("F", lf(3)), ("A", lf(4)), ("F", lf(2)), ("F", lf(1)),
        ("A", "rest"), ("F", "rest"), ("F", lf(4)), ("F", "kept"),
        ("A", ("merged",)), ("F", ("merged",)),
    ]
    sizes = {name(e.key): e.nbytes for e in events if isinstance(e, Alloc)}
    assert sizes[lf(4)] == F and sizes["rest"] == 1 * MIB


def test_the_ends_less_the_result_and_a_negative_rest_taken_off_the_stage_input():
    """with_ends: the stage's ends (here the result F, 4 B of the loss's own, less a 128 KiB stage input the
    receive buffer holds) less what the loss's forward keeps itself; the negative rest off the first layer's
    kept bytes, as before (the allocated total the same: 3 MiB + F + 4 - 128 KiB)."""
    stage = replace(LAST, loss_kept_bytes=0)
    more = with_ends(stage, F + 4 + 1 * MIB)
    assert more.loss_kept_bytes == 1 * MIB + 4 and more.layers[0].kept_bytes == 3 * MIB
    less = with_ends(stage, F + 4 - 128 * 1024)
    assert less.loss_kept_bytes == 0 and less.layers[0].kept_bytes == 3 * MIB + 4 - 128 * 1024
    assert with_ends(replace(stage, loss_forward=()), F).loss_kept_bytes == F  # no program: all among the ends


def test_a_stage_without_a_pipeline_frees_the_result_after_the_losss_scratch():
    from planner.cost.fsdp2_events import step_events

    stage = replace(LAST, loss_kept_bytes=5, loss_extra_bytes=F, loss_program=(F, -1))
    events = step_events(stage, steps=1)
    keys = [(type(e).__name__, e.key) for e in events if e.key[0] in ("loss_forward", "loss_kept", "loss_extra")]
    assert keys == [("Alloc", ("loss_forward", 1)), ("Alloc", ("loss_forward", 2)), ("Alloc", ("loss_forward", 3)),
                    ("Free", ("loss_forward", 3)), ("Alloc", ("loss_forward", 4)), ("Free", ("loss_forward", 2)),
                    ("Free", ("loss_forward", 1)), ("Alloc", ("loss_kept",)), ("Alloc", ("loss_extra", 1)),
                    ("Free", ("loss_extra", 1)), ("Free", ("loss_kept",)), ("Free", ("loss_forward", 4))]


def torch_260_interleaved(pp: int, v: int, m: int, rank: int) -> list[tuple[int, str, int]]:
    """ScheduleInterleaved1F1B's pipeline_order for `rank`, no-ops dropped, transcribed from torch 2.6.0
    schedules.py 1889-1990 (_calculate_single_rank_operations) and 1752-1850 (_get_1f1b_rank_ops)."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    fwd_bwd = v * m - warmup
    fwd = lambda s: ((s // per_round) % v) * pp + rank  # noqa: E731
    bwd = lambda s: (v - 1 - ((s - warmup) // per_round) % v) * pp + rank  # noqa: E731
    f_mb, b_mb, ops = {}, {}, []
    for op in range(warmup + fwd_bwd + warmup):
        if op < warmup + fwd_bwd:
            s = fwd(op)
            ops.append((s, "F", f_mb.setdefault(s, 0)))
            f_mb[s] += 1
        if op >= warmup:
            s = bwd(op)
            ops.append((s, "B", b_mb.setdefault(s, 0)))
            b_mb[s] += 1
    return ops


def test_the_interleaved_ranks_actions_are_torchs():
    """M18's last rank (PP 8, 2 chunks, 8 microbatches) and a few others: the replay's actions, stage by stage."""
    from planner.cost.schedules import build_schedule

    for pp, v, m in ((8, 2, 8), (4, 2, 8), (4, 3, 4), (2, 2, 6)):
        walked = build_schedule("interleaved-1F1B", num_ranks=pp, num_microbatches=m, num_chunks=v)
        for rank in range(pp):
            ours = [(a.chunk * pp + rank, a.kind, a.microbatch) for a in walked.actions[rank]]
            assert ours == torch_260_interleaved(pp, v, m, rank), (pp, v, m, rank)
