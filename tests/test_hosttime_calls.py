"""The host calls a Megatron step makes beside its layers' ops (planner/cost/hostcalls.py; scripts/bench_host_comm.py):
the collectives' issue counted from the profile's collectives and the loss's, --overlap-param-gather's pre-hooks by
module and parameter, get_batch's keys by stage, each inside the pass that makes it; and the replicas doing what
Megatron's code does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fixtures.scripts import load_script

from planner.cost import hostcalls, hosttime, rules, runtimes
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

bench = load_script("bench_host_comm")
MODEL = FileRef(file="arch:test", sha256="0" * 64)
GPT = archs.Arch(name="tiny-gpt", hidden_size=64, intermediate_size=256, num_layers=1, num_heads=4, num_kv_heads=4,
                 vocab_size=128, style="gpt", tie_word_embeddings=True, max_position_embeddings=32)
CALL = 13.48e-3  # ms: one torch Linear forward on the DGX H100's host (TransformerEngine#2053)
AR, AG, RS, BC, HOOK, PARAM, COPY = 0.40, 0.85, 0.82, 0.40, 0.22, 0.07, 0.14  # the record's, in Linear forwards


def _setup(runtime="megatron", stages=1, tp=1, **training) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=stages, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime=runtime, comm={"tp": tp}, **training)


def _layers(arch=GPT, gpu="h100", seq=32):
    profile = analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=1), gpu=archs.gpu(gpu), model=MODEL)
    return profile, layer_costs(profile)


def _with(layer, *collectives):  # (kind, fwd, bwd, recompute) calls a microbatch
    return replace(layer, collectives=tuple((kind, 1 << 20, f, b, r, None) for kind, f, b, r in collectives))


def test_megatrons_record_reads_the_calls_benchmark():
    rest = dict((name, (a, b)) for name, a, b in runtimes.of(_setup().training).host_rest_linears)
    assert {name: rest[name] for name in ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "pre_hook",
                                          "get_batch")} == {
        "all-reduce": (AR, 0.0), "all-gather": (AG, 0.0), "reduce-scatter": (RS, 0.0), "broadcast": (BC, 0.0),
        "pre_hook": (HOOK, PARAM), "get_batch": (COPY, 0.0)}


def test_collectives_issue_counted_per_pass_from_the_profile():
    profile, (_, block, _) = _layers()
    layer = _with(block, ("all-reduce", 2, 2, 2), ("all-gather", 1, 0, 1), ("reduce-scatter", 0, 3, 0))
    assert hostcalls.collectives_ms(layer, "fwd", profile, _setup()) == pytest.approx((2 * AR + AG) * CALL)
    assert hostcalls.collectives_ms(layer, "bwd", profile, _setup()) == pytest.approx((2 * AR + 3 * RS) * CALL)
    assert hostcalls.collectives_ms(layer, "recompute", profile, _setup()) == pytest.approx((2 * AR + AG) * CALL)
    assert hostcalls.collectives_ms(block, "fwd", profile, _setup()) == 0.0  # TP 1: the profile lists none
    assert hostcalls.collectives_ms(layer, "fwd", profile, _setup("torchtitan")) == 0.0  # its record reads none
    b200, _ = _layers(gpu="b200")
    assert hostcalls.collectives_ms(layer, "fwd", b200, _setup()) == 0.0  # no Linear published for its host


def test_the_loss_all_reduces_by_cross_entropy():
    profile, _ = _layers()
    assert hostcalls.loss_collectives_ms(profile, _setup()) == 0.0  # TP 1
    assert hostcalls.loss_collectives_ms(profile, _setup(tp=4)) == pytest.approx(3 * AR * CALL)
    assert hostcalls.loss_collectives_ms(profile, _setup(tp=4, fused_cross_entropy=True)) == pytest.approx(
        2 * AR * CALL)
    assert hostcalls.loss_collectives_ms(profile, _setup(tp=4, te_cross_entropy=True)) == 0.0


def test_pre_hooks_only_under_overlap_param_gather():
    profile, _ = _layers()
    assert hostcalls.pre_hooks_ms(13, 12, _setup(), profile) == 0.0
    on = _setup(dp=2, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    assert hostcalls.pre_hooks_ms(13, 12, on, profile) == pytest.approx((13 * HOOK + 12 * PARAM) * CALL)
    assert hostcalls.block_modules(profile) == 13  # flash: TE's fused backend, one module
    eager = profile.model_copy(update={"assumptions": {**profile.assumptions, "attention": "eager"}})
    assert hostcalls.block_modules(eager) == 15


def test_get_batch_on_the_first_and_last_stage_only():
    profile, _ = _layers()
    assert hostcalls.get_batch_ms(0, profile, _setup()) == pytest.approx(5 * (COPY + BC) * CALL)
    three = _setup(stages=3)
    assert [hostcalls.get_batch_ms(s, profile, three) for s in range(3)] == pytest.approx(
        [3 * (COPY + BC) * CALL, 0.0, 3 * (COPY + BC) * CALL])


def test_a_host_bound_block_charges_its_calls_in_each_pass():
    profile, (_, block, _) = _layers()
    setup = _setup(tp=4, dp=2, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    layer = _with(replace(block, fwd_ms=1e-6, bwd_ms=1e-6), ("all-reduce", 2, 2, 2))
    fwd, bwd = hosttime.host_block_ms(profile, setup)
    hooks = (13 * HOOK + 12 * PARAM) * CALL
    host_fwd = fwd + hooks + 2 * AR * CALL
    host_bwd = bwd + hosttime.grad_hook_ms(layer, profile, setup) + 2 * AR * CALL
    assert hosttime.host_bound_ms(layer, 0, profile, setup) == pytest.approx(host_fwd + host_bwd - 2e-6)
    rerun = rules.recompute_ms(layer, setup)
    assert hosttime.host_bound_ms(layer, 1, profile, setup) == pytest.approx(
        host_fwd + host_bwd - 2e-6 + max(0.0, fwd + hooks + 2 * AR * CALL - rerun))


def test_the_embedding_and_head_carry_get_batch_hooks_and_collectives():
    profile, (embedding, _, head) = _layers()
    setup = _setup(dp=2, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    fast = replace(embedding, fwd_ms=0.0, bwd_ms=0.0)
    fwd, bwd = hosttime.rest_ms(profile, setup, "embedding")
    plus = (7 * HOOK + 2 * PARAM) * CALL + 5 * (COPY + BC) * CALL
    assert hosttime.host_bound_ms(fast, 0, profile, setup) == pytest.approx(
        fwd + plus + bwd + hosttime.grad_hook_ms(fast, profile, setup))
    # the head: its output layer's backward all-reduce, the loss's three, the two modules' hooks, one span
    tp4 = _setup(tp=4, dp=2, zero=1, overlap_grad_reduce=True, overlap_param_gather=True)
    idle = replace(_with(head, ("all-reduce", 0, 1, 0)), fwd_ms=0.0, bwd_ms=0.0)
    base = replace(head, fwd_ms=0.0, bwd_ms=0.0)
    gained = hosttime.host_bound_ms(idle, 0, profile, tp4) - hosttime.host_bound_ms(base, 0, profile, _setup(tp=4))
    assert gained == pytest.approx((AR + 2 * HOOK + 2 * PARAM) * CALL)  # the loss's three in both


def test_the_pre_hook_replica_reads_each_parameter_once_and_waits_for_nothing():
    module = bench._Held(4)
    ddp = bench._Ddp(module)
    seen = []
    for bucket in ddp.param_to_bucket_group.values():
        bucket.finish_param_sync = lambda skip_next_bucket_dispatch=False, seen=seen: seen.append(
            skip_next_bucket_dispatch)
    module.register_forward_pre_hook(ddp.make_hook())
    x = torch.ones(2)
    assert module(x) is x and seen == [True] * 4  # align_param_gather: the next bucket's gather not dispatched here
    pending = bench._Bucket()
    pending.param_gather_handle = object()
    with pytest.raises(AssertionError):
        pending.finish_param_sync()  # a handle left would be a wait, which only the step's first microbatch has


def test_the_fake_backend_issues_each_collective():
    us = bench.fake_collectives(5)
    assert set(us) == {"all-reduce", "all-gather", "reduce-scatter", "broadcast"} and all(v > 0 for v in us.values())
    assert not torch.distributed.is_initialized()
