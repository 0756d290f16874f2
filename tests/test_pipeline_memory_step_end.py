"""The step's end as its own moment of a rank's peak (chunked.step_end_bytes): torch's pipelining
schedule keeps every microbatch's output of the last stage in output_chunks and step() returns
torch.cat of them while they are still held, so 2 x M logits are live then, with no activations."""

from __future__ import annotations

import pytest

from planner.cost import schedules
from planner.cost.layers import layer_costs
from planner.cost.score import evaluate, stage_cost
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, StagePlan, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
LOGITS = 2 * 32 * 128 * 2  # micro-batch x seq x vocab x bf16
# 9dec370's rotary table on every model chunk, which the later records do not read: seq x head_dim / 2 x
# complex64 (planner/cost/rotarytable.py; tests/test_cp_rotary_table.py)
ROTARY = 32 * 8 * 8


@pytest.fixture(scope="module")
def tiny():
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def setup(version: str, **fields) -> TrainSetup:
    base = dict(micro_batch_size=2, precision="bf16-mixed", runtime="torchtitan", runtime_version=version)
    return TrainSetup(**(base | fields))


def test_the_last_1f1b_stage_peaks_at_the_merge_of_its_kept_logits(tiny, monkeypatch):
    from planner.cost import eager_norm

    # 9dec370's final norm in eager fp32 set aside (tests/test_finalnorm.py counts it): on this tiny head its 20 B an
    # element at pow's backward pass the head's own transient, and the activations' moment passes the merge by 9,988 B
    monkeypatch.setattr(eager_norm, "elements", lambda layer, profile, setup: 0)
    layers = layer_costs(tiny)  # embedding, 2 blocks, head (its output: the logits)
    assert layers[-1].output_bytes == LOGITS
    m = 16
    pipe = dict(stages=2, microbatches=m, mem_caps_bytes=[2**50] * 2, schedule="1F1B")
    old, new = (stage_cost(layers[2:], [0, 0], stage=1, profile=tiny, setup=setup(v, **pipe))
                for v in ("9dec370", "b5bcd76c"))
    # the last stage runs one microbatch in flight: M - 1 logits among its buffers (output_chunks), the last
    # one's at the step's end, and the cat of all M: 2 M logits in all; and at 9dec370's torch every input
    # gradient stays on its receive buffer (M - 1 + 1 = M, b5bcd76c's torch the one being sent:
    # tests/test_held_input_grads.py); and 9dec370's rotary table; less b5bcd76c's positions, held with the whole
    # batch on every stage (rules.batch_bytes): an int64 a token, M x 2 x 32 x 8 B = 16 x 512 = 8,192 B
    positions = m * 2 * 32 * 8
    assert old.buffer_bytes - new.buffer_bytes == (m - 1) * LOGITS + (m - 1) * layers[2].input_bytes + ROTARY - positions
    assert old.step_end_bytes == (1 + m) * LOGITS
    assert new.step_end_bytes == 0  # return_outputs=False: nothing kept, nothing merged
    # no data parallelism: no gradient made late, so the moment sits on static + buffers
    assert old.peak_bytes == old.static_bytes + old.buffer_bytes + (1 + m) * LOGITS
    # and it is the peak: above the activations' moment the buffers already carry
    assert old.peak_bytes > old.static_bytes + old.buffer_bytes + old.activation_bytes + old.transient_bytes


def test_a_middle_1f1b_stage_keeps_its_outputs_but_merges_none(tiny):
    layers = layer_costs(tiny)
    pipe = dict(stages=2, microbatches=5, mem_caps_bytes=[2**50] * 2, schedule="1F1B")
    first = stage_cost(layers[:2], [0, 0], stage=0, profile=tiny, setup=setup("9dec370", **pipe))
    # stage 0 runs min(P - 0, M) = 2 in flight: their outputs are kept at the step's end beside the
    # 3 among its buffers; only the last stage's step() returns a merge
    assert first.step_end_bytes == 2 * layers[1].output_bytes


def test_a_walked_schedule_ends_with_its_sends_its_kept_logits_and_their_merge(tiny):
    layers = layer_costs(tiny)
    m = 4
    pipe = dict(stages=2, microbatches=m, mem_caps_bytes=[2**50] * 2, schedule="interleaved-1F1B", chunks=2)
    order = schedules.pipeline_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=m, num_chunks=2)
    assert order.stages_of(1) == (1, 3)
    names = [layer.name for layer in layers]
    ranks = [StagePlan(index=0, layers=[names[0], names[2]], chunks=[[names[0]], [names[2]]]),
             StagePlan(index=1, layers=[names[1], names[3]], chunks=[[names[1]], [names[3]]])]
    old, new = (evaluate(ranks, tiny, setup(v, **pipe)).stages[1] for v in ("9dec370", "b5bcd76c"))
    block, head = layers[1], layers[3]
    # stage 1 (a block) holds each send, its output and its input gradient, to the step's end; stage 3
    # (the head) its input gradient's send and its logits in output_chunks; then the cat of the M logits
    # and each microbatch's 4 B loss value (lossvalues.walked_value_bytes, framework-facts §703)
    sends = m * (block.output_bytes + block.input_bytes + head.input_bytes) + m * 4
    assert old.step_end_bytes == sends + m * LOGITS + m * LOGITS
    assert new.step_end_bytes == sends  # torchtitan b5bcd76c: no outputs back, the sends and values alone
    for cost in (old, new):
        assert cost.peak_bytes >= cost.static_bytes + cost.buffer_bytes + cost.step_end_bytes


# ---------------------------------------------------------------- FSDP2's reduce-scatter input, kept to the next step


def test_torch_1963fc8s_pipeline_keeps_each_stages_last_reduce_scatter_input(tiny):
    """torchtitan 9dec370 ran torch 1963fc8, whose pipelining called FSDP2's post-backward by hand
    but not its final callback (added by pytorch#144535): the last group's reduce-scatter input, a
    block's whole fp32 gradients, stays to the next step's last backward, one per stage; torchtitan
    bbb1b616's torch drops it."""
    layers = layer_costs(tiny)
    block = 64 * 64 + 64 * 32 * 2 + 64 * 64 + 3 * 64 * 160 + 2 * 64  # q, k, v, o, the MLP, two norms
    assert max(layer.param_count for layer in layers) == layers[1].param_count == block
    kept = block * 4  # fp32 (FSDP2's reduce_dtype under torchtitan)
    sharded = dict(dp=2, zero=3, zero_gather="per-iteration")
    pipe = dict(stages=2, microbatches=4, mem_caps_bytes=[2**50] * 2, schedule="1F1B", **sharded)
    for stage, mine in ((0, layers[:2]), (1, layers[2:])):
        old, new = (stage_cost(mine, [0] * len(mine), stage=stage, profile=tiny, setup=setup(v, **pipe))
                    for v in ("9dec370", "bbb1b616"))
        assert old.buffer_bytes - new.buffer_bytes == kept + ROTARY
    # interleaved: each of a rank's two stages is its own FSDP2 root, each keeps its own
    chunked = dict(pipe, schedule="interleaved-1F1B", chunks=2)
    names = [layer.name for layer in layers]
    ranks = [StagePlan(index=0, layers=[names[0], names[2]], chunks=[[names[0]], [names[2]]]),
             StagePlan(index=1, layers=[names[1], names[3]], chunks=[[names[1]], [names[3]]])]
    old, new = (evaluate(ranks, tiny, setup(v, **chunked)).stages[0] for v in ("9dec370", "bbb1b616"))
    assert old.buffer_bytes - new.buffer_bytes == 2 * kept + 2 * ROTARY  # and a table on each model chunk
    # without a pipeline FSDP2's own final callback drops it; without sharding nothing is reduce-scattered
    alone = dict(sharded, stages=1, microbatches=4, mem_caps_bytes=[2**50])
    unsharded = dict(pipe, dp=1, zero=0, zero_gather="per-microbatch")
    for fields, mine in ((alone, layers), (unsharded, layers[:2])):
        costs = [stage_cost(mine, [0] * len(mine), stage=0, profile=tiny, setup=setup(v, **fields))
                 for v in ("9dec370", "bbb1b616")]
        assert costs[0].buffer_bytes == costs[1].buffer_bytes + ROTARY


def test_evaluate_json_carries_each_stages_step_end_bytes(tiny, tmp_path):
    # the step's end was scored but evaluate --json gave no step_end_bytes to hold a run against
    import json

    from click.testing import CliRunner

    from planner.cli import cli

    path = tmp_path / "tiny.json"
    path.write_text(tiny.model_dump_json())
    m = 16
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "2,2",
                                      "--ckpt-per-stage", "0,0", "--microbatches", str(m), "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--runtime", "torchtitan",
                                      "--runtime-version", "9dec370", "--json"])
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    first, last = found["hand"]["stages"]
    assert last["step_end_bytes"] == (1 + m) * LOGITS  # the last kept logits and the merge of all M
    assert first["step_end_bytes"] == 2 * layer_costs(tiny)[1].output_bytes  # 2 in flight, kept; no merge
