"""The last stage's backward, term by term, under every loss (docs/framework-facts.md §60): what of the loss region
is alive when the layers before the output layer run their backward; what the output layer's backward makes; the
cuBLAS workspaces the allocated peak holds. By hand on a tiny LLaMA: 32 tokens x micro-batch 2 = 64 tokens, hidden
64, V 256, bf16: logits 64 x 256 x 2 = 32,768 B; a block's MLP (f 1,024) wide enough that its backward, not the
loss, sets the stage's transient."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import costmodel, rules
from planner.cost.float8 import float8_profile
from planner.cost.layers import layer_costs
from planner.cost.rules import last_layer_kept_bytes, logits_in_loss_kept, loss_kept_bytes
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=1024, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=256, tie_word_embeddings=False, max_position_embeddings=32)
TOKENS, H = 64, 64
LOGITS = TOKENS * 256 * 2
HEAD_INPUT_GRAD = TOKENS * H * 2  # the LM head's grad_input [tokens, h], bf16
# Megatron's functional tests' CUBLAS_WORKSPACE_CONFIG :4096:8, twice: the forward's thread's and autograd's
TORCH_CUBLAS = 2 * 8 * 4096 * 1024
TE_CUBLAS_SM90 = 32 * 1024 * 1024 + 1024  # Transformer Engine's on compute capability 9 and later


def setup(stages: int = 1, runtime: str = "megatron", **fields) -> TrainSetup:
    base = dict(stages=stages, microbatches=2 * stages, micro_batch_size=2, mem_caps_bytes=[2**50] * stages,
                precision="bf16-mixed", runtime=runtime)
    return TrainSetup(**(base | fields))


def profile(tp: int = 1, gpu: str = "h100"):
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=tp, sp=tp > 1),
                                     gpu=archs.gpu(gpu), model=FileRef(file="arch:test", sha256="0" * 64))


def last_stage(view: TrainSetup, bounds: list[int], tiny=None):
    tiny = float8_profile(tiny or profile(), view)
    stages = costmodel.split_to_stages(bounds, [False] * len(tiny.layers), tiny)
    return costmodel.evaluate(stages, tiny, view).stages[-1]


def test_which_runtimes_drop_the_logits_before_the_backward():
    tiny = profile()
    # Megatron-LM's GPT model returns the loss, the logits a local; torchtitan deletes pred without a pipeline
    assert logits_in_loss_kept(tiny, setup(runtime="megatron"))
    assert logits_in_loss_kept(tiny, setup(2, runtime="megatron"))
    assert logits_in_loss_kept(tiny, setup(runtime="torchtitan"))
    # torch's pipelining holds the last stage's output to the end of its backward (torchtitan's PP, ckplan)
    assert not logits_in_loss_kept(tiny, setup(2, runtime="torchtitan"))
    assert not logits_in_loss_kept(tiny, setup(runtime="ckplan"))
    assert not logits_in_loss_kept(tiny, setup(runtime="deepspeed"))


def test_the_logits_share_moves_to_the_loss_and_the_kept_total_stays():
    tiny, head = profile(), layer_costs(profile())[-1]
    assert head.output_bytes == LOGITS
    # megatron-core's vocab-parallel loss keeps its fp32 copy, 2x, all the loss's; before, 1x of it was the stage output
    assert loss_kept_bytes(tiny, 0, setup()) == 2 * LOGITS + 4
    assert last_layer_kept_bytes(head, 0, tiny, setup()) == 0
    # torchtitan beside a pipeline: its log-softmax's fp32 result (2x) is the loss's own tensor, beside the bf16
    # stage output (1x) torch's pipelining holds (docs/published-runs.md §27.c8last; it was LOGITS + 4)
    assert loss_kept_bytes(tiny, 1, setup(2, runtime="torchtitan")) == 2 * LOGITS + 4
    assert last_layer_kept_bytes(head, 1, tiny, setup(2, runtime="torchtitan")) == LOGITS


@pytest.mark.parametrize("runtime", ["megatron", "torchtitan"])
def test_no_layer_before_the_head_is_charged_the_logits_where_the_runtime_drops_them(runtime, monkeypatch):
    view = setup(runtime=runtime)
    dropped = last_stage(view, [0])
    real = rules.runtime_facts

    def holding(training_setup):  # the same record, but holding the logits through the backward
        return dataclasses.replace(real(training_setup), logits_held_in_backward="always")

    monkeypatch.setattr(rules, "runtime_facts", holding)
    held = last_stage(view, [0])
    # the last block's backward (its MLP's two f-wide gradients) sets the transient, credited all the loss keeps where
    # the logits are dropped. Megatron-LM's loss region counts the logits' 1x in its kept bytes: held, that 1x is the
    # stage output's, the same bytes kept, the transient credited all but it. torchtitan's eager loss keeps its fp32
    # log-softmax alone (LossRegion.kept_counts_logits, §27.c8last): held, the logits are kept beside it.
    beside = LOGITS if runtime == "torchtitan" else 0
    assert held.kept_bytes - dropped.kept_bytes == beside
    assert held.transient_bytes - dropped.transient_bytes == LOGITS - beside
    assert held.peak_bytes - dropped.peak_bytes == LOGITS


def test_the_analytic_head_counts_the_input_gradient_its_backward_makes():
    head = profile().layers[-1]
    assert head.transient_bytes == LOGITS + HEAD_INPUT_GRAD
    # the replay's record makes the same: no scratch beyond the incoming gradient, then the input's gradient
    record = head.alloc_records["none"]
    assert [code for code in record.backward if code > 0] == [HEAD_INPUT_GRAD]
    # under TP 2 with SP: the column-parallel linear's grad_input whole, then its reduce-scatter's output beside it
    sp = profile(tp=2).layers[-1]
    assert sp.output_bytes == LOGITS // 2
    assert sp.transient_bytes == LOGITS // 2 + HEAD_INPUT_GRAD + HEAD_INPUT_GRAD // 2
    assert [code for code in sp.alloc_records["none"].backward if code > 0] == [HEAD_INPUT_GRAD, HEAD_INPUT_GRAD // 2]


def test_the_allocated_peak_holds_the_cublas_workspaces_and_the_limit_with_them():
    megatron = last_stage(setup(), [0])
    parts = megatron.static_bytes + megatron.buffer_bytes + megatron.activation_bytes + megatron.transient_bytes
    assert megatron.peak_bytes - parts == TORCH_CUBLAS + TE_CUBLAS_SM90
    tiny = float8_profile(profile(), setup())
    ctx = costmodel.Context(tiny, setup())
    # the solvers' rows bound the rest: the same verdict as the allocated peak against its limit
    assert megatron.limit_bytes - costmodel.limit_bytes(0, ctx) == TORCH_CUBLAS + TE_CUBLAS_SM90
    # before Hopper TE's workspace is 4 MiB
    a100 = last_stage(setup(), [0], tiny=profile(gpu="a100-80g"))
    assert a100.peak_bytes - (a100.static_bytes + a100.buffer_bytes + a100.activation_bytes
                              + a100.transient_bytes) == TORCH_CUBLAS + 4 * 1024 * 1024
    # torchtitan's record charges none (not sourced): nothing added
    titan = last_stage(setup(runtime="torchtitan"), [0])
    assert titan.peak_bytes == titan.static_bytes + titan.buffer_bytes + titan.activation_bytes + titan.transient_bytes
