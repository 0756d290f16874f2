"""A compiled, checkpointed block reruns what AOTAutograd's partitioner puts in its backward, not the
eager checkpoint's rerun (planner/cost/compiledrerun.py; docs/framework-facts.md §81): the hand count
on a tiny block traced as torch.compile traces it, the profile's compiled rerun against that count,
and the evaluator charging it."""

import collections
import functools
import json

import pytest
from click.testing import CliRunner
from fixtures.aot_graphs import graph_keeping_backend
from fixtures.tiny_compiled import TINY, tiny_profile

from planner.cli import cli
from planner.cost import compiledrerun, rules
from planner.cost.layers import LayerCost
from planner.profiler import analytic_time, compiled_time
from planner.profiler.analytic import Shape
from planner.schema import TrainSetup

T, H, KV, F = 16, 64, 32, 160  # tokens, hidden (= Q's width), K/V's width (2 of 4 heads), the MLP's width


def _backward_matmuls(policy: str) -> tuple[collections.Counter, collections.Counter]:
    """(the backward graph's matmuls by their operands' shapes, its other ops of note by name) of the
    tiny LLaMA block compiled as torchtitan compiles it (the checkpoint inside torch.compile, fullgraph):
    dynamo and AOTAutograd's min-cut partitioner as inductor runs them, the graphs kept before inductor."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from planner.profiler.compiled import llama_block, llama_block_inputs

    backend, graphs = graph_keeping_backend()
    block = functools.partial(llama_block, heads=4, kv_heads=2)
    fn = block if policy == "none" else functools.partial(checkpoint, block, use_reentrant=False)
    torch._dynamo.reset()
    inputs = llama_block_inputs(batch=1, seq=T, hidden=H, heads=4, kv_heads=2, ffn=F)
    torch.compile(fn, backend=backend, fullgraph=True)(*inputs).sum().backward()
    mms, others = collections.Counter(), collections.Counter()
    for node in graphs["bw"].graph.nodes:
        name = str(node.target)
        if node.op == "call_function" and name == "aten.mm.default":
            mms[tuple(tuple(arg.meta["val"].shape) for arg in node.args)] += 1
        elif node.op == "call_function" and any(part in name for part in ("rng_state", "rsqrt", "dot_product")):
            others[name] += 1
    return mms, others


def test_a_compiled_checkpointed_block_reruns_six_matmuls_attention_and_the_norms_not_the_down_projection():
    none, none_others = _backward_matmuls("none")
    full, full_others = _backward_matmuls("full")
    # without a checkpoint, two matmuls a linear: 7 x 2
    assert sum(none.values()) == 14
    # the rerun, by hand: wq and wo ((T, h) x (h, h)), wk and wv ((T, h) x (h, kv)), w1 and w3 ((T, h) x (h, f)):
    # the forward's matmuls whose outputs the backward reads; the down projection's ((T, f) x (f, h)) is not
    # among them: only the residual add reads its output, and the add's backward reads no value
    assert full - none == {((T, H), (H, H)): 2, ((T, H), (H, KV)): 2, ((T, H), (H, F)): 2}
    assert none - full == {}
    # the flash forward reruns (its output and log-sum-exp feed its backward), under the rng wrapper a
    # checkpointed attention runs in; the two norms' 1/rms are recomputed, not saved
    assert full_others["run_with_rng_state"] == 1 and not none_others["run_with_rng_state"]
    assert full_others["aten.rsqrt.default"] == 2


def test_the_profiles_compiled_full_rerun_runs_those_kernels():
    shape = Shape(seq_len=1024, micro_batch_size=8)
    tokens = shape.tokens
    passes = analytic_time.block_work(TINY, shape)
    kernels = compiled_time._rerun_kernels(TINY, shape, "full", passes[2])
    matmuls = sorted(kernel.flops for kernel in kernels if kernel.kind == "matmul")
    h, kv, f = TINY.hidden_size, 2 * TINY.hidden_size // TINY.num_heads, TINY.intermediate_size
    assert matmuls == sorted([2 * tokens * h * h] * 2 + [2 * tokens * h * kv] * 2 + [2 * tokens * h * f] * 2)
    forward_attention = [kernel for kernel, _ in passes[0].kernels if kernel.kind == "attention-fwd"]
    assert [kernel for kernel in kernels if kernel.kind != "matmul"] == forward_attention


def _layer(kind: str = "decoder_block") -> LayerCost:
    return LayerCost(name="layers.0", kind=kind, fwd_ms=2.0, bwd_ms=4.0, act_bytes=10, input_bytes=4,
                     output_bytes=4, input_in_act_bytes=0, param_count=0, transient_bytes=0, recompute_ms=1.5)


def _setup(version: str, compile_model: bool) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[1 << 40], runtime="torchtitan",
                      runtime_version=version, compile=compile_model)


@pytest.mark.parametrize("version, compile_model, kind, expected", [
    ("b5bcd76c", False, "decoder_block", 2.0),  # eager, early_stop=False: the whole forward
    ("b5bcd76c", True, "decoder_block", 1.5),  # compiled: the partitioner's rerun, the profile's recompute
    ("b5bcd76c", True, "moe_block", 1.5),
    ("b5bcd76c", True, "embedding", 2.0),  # torchtitan compiles the blocks only
    ("9dec370", False, "decoder_block", 1.5),  # eager, torch's default early stop
    ("9dec370", True, "decoder_block", 1.5),
])
def test_the_evaluator_charges_a_compiled_checkpointed_block_the_partitioners_rerun(version, compile_model, kind,
                                                                                     expected):
    setup = _setup(version, compile_model)
    assert compiledrerun.rerun_partitioned(kind, setup.training) == (compile_model and kind != "embedding")
    assert rules.option_recompute_ms(_layer(kind), 1, setup) == expected


def _iteration_ms(path, *args) -> float:
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4", "--microbatches",
                                      "1", "--mem", "80GB", "--precision", "bf16-mixed", "--json", "--runtime",
                                      "torchtitan", "--runtime-version", "b5bcd76c", "--compile", *args])
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]["iteration_ms"]


def test_checkpointing_the_compiled_blocks_adds_their_compiled_rerun_not_their_forward(tmp_path):
    profile, path = tiny_profile(tmp_path, compiled=True)
    blocks = [layer for layer in profile.layers if layer.compiled_time is not None]
    plain = _iteration_ms(path, "--ckpt-per-stage", "0")
    checkpointed = _iteration_ms(path, "--checkpoint", "layers.0,layers.1")
    rerun = sum(block.compiled_time.recompute_ms["full"] for block in blocks)
    assert checkpointed - plain == pytest.approx(rerun, rel=1e-9)
    assert rerun < sum(block.compiled_time.fwd_ms for block in blocks)
