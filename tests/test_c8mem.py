"""The gathered K/V a compiled, fully recomputed block holds through its MLP's backward (torch 2.6.0 under
torchtitan 9dec370's block compile: docs/framework-facts.md §30, §139), by hand; and at C8's shape, where the
ring's own backward still sets the charge (docs/published-runs.md §31.c8mem)."""

from __future__ import annotations

import dataclasses

from planner.cost import contextparallel
from planner.cost.layers import ExchangeCost, layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

MIB = 2**20
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)


def _block():
    profile = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=1, cp=1), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    return layer_costs(profile)[1]


def _setup(runtime: str = "torchtitan", **fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, context_parallel=8, cp=8, cp_gb_per_s=100.0, **fields)


# C8's block on rank cp - 1 (TP 8: 16 query heads and 1 K/V head a rank, 32,768 tokens, head dim 128, bf16):
# Q 32,768 x 16 x 128 x 2 B = 128 MiB; K with V at their one head 16 MiB, repeated to the 16 query heads 256 MiB
C8 = ExchangeCost(ranks=8, q_bytes=128 * MIB, kv_bytes=16 * MIB, attention_fwd_ms=1.0, attention_bwd_ms=1.0)
COMPILED = dict(compile=True, runtime_version="9dec370")


def test_the_gathered_kv_is_held_only_where_the_compiled_backward_reuses_the_reruns_gather():
    exchanged = contextparallel.as_exchanged(C8, _setup(**COMPILED).training)
    assert exchanged.kv_bytes == 256 * MIB
    held = contextparallel.held_through_mlp_bytes
    assert held(exchanged, "allgather", 1, _setup(**COMPILED).training) == 8 * 256 * MIB  # cp x K/V: 2 GiB
    assert held(exchanged, "allgather", 0, _setup(**COMPILED).training) == 0  # no rerun: nothing gathered early
    eager = _setup(runtime_version="9dec370").training
    assert held(exchanged, "allgather", 1, eager) == 0  # eager: the backward gathers again inside the attention's
    assert held(exchanged, "p2p", 1, _setup(**COMPILED).training) == 0


def test_at_c8s_block_the_held_gather_sets_the_charge_by_176_mib_over_the_rings_own_backward():
    # the compiled ring's backward peak on rank cp - 1, (cp + 4.5) K/V + 5 Q (cpring, framework-facts §98), with the
    # output gradient (128 MiB): 3,968 MiB
    setup = _setup(**COMPILED)
    ring = (8 + 4.5) * 256 * MIB + 5 * 128 * MIB
    assert contextparallel.buffer_bytes(contextparallel.as_exchanged(C8, setup.training), "allgather",
                                        compiled=True)[1] == ring
    # C8's block as the row's evaluation holds it (its transient 2,096 MiB: compiled, Float8, TP 8 + SP): the ring
    # is 3,968 - 2,096 = 1,872 MiB over the transient, the gathered K/V beside the MLP's backward 2,048
    block = dataclasses.replace(_block(), context_parallel=C8, transient_bytes=2096 * MIB, output_bytes=128 * MIB)
    assert ring + 128 * MIB - 2096 * MIB == 1872 * MIB
    assert contextparallel.extra_bytes(block, setup, 1) == 2048 * MIB
    assert contextparallel.extra_bytes(block, setup, 1) - contextparallel.extra_bytes(block, setup, 0) == 176 * MIB
    # the analytic profile's own transient (1,376 MiB, before the evaluation's terms): the ring's 2,592 sets it
    raw = dataclasses.replace(block, transient_bytes=1376 * MIB)
    assert contextparallel.extra_bytes(raw, setup, 1) == contextparallel.extra_bytes(raw, setup, 0) == 2592 * MIB


def test_a_wide_mlp_transient_leaves_the_gathered_kv_on_top_of_it():
    # a transient past (4.5 K/V + 5 Q + the output) = 1,920 MiB: the MLP's backward with the gathered K/V beside
    # it is the block's peak, 2,048 MiB over the transient; without the rerun (option 0) the ring's alone, 0 here
    block = dataclasses.replace(_block(), context_parallel=C8, transient_bytes=4096 * MIB, output_bytes=128 * MIB)
    setup = _setup(**COMPILED)
    assert contextparallel.extra_bytes(block, setup, 1) == 2048 * MIB
    assert contextparallel.extra_bytes(block, setup, 0) == 0
    # eager: no gather held beside the MLP; the eager ring's own backward peak, 6 Q + (cp + 8.5) K/V at step 1's
    # flash call (framework-facts §98) = 4,992 MiB, with the output gradient, over the transient
    assert contextparallel.extra_bytes(block, _setup(runtime_version="9dec370"), 1) == \
        6 * 128 * MIB + 16.5 * 256 * MIB + 128 * MIB - 4096 * MIB == 1024 * MIB
