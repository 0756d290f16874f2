"""The LM head's backward reduce-scatter under TP + SP as torch 2.6.0's funcol makes it (planner/cost/head_scatter.py;
docs/published-runs.md §37.lastseq, framework-facts §219-§221), counted by hand on tiny heads.

A LLaMA head of hidden 64 at 32 tokens, TP 2 with SP, bf16, under torchtitan 9dec370: the rank's sequence shard of
the head's input is 16 x 64 x 2 = 2,048 B; the linear's input gradient whole (Partial) 32 x 64 x 2 = 4,096; funcol's
`torch.cat(torch.chunk(x, 2, 1))` another 4,096; the reduce-scatter's output, the shard, 2,048. With a vocabulary of
128 (64 a rank) the logits' gradient is 32 x 64 x 2 = 4,096: the record's peak (logits' gradient, whole, shard)
10,240 and torch's at the cat (whole, cat, shard; the logits' gradient released) 10,240: no term. With a vocabulary
of 64 (32 a rank) the logits' gradient is 2,048: the record's 8,192, torch's 10,240: the term 2,048.
"""

from __future__ import annotations

import pytest
import torch
from test_f8cast import _alive
from test_finalnorm import TINY, _setup

from planner.cost import eager_norm, float8, head_scatter
from planner.cost.fsdp2_layers import chunk_layers
from planner.cost.layers import layer_costs
from planner.cost.terms import TERMS, Context
from planner.models import archs
from planner.profiler import allocseq, analytic
from planner.profiler.analytic import Shape
from planner.schema import AllocRecord, FileRef

NARROW = TINY.__class__(**{**TINY.__dict__, "name": "tiny-narrow", "vocab_size": 64})


def _profile(arch, tp: int):
    return analytic.analytic_profile(
        arch, Shape(seq_len=32, micro_batch_size=1, tp=tp, sp=tp > 1), gpu=archs.gpu("h100"),
        model=FileRef(file="arch:test", sha256="0" * 64))


def _head(arch, tp: int, version: str = "9dec370"):
    profile = _profile(arch, tp)
    return profile, layer_costs(profile)[-1]


def test_the_cat_is_the_whole_input_gradient_again_only_where_the_record_says():
    profile, head = _head(TINY, 2)
    assert (head.input_bytes, head.output_bytes) == (2048, 4096)
    assert head_scatter.cat_bytes(head, 0, profile, _setup()) == 4096
    assert head_scatter.cat_bytes(head, 0, profile, _setup(version="b5bcd76c")) == 0  # not read there
    assert head_scatter.cat_bytes(head, 0, profile, _setup("megatron", None)) == 0  # [s, b, h]: no cat
    assert head_scatter.cat_bytes(head, 1, profile, _setup()) == 0  # a recomputed head: not played
    assert head_scatter.cat_bytes(layer_costs(profile)[1], 0, profile, _setup()) == 0  # a block: compiled
    one, head1 = _head(TINY, 1)
    assert head_scatter.cat_bytes(head1, 0, one, _setup()) == 0  # no TP, no reduce-scatter


def test_the_term_is_the_cats_peak_beyond_the_records():
    profile, head = _head(TINY, 2)
    assert head.transient_bytes == 4096 + 4096 + 2048  # the record's: logits' gradient, whole, shard
    assert head_scatter.extra_bytes(head, 0, profile, _setup()) == 0  # 4,096 + 4,096 + 2,048 = 10,240, no more
    profile, head = _head(NARROW, 2)
    assert head.transient_bytes == 2048 + 4096 + 2048
    assert head_scatter.extra_bytes(head, 0, profile, _setup()) == 10240 - 8192
    # with the eager norm's backward after it (20E = 20,480 at E = 16 x 64): the head's peak is the largest of the
    # three, 20,480, over its own 8,192, the cat's term first
    norm = eager_norm.backward_extra_bytes(head, 0, profile, _setup())
    assert (head_scatter.extra_bytes(head, 0, profile, _setup()), norm) == (2048, 20480 - 10240)
    both = [term for term in TERMS if term.quantity == "extra" and term.where == "layer"]
    named = {term.name: term.value(head, False, Context(profile, _setup())) for term in both}
    assert named["the LM head's reduce-scatter cat beyond the head's own backward (funcol on the sequence dimension)"] \
        == 2048


def test_the_program_in_torchs_order():
    # backward_hand's head: the logits' gradient (1), the whole (2), the shard (3, handed on), the whole freed
    program, hands = head_scatter.with_cat((4096, 4096, 2048, -2), 3, 4096, 2048)
    assert (program, hands) == ((4096, 4096, -1, 4096, 2048, -2, -3), 4)
    assert max(_alive(program)) == 4096 + 4096 + 2048
    narrow = head_scatter.with_cat((2048, 4096, 2048, -2), 3, 4096, 2048)[0]
    assert max(_alive(narrow)) == 10240  # the term's peak: 8,192 + 2,048
    # later codes renumbered past the cat
    assert head_scatter.with_cat((8, 4, 2, -2, 6, -4), 3, 4, 2) == ((8, 4, -1, 4, 2, -2, -3, 6, -5), 4)
    # nothing to play
    assert head_scatter.with_cat((4096, 4096, 2048, -2), 3, 0, 2048) == ((4096, 4096, 2048, -2), 3)
    assert head_scatter.with_cat((4096, 2048), 2, 4096, 2048) == ((4096, 2048), 2)


def test_the_replay_plays_it_on_the_head():
    for arch in (TINY, NARROW):  # the extra is the eager norm's 20E = 20,480 on both; the LM head's part 10,240
        profile = _profile(arch, 2)
        made = chunk_layers(layer_costs(profile), [0, 0, 0, 0], profile=profile, setup=_setup(), piped=False,
                            scratch_per_param=0.0)
        head = made.layers[-1]
        logits = head.extra_program[0]
        assert head.extra_program[:7] == (logits, 4096, -1, 4096, 2048, -2, -3)
        assert max(_alive(head.extra_program[:7])) == 4096 + 4096 + 2048
        assert max(_alive(head.extra_program)) <= head.extra_bytes == 20480
        assert head.grads_at == ((1, 1),)  # the output's weight gradient before the whole, as before
    profile = _profile(TINY, 2)
    made = chunk_layers(layer_costs(profile), [0, 0, 0, 0], profile=profile, setup=_setup(version="b5bcd76c"),
                        piped=False, scratch_per_param=0.0)
    assert made.layers[-1].extra_program[:4] == (4096, 4096, 2048, -2)  # no cat where the record does not say


@pytest.fixture
def fake_mesh():
    """A process group of 2 on one CPU process (torch's fake backend: its collectives make their outputs only),
    destroyed after the test."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=2, store=fake_pg.FakeStore())
    from torch.distributed.device_mesh import init_device_mesh

    yield init_device_mesh("cpu", (2,))
    dist.destroy_process_group()


class _LocalRecorder(allocseq.AllocRecorder):
    """allocseq's recorder seeing through DTensor and funcol's AsyncCollectiveTensor to the local storage."""

    @staticmethod
    def _local(tensor):
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
        from torch.distributed.tensor import DTensor

        while isinstance(tensor, DTensor | AsyncCollectiveTensor):
            tensor = tensor._local_tensor if isinstance(tensor, DTensor) else tensor.elem
        return tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        arg_keys = {self._local(t).untyped_storage()._cdata for t in allocseq._tensors((args, kwargs or {}))}
        for tensor in allocseq._tensors(result):
            self._track(self._local(tensor).untyped_storage(), arg_keys)
        return result


def test_torch_makes_the_cat_after_the_logits_gradient_is_released(fake_mesh):
    # torchtitan's LM head (ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False))
    # on the installed torch (CPU), a loss making the logits' gradient inside the engine (ToCopyBackward, as the
    # loss's .float() does): batch 2 of 32 tokens (16 a rank), hidden 48, vocabulary 160 (80 a rank)
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = fake_mesh
    head = torch.nn.Linear(48, 160, bias=False, dtype=torch.bfloat16)
    parallelize_module(head, mesh, ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                                   use_local_output=False))
    x = torch.randn(2, 16, 48, dtype=torch.bfloat16, requires_grad=True)
    with _LocalRecorder() as recorder:
        loss = head(DTensor.from_local(x, mesh, [Shard(1)])).to_local().float().sum()
        mark = len(recorder.events)
        loss.backward()
    assert x.grad.shape == x.shape and torch.isfinite(x.grad.float()).all()  # the reduce-scatter's shard, waited
    # forward: the all-gather's flat output (1) and its cat (2, the linear's saved input), the flat freed; the logits
    # (3), their fp32 copy (4), freed once summed (nothing saves them here), the loss (5)
    assert recorder.events[:mark] == [6144, 6144, -1, 10240, 20480, -3, 4, -4]
    # backward: sum's gradient (6), the logits' gradient (7: 64 x 80 x 2), dW (8: 80 x 48 x 2), the whole input
    # gradient (9: 64 x 48 x 2); the logits' gradient freed, then the saved input; the reduce-scatter's cat (10),
    # its shard (11: 32 x 48 x 2), the cat freed as funcol returns, the whole as the Redistribute node does
    assert recorder.events[mark:] == [4, 10240, 7680, 6144, -7, -2, 6144, 3072, -10, -9, -6]
    # the replay's head program: the logits' gradient 1, the whole 2, the cat 3, the shard 4 (dW a gradient, apart;
    # the saved input a kept tensor, eager_norm.kept_frees); on CUDA the cat's block is cached at the collective's
    # event (ProcessGroupNCCL's recordStream), after the whole's free: the last two frees as the replay plays them
    program, hands = head_scatter.with_cat((10240, 6144, 3072, -2), 3, 6144, 3072)
    assert (program, hands) == ((10240, 6144, -1, 6144, 3072, -2, -3), 4)


# ---------------------------------------------------------------- Float8's backward casts (planner/cost/float8.py)


def test_the_casts_are_the_grad_weight_gemms_two_copies():
    # the tiny block's Float8 record (TINY: hidden 64, FFN 160, 32 tokens): its transient is the largest linear's
    # T x (n + k) = 32 x (64 + 160) = 7,168 (w2's and w1's alike); the backward runs w2 first: grad_output^T
    # 32 x 64 = 2,048, then the input column-major 32 x 160 = 5,120 (torchao eab345c preprocess_addmm)
    fp8 = _profile(TINY, 1).layers[1].float8
    assert fp8.transient_bytes == 7168
    assert float8.transient_parts(fp8) == (2048, 5120)
    # TP 2 + SP: w2's k is 80 a rank: 32 x 64 = 2,048 and 32 x 80 = 2,560
    fp8 = _profile(TINY, 2).layers[1].float8
    assert (fp8.transient_bytes, float8.transient_parts(fp8)) == (4608, (2048, 2560))
    # no linear whose two make it: one tensor, as before
    odd = fp8.model_copy(update={"transient_bytes": 4609})
    assert float8.transient_parts(odd) == ()


def test_the_record_makes_them_first_and_frees_them_at_its_end():
    record = AllocRecord(forward=[10, 20, -1], backward=[5, -3, -2], output=2, input_grad=3)
    added = float8.with_float8(record, kept=7, transient=6, parts=(4, 2))
    # forward: the float8 weight made last (id 3); backward: the two copies first (ids 4, 5), the record's 5 now
    # id 6 (its free renumbered), the copies and the weight freed last
    assert added.forward == [10, 20, -1, 7]
    assert added.backward == [4, 2, 5, -6, -2, -4, -5, -3]
    assert added.input_grad == 6
    # parts that do not add up to the transient: one tensor, as before
    assert float8.with_float8(record, kept=7, transient=6, parts=(4, 1)).backward == [6, 5, -5, -2, -4, -3]
