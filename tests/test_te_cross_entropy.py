"""Megatron-LM's last stage under Transformer Engine's fused cross-entropy.

Memory (docs/framework-facts.md §59): the loss
saves the logits themselves and hands their storage back as their gradient, so the allocated peak holds the logits
once, to the end of the output layer's backward, and no gradient beside them. By hand on a tiny LLaMA: 32 tokens x
micro-batch 2 = 64 tokens, V 4096 (the logits larger than any block's transient, so the loss region sets the peak),
bf16 logits 64 x 4096 x 2 = 524,288 B.

Time (planner/cost/megatron_loss.py, §119): TE v2.9's Triton kernels replayed on toy logits with every load and store
counted, the term by hand on a tiny GPT and at LLaMA3-8B's shape, the TP statistics' all-gather by hand."""

from __future__ import annotations

import pytest
import torch

from planner.cost import costmodel, megatron_loss, runtimes
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


CE_LOGITS = 64 * 4 * 384 // 2  # a tiny GPT's logits a device: 64 tokens x 4 sequences, 384 words over TP 2
H100_LOSS_TBPS = 1.30985  # the profile's `loss` class rate on H100 (Liger-Kernel's cross-entropy sweeps)


class _Counted:
    """The bytes TE's kernels read and write over the logits' shard (per logit) and per token."""

    def __init__(self):
        self.logit, self.token = 0, 0


def _online_softmax(x: torch.Tensor, y: torch.Tensor, rank: int, seen: _Counted) -> torch.Tensor:
    """online_softmax_kernel (triton/cross_entropy.py 18-82, TE v2.9): one read of each logit, m, d, x_y a token."""
    n_cols = x.shape[-1]
    xf = x.float()
    seen.logit += x.numel() * x.element_size()
    m = xf.max(dim=-1).values
    d = torch.exp(xf - m[:, None]).sum(dim=-1)
    local = (y >= rank * n_cols) & (y < (rank + 1) * n_cols)
    x_y = torch.where(local, xf.gather(-1, (y - rank * n_cols).clamp(0, n_cols - 1)[:, None])[:, 0],
                      torch.full_like(m, float("-inf")))
    seen.token += 3 * 4 * x.shape[0]
    return torch.stack([m, d, x_y])


def _cross_entropy(x: torch.Tensor, y: torch.Tensor, stats: list[torch.Tensor], rank: int, seen: _Counted):
    """cross_entropy_kernel (85-221): the ranks' statistics combined, each logit read again and its gradient
    stored into the logit's own storage in its own dtype (187), the target's entry corrected, a loss a token."""
    m, d, x_y = stats[0][0], stats[0][1], stats[0][2]
    for other in stats[1:]:
        big = torch.maximum(m, other[0])
        d = d * torch.exp(m - big) + other[1] * torch.exp(other[0] - big)
        m, x_y = big, torch.maximum(x_y, other[2])
    seen.token += 3 * 4 * x.shape[0] * len(stats)
    grad = torch.exp(x.float() - m[:, None]) / d[:, None]  # reduce_loss False (Megatron's call)
    seen.logit += x.numel() * x.element_size() * 2
    x.copy_(grad.to(x.dtype))
    n_cols = x.shape[-1]
    local = ((y >= rank * n_cols) & (y < (rank + 1) * n_cols)).nonzero()[:, 0]
    x[local, y[local] - rank * n_cols] -= 1.0
    seen.token += 4 * x.shape[0]
    return -(x_y - m - torch.log(d))


def _element_mul(x: torch.Tensor, grad_output: torch.Tensor, seen: _Counted) -> torch.Tensor:
    """element_mul_kernel (228-263): the gradient scaled in place by grad_output a token (run because Megatron's
    grad_output is a tensor, not the scalar 1.0 cross_entropy_backward skips, 352-369)."""
    x.copy_((x.float() * grad_output[:, None]).to(x.dtype))
    seen.logit += x.numel() * x.element_size() * 2
    seen.token += 4 * x.shape[0]
    return x


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_te_kernels_move_the_records_bytes_a_logit_and_hand_the_logits_back_as_their_gradient(tp):
    torch.manual_seed(0)
    tokens, vocab = 16, 64
    full = torch.randn(tokens, vocab).to(torch.bfloat16)
    target = torch.randint(0, vocab, (tokens,))
    grad_output = torch.rand(tokens) + 0.5
    shards = [full[:, r * vocab // tp:(r + 1) * vocab // tp].clone() for r in range(tp)]
    storages = [s.data_ptr() for s in shards]
    seen = [_Counted() for _ in range(tp)]
    stats = [_online_softmax(s, target, r, seen[r]) for r, s in enumerate(shards)]  # all_gather_into_tensor (316)
    losses = [_cross_entropy(s, target, [stats[r]] + stats[:r] + stats[r + 1:], r, seen[r])
              for r, s in enumerate(shards)]
    grads = [_element_mul(s, grad_output, seen[r]) for r, s in enumerate(shards)]
    # every rank the same loss, torch's own; the gradient torch's, in the logits' storage, bf16
    reference = full.float().requires_grad_()
    want = torch.nn.functional.cross_entropy(reference, target, reduction="none")
    want.backward(grad_output)
    for r in range(tp):
        assert torch.allclose(losses[r], want.detach(), atol=1e-5)
        assert grads[r].data_ptr() == storages[r] and grads[r].dtype == torch.bfloat16
    assert torch.allclose(torch.cat(grads, dim=-1).float(), reference.grad, atol=2e-2)
    # the logits' bytes: 2 + (2 + 2) + (2 + 2) = the record's 10 B a bf16 logit on each rank, at any TP
    record = runtimes.of(_setup().training)
    assert record.te_ce_bytes == 10
    for r in range(tp):
        assert seen[r].logit == record.te_ce_bytes * tokens * (vocab // tp)
        # per token: m, d, x_y stored, the gathered ranks' read, the target's entry, the loss, grad_output
        assert seen[r].token == tokens * (12 + 12 * tp + 4 + 4)


def _setup(stages=1, **training) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=max(stages, 1), micro_batch_size=4, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime="megatron", dp=2, zero=1, **training)


def _profile(gpu="h100", mtp=0):
    arch = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=256, intermediate_size=1024, num_layers=2, num_heads=8,
                      num_kv_heads=8, vocab_size=384, tie_word_embeddings=False, max_position_embeddings=64)
    return analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=2, mtp=mtp), gpu=archs.gpu(gpu),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def test_te_loss_below_the_eager_loss_by_hand():
    profile = _profile()
    setup = _setup(te_cross_entropy=True)
    assert megatron_loss.runs_own_ce(profile, setup) == CE_LOGITS
    # 10 B a logit against the profile's eager 2 x 2 + 32, at the profile's loss rate: 26 B less
    want = CE_LOGITS * (10 - 36) / (H100_LOSS_TBPS * 1e12) * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, setup) == pytest.approx(want, rel=1e-9)
    # no NaN fills under deterministic mode (its only allocations are a few fp32 a token, torch.zeros)
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(te_cross_entropy=True, deterministic=True)) \
        == pytest.approx(want, rel=1e-9)
    # the last stage only
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(stages=2, te_cross_entropy=True)) == 0.0
    assert megatron_loss.vocab_parallel_ce_ms(profile, 1, _setup(stages=2, te_cross_entropy=True)) \
        == pytest.approx(want, rel=1e-9)


def test_statistics_all_gather_over_tp_by_hand():
    profile = _profile()
    link = dict(tp=2, tp_gb_per_s=100.0, tp_step_latency_ms=0.01, collective_latency_ms=0.02)
    setup = _setup(te_cross_entropy=True, **link)
    tokens = 64 * 4
    # NCCL's ring: base + (TP - 1) steps + (TP - 1)/TP of the gathered 12 B a token x TP over the link
    gather = 0.02 + 1 * 0.01 + (1 / 2) * (tokens * 12 * 2) / (100e9) * 1e3
    assert megatron_loss.te_stats_gather_ms(profile, setup) == pytest.approx(gather, rel=1e-12)
    bytes_ms = CE_LOGITS * (10 - 36) / (H100_LOSS_TBPS * 1e12) * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, setup) == pytest.approx(bytes_ms + gather, rel=1e-9)
    # Megatron's own losses all-reduce through paths the cost model does not time here: no gather term
    own = _setup(**link)
    assert megatron_loss.te_stats_gather_ms(profile, _setup(te_cross_entropy=True)) == 0.0  # no TP link
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, own) == pytest.approx(
        CE_LOGITS * (52 / (0.788 * 3.35) - 36 / H100_LOSS_TBPS) / 1e12 * 1e3, rel=1e-9)  # the chain's H100 rate


def test_an_mtp_heads_loss_is_counted_as_the_models():
    profile = _profile(mtp=1)
    assert megatron_loss.losses(profile) == 2
    assert megatron_loss.runs_own_ce(profile, _setup(te_cross_entropy=True)) == 2 * CE_LOGITS
    want = 2 * CE_LOGITS * (10 - 36) / (H100_LOSS_TBPS * 1e12) * 1e3
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, _setup(te_cross_entropy=True)) == pytest.approx(want, rel=1e-9)


def test_llama3_8b_shape_on_h100():
    """One microbatch of 8,192 tokens over LLaMA3-8B's 128,256 words, TP 1, on H100: 26 B a logit less than the
    eager loss, at 1.30985 TB/s."""
    arch = archs.arch("llama3-8b")
    profile = analytic.analytic_profile(arch, Shape(seq_len=8192, micro_batch_size=1), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:llama3-8b", sha256="0" * 64))
    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                       runtime="megatron", dp=8, zero=1, te_cross_entropy=True)
    logits = 8192 * 128256
    assert megatron_loss.runs_own_ce(profile, setup) == logits
    assert megatron_loss.vocab_parallel_ce_ms(profile, 0, setup) == pytest.approx(-20.855, abs=5e-3)
    # the eager loss the profile timed: 36 B a logit, 28.88 ms; TE's: 10 B, 8.02 ms
    assert profile.loss_ms == pytest.approx(logits * 36 / (H100_LOSS_TBPS * 1e12) * 1e3, rel=1e-6)
