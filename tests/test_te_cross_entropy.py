"""Megatron-LM's last stage under Transformer Engine's fused cross-entropy (docs/framework-facts.md §59): the loss
saves the logits themselves and hands their storage back as their gradient, so the allocated peak holds the logits
once, to the end of the output layer's backward, and no gradient beside them. By hand on a tiny LLaMA: 32 tokens x
micro-batch 2 = 64 tokens, V 4096 (the logits larger than any block's transient, so the loss region sets the peak),
bf16 logits 64 x 4096 x 2 = 524,288 B."""

from __future__ import annotations

import pytest

from planner.cost import costmodel
from planner.cost.float8 import float8_profile
from planner.cost.layers import layer_costs
from planner.cost.rules import last_layer_kept_bytes, loss_holds_logits, loss_kept_bytes
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=4096, tie_word_embeddings=False, max_position_embeddings=32)
LOGITS = 64 * 4096 * 2
HEAD_INPUT_GRAD = 64 * 64 * 2  # the output layer's input gradient [tokens, h], bf16, made beside the logits' one
# kept from the first matmul, allocated: torch's two cuBLAS workspaces (the forward's thread's and autograd's) at
# CUBLAS_WORKSPACE_CONFIG :4096:8 and TE's on a B200
CUBLAS = 2 * 8 * 4096 * 1024 + 32 * 1024 * 1024 + 1024


def setup(stages: int = 1, **fields) -> TrainSetup:
    base = dict(stages=stages, microbatches=2 * stages, micro_batch_size=2, mem_caps_bytes=[2**50] * stages,
                precision="bf16-mixed", runtime="megatron")
    return TrainSetup(**(base | fields))


def profile(tp: int = 1):
    made = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=tp, sp=tp > 1),
                                     gpu=archs.gpu("b200"), model=FileRef(file="arch:test", sha256="0" * 64))
    return float8_profile(made, setup())  # the runtime's blocks (the fused SwiGLU), as evaluate applies them


def last_stage(bounds: list[int], **fields):
    tiny, view = profile(), setup(len(bounds), **fields)
    stages = costmodel.split_to_stages(bounds, [False] * len(tiny.layers), tiny)
    return costmodel.evaluate(stages, tiny, view).stages[-1]


def test_the_loss_holds_the_logits_and_the_stage_output_none():
    tiny, head = profile(), layer_costs(profile())[-1]
    assert head.output_bytes == LOGITS
    te, native = setup(te_cross_entropy=True), setup()
    assert loss_holds_logits(tiny, te) and not loss_holds_logits(tiny, native)
    # TE's loss saves the logits (kept 1x) and its fp32 loss value; the stage output holds nothing more
    assert loss_kept_bytes(tiny, 0, te) == LOGITS + 4
    assert last_layer_kept_bytes(head, 0, tiny, te) == 0
    # megatron-core's vocab-parallel loss: its fp32 copy (2x), all the loss's: the GPT model drops the logits once
    # the loss is made (logits_held_in_backward "never"), so the stage output holds nothing either
    assert loss_kept_bytes(tiny, 0, native) == 2 * LOGITS + 4
    assert last_layer_kept_bytes(head, 0, tiny, native) == 0


@pytest.mark.parametrize("bounds", [[0], [0, 2]])
def test_the_allocated_peak_holds_the_logits_once_and_no_gradient_beside_them(bounds):
    te, native = last_stage(bounds, te_cross_entropy=True), last_stage(bounds)
    assert te.in_flight == native.in_flight == 1
    # kept a microbatch: the logits once (native: the fp32 copy, twice their bytes)
    assert native.kept_bytes - te.kept_bytes == LOGITS
    # the output layer's backward receives the logits' own storage, freed when it ends: beyond the kept bytes
    # only the input gradient it makes beside them, over the loss value (4 B) it has freed by then (the double
    # count megce took out: LOGITS - 4); native: the bf16 gradient made beside the fp32 copy, 1x, the larger
    assert te.transient_bytes == HEAD_INPUT_GRAD - 4
    assert native.transient_bytes == LOGITS
    assert te.peak_bytes == te.static_bytes + te.buffer_bytes + te.kept_bytes + HEAD_INPUT_GRAD - 4 + CUBLAS
    # the loss regions' peaks, 1x and 3x the logits, apart by 2x less what the head's backward adds under TE
    assert native.peak_bytes - te.peak_bytes == 2 * LOGITS - (HEAD_INPUT_GRAD - 4)
    assert native.static_bytes == te.static_bytes and native.buffer_bytes == te.buffer_bytes


def test_vocab_parallel_logits_under_tp():
    tiny = profile(tp=2)
    head = layer_costs(tiny)[-1]
    assert head.output_bytes == LOGITS // 2  # V / TP
    assert loss_kept_bytes(tiny, 0, setup(te_cross_entropy=True)) == LOGITS // 2 + 4
    assert last_layer_kept_bytes(head, 0, tiny, setup(te_cross_entropy=True)) == 0
