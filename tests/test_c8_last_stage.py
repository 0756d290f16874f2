"""The last pipeline stage of torchtitan 9dec370 (row C8's worst rank, docs/published-runs.md §27.c8last): what its
eager loss keeps beside the stage output torch's pipelining holds. By hand on a tiny LLaMA (32 tokens x micro-batch
2 = 64 tokens, V 256, bf16 logits 64 x 256 x 2 = 32,768 B)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from planner.cost.layers import layer_costs
from planner.cost.rules import last_layer_kept_bytes, loss_kept_bytes, runtime_facts
from tests.test_last_stage_backward import LOGITS, profile, setup


def saved_bytes(loss_fn, pred: torch.Tensor, labels: torch.Tensor) -> int:
    """The bytes of every distinct storage autograd saves from the loss's forward to its backward."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(pred, labels)
    return sum(storages.values())


def torchtitan_9dec370_loss(pred, labels):  # train.py 131-134 at 9dec370, eager (its compile commented out)
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def test_torchtitans_eager_loss_saves_its_fp32_log_softmax_not_the_logits():
    """log_softmax saves its result, nll_loss the same tensor: one fp32 copy of the logits (2x the bf16 logits),
    and `.float()`'s backward nothing: the bf16 logits are not among what the loss keeps (torch 2.13 here; the
    same saves at 2.6.0: tools/autograd/derivatives.yaml's _log_softmax `result`, nll_loss_forward `self`)."""
    pred = torch.randn(1, 64, 256, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 256, (1, 64))
    assert pred.numel() * pred.element_size() == LOGITS
    # beside it nll_loss saves the labels (64 int64) and its total weight (an fp32 scalar)
    assert saved_bytes(torchtitan_9dec370_loss, pred, labels) == 2 * LOGITS + 64 * 8 + 4


def test_beside_a_pipeline_the_loss_keeps_its_fp32_result_and_the_stage_output_the_bf16_logits():
    tiny, head = profile(), layer_costs(profile())[-1]
    piped = setup(2, runtime="torchtitan", runtime_version="9dec370")
    # the eager loss's kept_x is its own fp32 result; the stage output (torch's output_chunks) is apart
    assert not runtime_facts(piped).loss.kept_counts_logits
    assert not runtime_facts(piped).loss_vocab_parallel.kept_counts_logits
    assert loss_kept_bytes(tiny, 1, piped) == 2 * LOGITS + 4
    assert last_layer_kept_bytes(head, 1, tiny, piped) == LOGITS
    # without a pipeline torchtitan deletes pred before the backward: the loss's 2x alone, as before
    assert loss_kept_bytes(tiny, 0, setup(runtime="torchtitan", runtime_version="9dec370")) == 2 * LOGITS + 4


def test_a_loss_whose_kept_bytes_count_the_logits_takes_the_stage_outputs_share_off_as_before():
    tiny = profile()
    compiled = setup(2, runtime="torchtitan", runtime_version="bbb1b616", compile=True)
    region = runtime_facts(compiled).loss_compiled
    assert region.kept_counts_logits and region.kept_x == 1.0  # the compiled graph saves its input, the logits
    assert loss_kept_bytes(tiny, 1, compiled) == 4  # its 1x is the stage output's
