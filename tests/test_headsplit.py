"""The head's kept block on the FSDP2 replay as the tensors torch makes (planner/cost/eager_norm.py kept_program;
docs/published-runs.md §35.headsplit), counted by hand on a tiny head.

The head of a LLaMA of hidden 64 and vocabulary 128 at 32 tokens, bf16, under torchtitan 9dec370 (its final norm
eager fp32). At TP 1: E = 32 x 64 = 2,048; A = x.float() 8,192, pow's B 8,192 (freed by mean), 1/rms 32 x 4 = 128,
the product F 8,192, G 4,096 (F freed), the output H 4,096, which the LM head saves: kept A + 1/rms + G + H = 16,512
(the record's 8,320 and the norm's 8,192). At TP 2 with SP: the norm on the rank's 16 tokens, E = 1,024; A 4,096,
B 4,096, 1/rms 64, F 4,096, G 2,048, H 2,048, then funcol's all-gather on the sequence dimension: its flat output
4,096 and the cat of its chunks 4,096 (the LM head's saved input), the flat output freed, then H: kept
4,096 + 64 + 2,048 + 4,096 = 10,304 (the record's 2,048 + 64 + 2,048, the norm's 4,096, TP's gathered 2,048).
"""

from __future__ import annotations

import dataclasses

from test_finalnorm import TINY, _setup

from planner.cost import eager_norm
from planner.cost.fsdp2_events import Fsdp2Layer, Fsdp2Stage, step_events
from planner.cost.fsdp2_layers import chunk_layers
from planner.cost.layers import layer_costs
from planner.cost.terms import Context, layer_value
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef


def _profile(tp: int):
    return analytic.analytic_profile(
        TINY,
        Shape(seq_len=32, micro_batch_size=1, tp=tp, sp=tp > 1),
        gpu=archs.gpu("h100"),
        model=FileRef(file="arch:test", sha256="0" * 64),
    )


def _head(tp: int):
    """The head as the FSDP2 replay plays it (chunk_layers, every layer at option none)."""
    profile = _profile(tp)
    made = chunk_layers(
        layer_costs(profile),
        [0, 0, 0, 0],
        profile=profile,
        setup=_setup(),
        piped=False,
        scratch_per_param=0.0,
    )
    return made.layers[-1]


def _alone(layer: Fsdp2Layer) -> Fsdp2Stage:
    """A one-layer stage of `layer`, for its events."""
    return Fsdp2Stage(
        layers=(layer,),
        kept_from_forward=frozenset(),
        shard_group=2,
        reduce_ratio=2.0,
        buffer_bytes=0,
        loss_kept_bytes=0,
        loss_extra_bytes=0,
    )


def _head_program(tp: int, version: str = "9dec370", option: int = 0):
    profile = _profile(tp)
    head = layer_costs(profile)[-1]
    kept = int(round(layer_value("kept", head, option, Context(profile, _setup(version=version)))))
    return eager_norm.kept_program(head, option, profile, _setup(version=version), kept), kept


def test_at_tp_1_the_lm_head_keeps_the_norms_output():
    program, kept = _head_program(1)
    assert kept == 8320 + 8192
    assert program == (8192, 8192, -2, 128, 8192, 4096, -4, 4096)  # A, B, 1/rms, F, G, H
    assert 8192 + 128 + 4096 + 4096 == kept  # what it leaves alive


def test_under_tp_and_sp_the_all_gathers_output_and_its_cat():
    program, kept = _head_program(2)
    assert kept == 2048 + 64 + 2048 + 4096 + 2048
    assert program == (4096, 4096, -2, 64, 4096, 2048, -4, 2048, 4096, 4096, -7, -6)
    assert 4096 + 64 + 2048 + 4096 == kept


def test_no_eager_norm_or_a_checkpointed_head_keeps_one_block():
    assert _head_program(2, version="b5bcd76c")[0] == ()
    assert _head_program(2, option=1)[0] == ()


def test_the_replay_plays_them_and_frees_what_is_left_at_the_heads_backward():
    head = _head(2)
    assert (head.kept_program, head.forward_program) == (_head_program(2)[0], ())
    layer = Fsdp2Layer(
        unit=0,
        kept_bytes=head.kept_bytes,
        extra_bytes=0,
        gathered=(0,),
        grads=(0,),
        shard=(0,),
        state=(0, 0),
        scratch=(0,),
        kept_program=head.kept_program,
    )
    stage = _alone(layer)
    kept = [
        (type(e).__name__, e.key[-1], getattr(e, "nbytes", None))
        for e in step_events(stage, steps=1)
        if e.key[0] == "kept"
    ]
    assert kept[:12] == [
        ("Alloc", 1, 4096),
        ("Alloc", 2, 4096),
        ("Free", 2, None),
        ("Alloc", 3, 64),
        ("Alloc", 4, 4096),
        ("Alloc", 5, 2048),
        ("Free", 4, None),
        ("Alloc", 6, 2048),
        ("Alloc", 7, 4096),
        ("Alloc", 8, 4096),
        ("Free", 7, None),
        ("Free", 6, None),
    ]
    assert kept[12:] == [
        ("Free", 1, None),
        ("Free", 3, None),
        ("Free", 5, None),
        ("Free", 8, None),
    ]  # its backward


def test_the_backward_releases_each_once_its_node_has_run():
    # TP 2: the LM head's part (tests/test_lastseq.py: the logits' gradient, its input's whole gradient, the logits'
    # gradient freed, the reduce-scatter's cat, dH = id 4, the whole and the cat freed) is codes 0-6; the norm's from
    # 7: `* weight`'s two, dW freed, dH freed (10), dF, dG freed, d(rsqrt), dA, d(rsqrt) freed, dF freed, mean's dB
    # (17) and pow's three, their frees, A's gradients summed (24). Released: the cat once the linear's node has made
    # its input's gradient and dropped the logits' gradient (before the reduce-scatter's cat, code 3), G before dH's
    # free, 1/rms before dB, A before the sum.
    head = _head(2)
    assert head.extra_program[:7] == (4096, 4096, -1, 4096, 2048, -2, -3)
    assert (head.extra_program[10], head.extra_program[16], head.extra_program[24]) == (-4, -7, 4096)
    # the cat (the LM head's input), G, 1/rms, A
    assert head.kept_frees == ((3, 8), (10, 5), (17, 3), (24, 1))
    stage = _alone(dataclasses.replace(head, unit=0))
    events = [(type(e).__name__, e.key[0], e.key[-1]) for e in step_events(stage, steps=1)]
    for kept, then in (  # each freed just before the code at its index
        (8, ("Alloc", "extra", 3)),  # the reduce-scatter's cat
        (5, ("Free", "extra", 4)),  # dH freed
        (3, ("Alloc", "extra", 10)),  # mean's dB
        (1, ("Alloc", "extra", 14)),  # A's two gradients' sum
    ):
        at = events.index(("Free", "kept", kept))
        assert events[at + 1] == then
    # B, F, the flat output and H in the forward; the four above, none left for the head's end
    assert sum(1 for e in events if e[:2] == ("Free", "kept")) == 8
    # at TP 1 H is the LM head's input (kept id 6), released once the linear has made dH (the program's second)
    assert eager_norm.kept_frees((8192, 4096), 2, _head_program(1)[0]) == (
        (2, 6),
        (6, 5),
        (13, 3),
        (20, 1),
    )
    assert eager_norm.kept_frees((8192, 4096), 2, ()) == ()
