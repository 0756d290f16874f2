"""torchtitan 9dec370's final norm in eager fp32 (planner/cost/eager_norm.py; docs/published-runs.md §35.finalnorm,
framework-facts §205-§206), counted by hand on a tiny head.

The head of a LLaMA of hidden 64 and vocabulary 128 at 32 tokens, TP 1, bf16: the norm's E = 32 x 64 = 2,048
elements, its bf16 input 4,096 B. The analytic record keeps the input (4,096), 1/rms (32 x 4 = 128) and the LM
head's input (4,096): 8,320 B; its transient is the logits' gradient (32 x 128 x 2 = 8,192) and the linear's input
gradient (4,096): 12,288 B. torch's eager RMSNorm keeps x.float() (4E = 8,192) in place of the bf16 input and the
bf16 normalised tensor (2E = 4,096) beside the LM head's input: 8,192 B more. Its backward holds 16E = 32,768 B at
pow's backward (dA, dB, A.pow(1) and 2 x it, or 2 x it and the product): 20,480 over the head's own 12,288.
"""

from __future__ import annotations

import torch
from test_f8cast import _alive

from planner.cost import eager_norm
from planner.cost.costmodel import unit_layer_bytes as fsdp_unit_layer_bytes
from planner.cost.fsdp2_layers import chunk_layers
from planner.cost.layers import layer_costs
from planner.cost.terms import Context, layer_value
from planner.models import archs
from planner.models.configs.titan_status import key_status
from planner.profiler import allocseq, analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(
    name="tiny-llama",
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    vocab_size=128,
    tie_word_embeddings=False,
    max_position_embeddings=32,
)
PROFILE = analytic.analytic_profile(
    TINY,
    Shape(seq_len=32, micro_batch_size=1),
    gpu=archs.gpu("h100"),
    model=FileRef(file="arch:test", sha256="0" * 64),
)
HEAD = layer_costs(PROFILE)[-1]
E = 32 * 64


def _setup(runtime: str = "torchtitan", version: str | None = "9dec370") -> TrainSetup:
    return TrainSetup(
        stages=1,
        microbatches=1,
        micro_batch_size=1,
        mem_caps_bytes=[2**40],
        precision="bf16-mixed",
        runtime=runtime,
        runtime_version=version,
        dp=2,
        zero=3,
    )


def test_the_head_record_is_the_fused_norms():
    assert (HEAD.kind, HEAD.input_bytes, HEAD.act_bytes, HEAD.transient_bytes) == (
        "norm+lm_head",
        4096,
        8320,
        12288,
    )


def test_only_torchtitan_9dec370s_record_runs_the_final_norm_eager_in_fp32():
    assert eager_norm.elements(HEAD, PROFILE, _setup()) == E
    assert (
        eager_norm.elements(HEAD, PROFILE, _setup(version="b5bcd76c")) == 0
    )  # torch's nn.RMSNorm: not read
    assert eager_norm.elements(HEAD, PROFILE, _setup("megatron", None)) == 0
    assert (
        eager_norm.elements(layer_costs(PROFILE)[1], PROFILE, _setup()) == 0
    )  # a block: its norms compiled


def test_the_terms_keep_4e_more_and_hold_16e_at_pows_backward():
    ctx, before = Context(PROFILE, _setup()), Context(PROFILE, _setup(version="b5bcd76c"))
    assert eager_norm.kept_extra_bytes(HEAD, 0, PROFILE, _setup()) == 8192
    assert (
        eager_norm.kept_extra_bytes(HEAD, 1, PROFILE, _setup()) == 0
    )  # a checkpointed head keeps its input
    assert eager_norm.backward_extra_bytes(HEAD, 0, PROFILE, _setup()) == 40960 - 12288
    assert layer_value("kept", HEAD, 0, ctx) - layer_value("kept", HEAD, 0, before) == 8192
    for context, extra in (
        (ctx, 12288 + 28672),
        (before, 12288),
    ):  # less FSDP2's units, which the versions group apart
        units = fsdp_unit_layer_bytes(HEAD, 0, PROFILE, context.setup)
        assert layer_value("extra", HEAD, 0, context) - units == extra


def test_the_backward_in_torchs_order_hands_on_dx():
    # the LM head's part: the logits' gradient (id 1, 8,192), dH (id 2, 4,096), handed on before the norm
    program, hands = eager_norm.with_backward((8192, 4096), 2, E)
    norm = (-1, 4096, 4096, -3, -2, 8192, -4, 8192, 8192, -6, -5, 8192, 8192, 8192, 8192, -10, -9, -8, 8192, -7, -11,
            4096, -12)  # fmt: skip
    assert program == (8192, 4096, *norm)
    assert hands == 13
    trace = _alive(program)
    assert (
        max(trace[2:]) == 20 * E
    )  # the norm's peak: dA, dB, A.pow(1), 2 x it, the product: 40,960 B
    assert trace[-1] == 2 * E  # dx alone, id 13


class TitanRMSNorm(torch.nn.Module):
    """torchtitan 9dec370 torchtitan/models/norms.py RMSNorm, as written there (its weight bf16, as FSDP2's
    MixedPrecisionPolicy gathers it)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def _large(codes, made: int = 0) -> list[int]:
    """The codes of tensors of 2E bytes or more (per-token and [h] tensors left out) renumbered from 1, ids from
    `made` + 1 (a backward's: after its forward's); frees of others (its forward's) left out."""
    ids, out = {}, []
    for code in codes:
        if code > 0:
            made += 1
            if code >= 2 * E:
                ids[made] = len(ids) + 1
                out.append(code)
        elif -code in ids:
            out.append(-ids[-code])
    return out


def test_torch_makes_and_frees_the_norms_tensors_in_that_order():
    # the recorder the measured profiles use (allocseq.record_pass) on torchtitan's code, eager on the installed torch
    norm = TitanRMSNorm(64)
    norm.weight.grad = torch.zeros_like(norm.weight)
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    record = allocseq.record_pass(
        norm, x, torch.ones(32, 64, dtype=torch.bfloat16), list(norm.parameters())
    )
    # forward: A, B, B freed, F, G, F freed, H: the replay's kept_program (tests/test_headsplit.py)
    assert _large(record.forward) == [8192, 8192, -2, 8192, 4096, -3, 4096]
    # backward (dH received: not recorded, nor its free): the norm's part of the replay's program, renumbered
    made = sum(1 for code in record.forward if code > 0)
    program, _ = eager_norm.with_backward((8192, 4096), 2, E)
    mine = [
        code for code in program[2:] if code not in (-1, -2)
    ]  # the logits' gradient and dH: not recorded
    assert _large(record.backward, made) == _large(mine, 2)
    assert _large(record.backward, made) == [4096, 4096, -1, 8192, -2, 8192, 8192, -4, -3, 8192, 8192, 8192, 8192,
                                             -8, -7, -6, 8192, -5, -9, 4096, -10]  # fmt: skip


def test_no_norm_or_no_handed_gradient_leaves_the_program():
    assert eager_norm.with_backward((8192, 4096), 2, 0) == ((8192, 4096), 2)
    assert eager_norm.with_backward((8192,), 0, E) == ((8192,), 0)


def test_the_fsdp2_replay_plays_them_on_the_head():
    for (
        version,
        kept,
        forward,
        hands,
    ) in (  # the forward's requests in the kept program (tests/test_headsplit.py)
        ("9dec370", 8320 + 8192, (8192, 8192, -2, 128, 8192, 4096, -4, 4096), 13),
        ("b5bcd76c", 8320, (), 2),
    ):
        made = chunk_layers(
            layer_costs(PROFILE),
            [0, 0, 0, 0],
            profile=PROFILE,
            setup=_setup(version=version),
            piped=False,
            scratch_per_param=0.0,
        )
        head = made.layers[-1]
        assert (head.kept_bytes, head.kept_program, head.forward_program, head.hands) == (
            kept,
            forward,
            (),
            hands,
        )
        assert head.extra_program[:2] == (8192, 4096)
        assert head.grads_at == ((1, 1),)  # the output's weight gradient before dH, as before


def test_a_tomls_norm_type_is_said():
    assert key_status("model.norm_type", "rmsnorm")[0] == "modelled"
    status, what = key_status("model.norm_type", "fused_rmsnorm")
    assert status == "not modelled" and what.startswith(
        "fused_rmsnorm: scored as torchtitan's RMSNorm"
    )
