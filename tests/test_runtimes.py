"""Each runtime a record of facts (planner/cost/runtimes.py): every fact sourced, no cost function
testing a runtime's name, and hand counts of the bytes each record changes on tiny cases."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import dataparallel, runtimes
from planner.cost.layers import layer_costs
from planner.cost.rules import loss_kept_bytes, stage_constant_transient_bytes
from planner.cost.stepscratch import layer_step_scratch_bytes
from planner.errors import UserError
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

COST = Path(__file__).resolve().parents[1] / "planner" / "cost"
NAMES = set(runtimes.VERSIONS)
H100 = archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
REF = FileRef(file="arch:test", sha256="0" * 64)


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], precision="bf16-mixed")
    return TrainSetup(**(base | fields))


# ---------------------------------------------------------------- the records


@pytest.mark.parametrize("runtime, version", [(r, v) for r, vs in runtimes.VERSIONS.items() for v in vs])
def test_every_fact_of_every_record_names_its_source(runtime, version):
    record = runtimes.facts(runtime, version)
    assert record.name == runtime
    assert set(runtimes.fact_fields()) <= set(record.sources)
    assert all(record.sources[name].strip() for name in runtimes.fact_fields())


def test_no_cost_function_tests_a_runtime_name():
    """Outside the records, no module of planner/cost compares with a runtime's name or reads
    `.runtime` (a term reads the record instead)."""
    offenders = []
    for path in COST.glob("*.py"):
        if path.name in ("runtimes.py", "runtime_titan.py", "runtime_megatron.py"):  # the records
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Attribute) and node.attr == "runtime":
                offenders.append(f"{path.name}:{node.lineno} .runtime")
    assert offenders == []


def test_an_unknown_version_is_refused_naming_the_known_ones():
    with pytest.raises(UserError, match="use one of b5bcd76c, 2c8b5947, bbb1b616, 9dec370"):
        runtimes.facts("torchtitan", "v0.1")


# ---------------------------------------------------------------- static bytes, by hand


def test_megatron_holds_fp32_main_grads_and_flat_zero_1():
    # bf16 weight 2 + fp32 main_grad 4 + (fp32 master, m, v = 12) / DP 2 = 12 B/param: the
    # published gpt3_7b_tp4_pp1 static is 12.06 B/param (docs/published-runs.md M4)
    assert dataparallel.bytes_per_param(setup(dp=2, zero=1, runtime="megatron")) == 12
    assert dataparallel.bytes_per_param(setup(dp=2, zero=1)) == 2 + 2 + 6  # ckplan's runtime: bf16 .grad
    # the distributed optimizer splits flat buckets evenly: no whole-tensor excess
    assert dataparallel.zero_one_excess_bytes(1000, 900, setup(dp=2, zero=1, runtime="megatron")) == 0
    assert dataparallel.zero_one_excess_bytes(1000, 900, setup(dp=2, zero=1)) == 12 * (900 - 500)


def test_torchtitan_keeps_fp32_shards_and_whole_fp32_grads_beside_a_pipeline():
    # FSDP2: the fp32 sharded parameter is the master; grads in reduce_dtype fp32
    per_microbatch = setup(dp=8, zero=3, runtime="torchtitan")
    assert dataparallel.bytes_per_param(per_microbatch) == (4 + 4 + 8) / 8
    # under PP: bf16 weights gathered (2) beside the fp32 shard (4/8), whole fp32 grads (4), m + v (8/8)
    whole = setup(stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2, dp=8, zero=3, zero_gather="per-iteration",
                  runtime="torchtitan")
    assert dataparallel.bytes_per_param(whole) == 2 + 4 / 8 + 4 + 8 / 8
    ours = whole.model_copy(update={"runtime": "ckplan"})
    assert dataparallel.bytes_per_param(ours) == 2 + 2 / 8 + 2 + 12 / 8


def test_bf16_optimizer_states_halve_the_moments():
    assert dataparallel.bytes_per_param(setup(optimizer_state_dtype="bf16")) == 2 + 2 + 4 + 4
    assert dataparallel.bytes_per_param(setup(optimizer_state_dtype="bf16", runtime="megatron")) == 2 + 4 + 4 + 4
    assert dataparallel.bytes_per_param(setup(precision="fp32", optimizer_state_dtype="bf16")) == 4 + 4 + 4


# ---------------------------------------------------------------- the loss region and the step, by hand


@pytest.fixture(scope="module")
def tiny():
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2), gpu=H100, model=REF)


def test_the_loss_region_is_the_records_multiple_of_the_logits(tiny):
    logits = 2 * 32 * 128 * 2  # micro-batch x seq x vocab x bf16
    assert tiny.layers[-1].output_bytes == logits
    last = 0  # one stage: the last
    # ckplan (the analytic formula): fp32 softmax kept (2x) + the loss value; the fp32 gradient (2x)
    assert loss_kept_bytes(tiny, last, setup()) == 2 * logits + 4 == tiny.loss_bytes
    assert stage_constant_transient_bytes(tiny, last, setup()) == 2 * logits
    # Megatron-LM's vocab-parallel CE: kept 2x in all, peak 3x; the GPT model drops the logits once the loss
    # is made, so all 2x are the loss's (rules.logits_in_loss_kept), freed before the output layer's backward
    assert loss_kept_bytes(tiny, last, setup(runtime="megatron")) == 2 * logits + 4
    assert stage_constant_transient_bytes(tiny, last, setup(runtime="megatron")) == 1 * logits
    # torchtitan's plain loss: kept 2x, peak 6x; transformers 4.3x as ColossalAI runs it: kept 4x, peak 8x
    assert stage_constant_transient_bytes(tiny, last, setup(runtime="torchtitan")) == 4 * logits
    assert loss_kept_bytes(tiny, last, setup(runtime="colossalai", runtime_version="hf-4.3x")) == 3 * logits + 4
    assert stage_constant_transient_bytes(tiny, last, setup(runtime="colossalai", runtime_version="hf-4.3x")) == 4 * logits


def test_torchtitans_loss_parallel_peaks_at_eight_logits_under_tp():
    profile = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=2), gpu=H100, model=REF)
    shard = 2 * 32 * 64 * 2  # the vocab shard's bf16 logits
    assert profile.layers[-1].output_bytes == shard
    assert stage_constant_transient_bytes(profile, 0, setup(runtime="torchtitan")) == (8 - 2) * shard


def test_fused_adam_allocates_no_step_scratch_and_foreach_adam_its_sqrt(tiny):
    block = layer_costs(tiny)[1]
    assert layer_step_scratch_bytes(block, setup(runtime="megatron"), "cuda") == 0
    # torchtitan 9dec370's AdamW is foreach (sqrt(v) a new fp32 tensor a shard parameter); fused since 2025-02-24
    assert layer_step_scratch_bytes(block, setup(runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3),
                                    "cuda") == pytest.approx(block.param_count * 4 / 4)
    for version in ("bbb1b616", "2c8b5947", "b5bcd76c"):
        assert layer_step_scratch_bytes(block, setup(runtime="torchtitan", runtime_version=version, dp=4, zero=3),
                                        "cuda") == 0
    assert layer_step_scratch_bytes(block, setup(optimizer_state_dtype="bf16"), "cuda") == block.param_count * 2


# ---------------------------------------------------------------- the settings on the command line


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    """The tiny model at 8 x 1,024 tokens: its activations, not its optimizer step, set its peak."""
    import dataclasses

    arch = dataclasses.replace(TINY, max_position_embeddings=1024)
    profile = analytic.analytic_profile(arch, Shape(seq_len=1024, micro_batch_size=8), gpu=H100, model=REF)
    path = tmp_path_factory.mktemp("p") / "tiny.json"
    path.write_text(profile.model_dump_json())
    return path


def _evaluate(path, *extra, ckpt="0"):
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                    "--ckpt-per-stage", ckpt, "--microbatches", "1", "--mem", "80GB",
                                    "--precision", "bf16-mixed", "--json", *extra])


def _peak(result) -> int:
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])  # notes follow the json
    return found["hand"]["stages"][0]["peak_bytes"]


@pytest.mark.parametrize("flags, named", [
    (["--float8"], "Float8"),
    (["--fp8-all-gather"], "float8 all-gather"),
    (["--cp", "2"], "context parallelism"),
    (["--chunked-cross-entropy"], "chunked cross-entropy"),
    (["--mtp-layers", "1"], "multi-token prediction"),
    (["--expert-tp", "2"], "expert tensor parallelism"),
    (["--runtime", "torchtitan", "--runtime-version", "v0"], "not one read for torchtitan"),
])
def test_a_setting_not_modelled_is_refused_in_one_sentence(tiny_path, flags, named):
    result = _evaluate(tiny_path, *flags)
    assert result.exit_code != 0
    assert named in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_modelled_settings_change_the_prediction(tiny_path):
    plain = _peak(_evaluate(tiny_path))
    # bf16 moments: 4 B/param fewer in static, 2 fewer of step scratch
    assert _peak(_evaluate(tiny_path, "--optimizer-state-dtype", "bf16")) < plain
    # the expert TP equal to the profile's TP is the default: accepted, unchanged
    assert _peak(_evaluate(tiny_path, "--expert-tp", "1")) == plain
    # the runtime's record: Megatron's fp32 main_grad, its 3x loss
    assert _peak(_evaluate(tiny_path, "--runtime", "megatron")) != plain
    # --compile says what it changes; at torchtitan 9dec370 the loss is not compiled
    result = _evaluate(tiny_path, "--runtime", "torchtitan", "--runtime-version", "9dec370", "--compile")
    assert "does not compile the loss" in result.output


def test_dtensor_tp_with_sp_saves_the_gathered_inputs_whole():
    # TP 2 + SP: a block's input is 1/2 of the residual stream; torchtitan's ColwiseParallel saves
    # the QKV and MLP inputs gathered, (2 - 1) x that input more each; the head's one input
    from planner.cost.tpgathered import tp_gathered_extra_bytes, tp_gathered_kept_bytes

    profile = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True), gpu=H100,
                                        model=REF)
    block, head = layer_costs(profile)[1], layer_costs(profile)[-1]
    shard = 2 * 32 * 64 * 2 // 2  # micro-batch x seq x hidden x bf16 / TP
    assert block.input_bytes == head.input_bytes == shard
    titan = setup(runtime="torchtitan")
    assert tp_gathered_kept_bytes(block, 0, profile, titan) == 2 * shard
    assert tp_gathered_kept_bytes(head, 0, profile, titan) == shard
    assert tp_gathered_kept_bytes(block, 1, profile, titan) == 0  # checkpointed: keeps its input only
    assert tp_gathered_extra_bytes(block, 1, profile, titan) == 2 * shard  # the rerun forward gathers
    assert tp_gathered_kept_bytes(block, 0, profile, setup(runtime="megatron")) == 0  # saves the shard


def test_under_float8_the_gathered_inputs_are_float8_and_the_unconverted_head_s_bf16():
    # TP 4 + SP: torchao casts a Float8 linear's input shard to float8 before the all-gather (eab345c
    # float8_tensor_parallel.py 49-60, 210-217), so each of a block's two gathered inputs is 4 shards
    # at 1 B = 2 bf16 shards, one beyond the shard the profile counts (bf16: 3 beyond); torchtitan
    # leaves the head (`output`) in bf16
    from planner.cost.tpgathered import tp_gathered_extra_bytes, tp_gathered_kept_bytes

    profile = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=4, sp=True), gpu=H100,
                                        model=REF)
    block, head = layer_costs(profile)[1], layer_costs(profile)[-1]
    shard = 2 * 32 * 64 * 2 // 4
    assert block.float8_param_count > 0 and head.float8_param_count == 0
    titan, titan8 = setup(runtime="torchtitan"), setup(runtime="torchtitan", float8=True)
    assert tp_gathered_extra_bytes(block, 1, profile, titan) == 2 * 3 * shard
    assert tp_gathered_extra_bytes(block, 1, profile, titan8) == 2 * 1 * shard
    assert tp_gathered_kept_bytes(block, 0, profile, titan8) == 2 * 1 * shard
    assert tp_gathered_kept_bytes(head, 0, profile, titan8) == 3 * shard


# ---------------------------------------------------------------- gradients made at the first backward


def test_gradients_made_at_the_first_backward_meet_one_microbatch_fewer():
    from planner.cost import gradtiming

    # GPipe, or 1F1B's stage 0 with A = M: all forwards, then the first backward frees a
    # microbatch (k) as the gradients (G) arrive: max(A k, (A - 1) k + G) = A k + max(0, G - k)
    assert gradtiming.one_chunk(10.0, in_flight=4, kept=3.0, microbatches=4, steady=True) == 7.0
    assert gradtiming.one_chunk(2.0, in_flight=4, kept=3.0, microbatches=4, steady=False) == 0.0
    # 1F1B with more microbatches than in flight: a forward follows, A in flight beside G
    assert gradtiming.one_chunk(10.0, in_flight=3, kept=3.0, microbatches=8, steady=True) == 10.0
    assert gradtiming.one_chunk(0.0, in_flight=3, kept=3.0, microbatches=8, steady=True) == 0.0


def test_a_rank_of_two_chunks_meets_each_chunks_gradients_as_the_others_activations_leave():
    from planner.cost.schedules import Action, ChunkBytes, Schedule, rank_peak

    def a(chunk, kind, mb):
        return Action(stage=chunk, chunk=chunk, kind=kind, microbatch=mb, unit=0)

    def peak(actions, microbatches):
        order = Schedule("interleaved-1F1B", num_ranks=1, num_chunks=2, num_microbatches=microbatches,
                         stage_to_rank=(0, 0), actions=(tuple(actions),))
        return rank_peak(order, 0, stage_bytes=[ChunkBytes(late_grad=5.0)] * 2)

    # F0 F0 F1 F1 | B1 B1 B0 B0, k = 1 per chunk-microbatch, G = 5 per chunk: activations peak at
    # 4 (no gradients yet); after B1: 3 + 5 = 8; chunk 1's last backward reduces its 5 away (torch's
    # pipelining calls FSDP2's post-backward at a stage's M-th backward), so after B1 B1 B0: 1 + 5:
    # 8 is the most, 5 of it gradients (11 were both chunks' gradients held to the step's end)
    found = peak([a(0, "F", 0), a(0, "F", 1), a(1, "F", 0), a(1, "F", 1), a(1, "B", 0), a(1, "B", 1), a(0, "B", 0),
                  a(0, "B", 1)], 2)
    assert (found.step, found.live, found.late_grads) == (4, 8.0, 5.0)
    # a chunk whose weight passes (W) end its backward frees its gradients after its last W
    found = peak([a(0, "F", 0), a(1, "F", 0), a(1, "I", 0), a(1, "W", 0), a(0, "I", 0), a(0, "W", 0)], 1)
    assert (found.step, found.live, found.late_grads) == (2, 1.0 + 5.0, 5.0)


def test_torchtitan_beside_a_pipeline_holds_its_fp32_gradients_from_the_first_backward(tiny):
    from planner.cost.score import stage_cost

    layers = layer_costs(tiny)
    whole = dict(stages=2, microbatches=2, mem_caps_bytes=[2**50] * 2, dp=2, zero=3, zero_gather="per-iteration",
                 schedule="GPipe")
    titan = stage_cost(layers[:2], [0, 0], stage=0, profile=tiny, setup=setup(runtime="torchtitan", **whole))
    grads = 4 * (layers[0].param_count + layers[1].param_count)  # fp32, whole
    # GPipe, 2 in flight: max(2 k, k + G) above what is held without G
    expected = (titan.static_bytes - grads + titan.buffer_bytes
                + max(2 * titan.kept_bytes, titan.kept_bytes + grads) + titan.transient_bytes)
    assert titan.peak_bytes == pytest.approx(max(expected, titan.static_bytes - grads + titan.buffer_bytes
                                                 + titan.step_scratch_bytes), abs=1)


# ---------------------------------------------------------------- torchtitan's op-level SAC


def test_op_sac_keeps_every_second_mm_and_the_attention_by_hand():
    from planner.profiler.opsac import op_sac_kept_bytes

    shape = Shape(seq_len=32, micro_batch_size=2)
    tokens, d = 64, 2
    boundary = tokens * 64 * d
    # input + Q (wq, 4 heads x 16) + V (wv, 2 kv heads x 16) + flash output + logsumexp (fp32 per head and
    # token) + the gate (w1, 160) + the MLP's output (w2, 64)
    expected = boundary + tokens * 64 * d + tokens * 32 * d + tokens * 64 * d + 4 * 4 * tokens + tokens * 160 * d \
        + tokens * 64 * d
    assert op_sac_kept_bytes(TINY, shape, boundary) == expected
    profile = analytic.analytic_profile(TINY, shape, gpu=H100, model=REF)
    block = profile.layers[1]
    option = next(o for o in block.recompute_options if o.name == "op-sac")
    assert option.kept_bytes == expected
    assert option.recompute_peak_bytes == block.act_bytes - expected


def test_op_sac_reruns_three_mms_and_every_memory_bound_op_of_the_forward():
    """torchtitan's policy saves only mm (every other one), SDPA and reduce-scatter outputs: the
    backward reruns wk, wo and w3, each its own kernel, and the forward's norms, rotary, SiLU x mul
    and residual adds, whose bytes are the forward's memory-bound bytes (analytic_time.block_work), each op
    class at its own measured rate (planner/profiler/membound.py)."""
    from planner.profiler import analytic_time
    from planner.profiler.membound import membound_ms
    from planner.profiler.roofline import Kernel, kernel_ms

    shape = Shape(seq_len=32, micro_batch_size=2)
    tokens, h, q, kv, f = 64, 64, 64, 32, 160
    block = analytic.analytic_profile(TINY, shape, gpu=H100, model=REF).layers[1]
    option = next(o for o in block.recompute_options if o.name == "op-sac")
    forward, _, _ = analytic_time.block_work(TINY, shape)
    mms = sum(kernel_ms(Kernel("matmul", 2 * tokens * a * b), H100) for a, b in ((h, kv), (q, h), (h, f)))
    moved = sum(membound_ms(num, H100, "eager", name) for name, num in forward.classed)
    assert option.recompute_ms == pytest.approx(mms + moved)
    assert forward.bytes > 0 and sum(num for _, num in forward.classed) == forward.bytes


def test_op_level_sac_on_the_command_line_keeps_between_none_and_full(tiny_path):
    none = _peak(_evaluate(tiny_path))
    full = _peak(_evaluate(tiny_path, ckpt="4"))
    op = _peak(_evaluate(tiny_path, "--op-level-sac", ckpt="4"))
    assert full < op < none


# ---------------------------------------------------------------- outputs kept to the step's end


# 1F1B: b5bcd76c's stage 0 keeps one of the M - k by its warm-up send (planner/cost/warmupsend.py), 9dec370's among them
@pytest.mark.parametrize("schedule, stage0_kept", [("1F1B", 5 - 2 - 1), ("GPipe", 0)])
def test_torchtitan_9dec370_keeps_every_stage_output_to_the_steps_end(tiny, schedule, stage0_kept, monkeypatch):
    """torch's output_chunks before pytorch#153383: a stage's output of each microbatch past its
    backward stays until the next step (M - k of them at a 1F1B stage's peak, none under GPipe,
    whose M are all in flight); torchtitan since e5ef99aab asks for none (return_outputs=False).
    The two versions' other difference, K/V repeated before attention (9dec370) or not (b5bcd76c's
    enable_gqa), is set aside: tests/test_repeated_kv.py counts it; so is the rotary table 9dec370's record
    holds (tests/test_cp_rotary_table.py counts it), and its final norm's eager fp32 tensors (tests/test_finalnorm.py)."""
    from planner.cost import eager_norm, repeatedkv, terms
    from planner.cost.score import stage_cost

    monkeypatch.setattr(repeatedkv, "repeated_kv_bytes", lambda layer, profile, setup: 0)
    monkeypatch.setattr(eager_norm, "elements", lambda layer, profile, setup: 0)
    monkeypatch.setattr(terms, "rotary_table_bytes", lambda profile, stage, setup: 0)

    layers = layer_costs(tiny)  # embedding, 2 blocks, head (its output: the logits)
    pipe = dict(stages=2, microbatches=5, mem_caps_bytes=[2**50] * 2, schedule=schedule)

    def cost(version, stage):
        mine = layers[:2] if stage == 0 else layers[2:]
        return stage_cost(mine, [0] * len(mine), stage=stage, profile=tiny,
                          setup=setup(runtime="torchtitan", runtime_version=version, **pipe))

    for stage, out, in_flight in ((0, layers[1].output_bytes, stage0_kept), (1, layers[-1].output_bytes, None)):
        old, new = cost("9dec370", stage), cost("b5bcd76c", stage)
        kept = in_flight if stage == 0 else (5 - 1 if schedule == "1F1B" else 0)
        # and torch before pytorch#164329 keeps each input gradient to the next step: at 1F1B's last
        # steady backward stage 1 (1 in flight) holds 4 beside the one it sends (tests/test_held_input_grads.py)
        grads = 4 * layers[2].input_bytes if stage == 1 and schedule == "1F1B" else 0
        # and b5bcd76c's collator adds a positions tensor, the inputs' shape and dtype, to each of the 5 microbatches
        # on every stage (tests/test_batch_positions.py)
        assert old.buffer_bytes - new.buffer_bytes == kept * out + grads - 5 * tiny.batch_input_bytes
        assert old.peak_bytes - new.peak_bytes == kept * out + grads - 5 * tiny.batch_input_bytes
    assert layers[-1].output_bytes == 2 * 32 * 128 * 2  # the logits: micro-batch x seq x vocab x bf16
    # ckplan's own runtime asks torch for no outputs back; Megatron-LM keeps only each reduced loss
    for runtime in ("ckplan", "megatron"):
        assert runtimes.facts(runtime).outputs_held_to_step_end == "none"


def test_a_walked_schedule_holds_the_kept_outputs_from_their_backward_on(tiny):
    from planner.cost import schedules
    from planner.cost.chunked import sends_held_bytes

    layers = layer_costs(tiny)
    order = schedules.pipeline_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=4, num_chunks=2)
    last, middle = order.num_stages - 1, 1
    for version, logits in (("9dec370", layers[-1].output_bytes), ("b5bcd76c", 0)):
        training = setup(runtime="torchtitan", runtime_version=version).training
        # the last stage sends nothing: only output_chunks keeps its logits, and _internal_losses each
        # microbatch's 4 B loss value (lossvalues.walked_value_bytes, framework-facts §703)
        assert sends_held_bytes(layers[3], layers[3], stage=last, order=order, training=training) == \
            (logits + 4, layers[3].input_bytes)
        # a middle stage's output is held by its send either way (torch's runtime for several stages a rank)
        assert sends_held_bytes(layers[1], layers[1], stage=middle, order=order, training=training) == \
            (layers[1].output_bytes, layers[1].input_bytes)


def test_without_a_pipeline_microbatches_are_gradient_accumulation_keeping_no_outputs(tiny):
    from planner.cost.score import stage_cost

    layers = layer_costs(tiny)
    costs = [stage_cost(layers, [0] * len(layers), stage=0, profile=tiny,
                        setup=setup(runtime="torchtitan", runtime_version=v, microbatches=4)) for v in ("bbb1b616", "b5bcd76c")]
    # b5bcd76c's positions beside each microbatch's inputs (tests/test_batch_positions.py), and its loop keeps only
    # the current microbatch's labels as it accumulates (accumulated_batch "inputs", docs/framework-facts.md §745):
    # 4 x 512 B of positions more, 3 x 512 B of labels fewer
    gap = 4 * tiny.batch_input_bytes - 3 * tiny.batch_target_bytes
    assert costs[1].buffer_bytes - costs[0].buffer_bytes == gap == 512
    # bbb1b616 repeats K/V before attention, b5bcd76c passes enable_gqa: each block of the one microbatch in
    # flight keeps K and V at 4 heads, not 2 (2 x 64 tokens x 2 heads x 16 x 2 B; tests/test_repeated_kv.py)
    assert costs[0].peak_bytes - costs[1].peak_bytes == 2 * (2 * 64 * 2 * 16 * 2) - gap


def test_the_whole_block_rerun_skips_the_last_residual_add_on_this_devices_rows():
    """torch's checkpoint reruns the forward but the down projection and the residual add after it;
    under sequence parallelism that add runs on the rank's T/t rows, as the forward counts it."""
    from planner.profiler import analytic_time

    for shape in (Shape(seq_len=32, micro_batch_size=2), Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True)):
        forward, _, rerun = analytic_time.block_work(TINY, shape)
        rows = 64 // (2 if shape.sp else 1)  # 2 x 32 tokens
        assert forward.bytes - rerun.bytes == 6 * rows * 64  # the add: read 2 + 2, write 2 bytes an element
