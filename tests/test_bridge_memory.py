"""The memory settings Megatron-Bridge 25.11's recipes run under Megatron-LM (planner/cost/bridgesettings.py,
te_kept.py; docs/framework-facts.md §46), by hand on tiny cases: bf16 gradients, FP8 primary weights and TE's
weight workspaces, Transformer Engine's Float8 saved inputs, the fused SwiGLU, TE's fused cross-entropy."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import bridgeterms, dataparallel, float8, runtimes, te_kept
from planner.cost.layers import layer_costs
from planner.cost.rules import loss_kept_bytes, stage_constant_transient_bytes
from planner.cost.stepscratch import layer_step_scratch_bytes
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
REF = FileRef(file="arch:test", sha256="0" * 64)


def setup(**fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime="megatron")
    return TrainSetup(**(base | fields))


def profile(gpu: str = "h100", **shape):
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, **shape), gpu=archs.gpu(gpu),
                                     model=REF)


# ---------------------------------------------------------------- bf16 gradients


def test_bf16_gradients_hold_and_reduce_two_bytes_and_the_step_copies_the_shard_to_fp32():
    # bf16 weight 2 + bf16 main_grad 2 + (fp32 master, m, v: 12) / DP 2 = 10 B a parameter (fp32 grads: 12)
    assert dataparallel.bytes_per_param(setup(dp=2, zero=1, grad_reduce_bf16=True)) == 2 + 2 + 12 / 2
    assert dataparallel.bytes_per_param(setup(dp=2, zero=1)) == 2 + 4 + 12 / 2
    assert dataparallel.param_bytes(setup(dp=2, zero=1, grad_reduce_bf16=True)).grads == 2  # the reduce-scatter's
    block = layer_costs(profile())[1]
    # the distributed optimizer's .grad = shard.float(): 4 B a parameter of the rank's half; none with fp32 grads
    assert layer_step_scratch_bytes(block, setup(dp=2, zero=1, grad_reduce_bf16=True), "cuda") == \
        block.param_count * 4 / 2
    assert layer_step_scratch_bytes(block, setup(dp=2, zero=1), "cuda") == 0


# ---------------------------------------------------------------- FP8 weights


@pytest.mark.parametrize("gpu, primary, workspace", [("h100", 2 - 1 - 1, -(1 + 1)), ("b200", 2 - 1, -1)])
def test_fp8_weights_are_one_byte_with_a_transpose_on_hopper_and_te_caches_a_copy_without_them(gpu, primary,
                                                                                                  workspace):
    tiny, count = profile(gpu), 1000
    fp8 = dict(dp=2, zero=1, float8=True)
    # --fp8-param-gather: the bf16 weight (2) less the Float8Tensor's 1 B and, on Hopper, its transpose
    assert bridgeterms.fp8_param_saving_bytes(count, setup(**fp8, fp8_all_gather=True), tiny) == count * primary
    # without it, TE's cached FP8 weight workspace beside the bf16 weight (a negative saving)
    assert bridgeterms.fp8_param_saving_bytes(count, setup(**fp8), tiny) == count * workspace
    # ZeRO 3 is Megatron-FSDP: its shard of them a uint8 buffer, 1 B (planner/cost/megatron_fsdp.py; gathered at 1 B
    # by dataparallel.gathered_bytes); no Float8, nothing
    assert bridgeterms.fp8_param_saving_bytes(count, setup(dp=2, zero=3, float8=True, fp8_all_gather=True),
                                                 tiny) == count * (2 - 1) / 2
    assert bridgeterms.fp8_param_saving_bytes(count, setup(dp=2, zero=1), tiny) == 0


# ---------------------------------------------------------------- what the blocks keep


def test_te_float8_saved_inputs_by_hand():
    # 64 tokens, h 64, q 64, f 160, TP 1: qkv's and fc1's norm outputs at 1 B (-64 x 64 each), proj's FP8 copy
    # beside the bf16 attention output (+64 x 64), fc2's input at 1 B (-64 x 160)
    assert te_kept.te_saved_inputs_delta(profile()) == -2 * 64 * 64 + 64 * 64 - 64 * 160
    # TP 2 with SP: the norm outputs keep their shard's row-wise copy alone, 32 rows at 1 B, on Hopper (no
    # transpose: §303) as on Blackwell; proj +64 x 32, fc2 -64 x 80
    assert te_kept.te_saved_inputs_delta(profile(tp=2, sp=True)) == -2 * 32 * 64 + 64 * 32 - 64 * 80
    assert te_kept.te_saved_inputs_delta(profile("b200", tp=2, sp=True)) == -2 * 32 * 64 + 64 * 32 - 64 * 80


def test_megatrons_fused_swiglu_keeps_no_silu_output_and_te_float8_its_inputs():
    tiny = profile()
    block = tiny.layers[1]
    kept = {option.name: option.kept_bytes for option in block.recompute_options}
    silu = 64 * 160 * 2  # tokens x f x bf16
    bf16 = float8.float8_profile(tiny, setup()).layers[1]
    assert bf16.act_bytes == block.act_bytes - silu
    moved = {option.name: option.kept_bytes for option in bf16.recompute_options}
    assert moved["none"] == kept["none"] - silu and moved["full"] == kept["full"]  # full keeps the input only
    fp8 = float8.float8_profile(tiny, setup(float8=True)).layers[1]
    assert fp8.act_bytes == block.act_bytes - silu + te_kept.te_saved_inputs_delta(tiny)
    # torchtitan's record keeps the eager SwiGLU's tensors
    assert float8.float8_profile(tiny, setup(runtime="torchtitan")).layers[1].act_bytes == block.act_bytes


# ---------------------------------------------------------------- TE's fused cross-entropy


def test_te_cross_entropy_keeps_and_peaks_at_the_logits_alone():
    tiny, last = profile(), 0
    logits = 2 * 32 * 128 * 2
    # Megatron's vocab-parallel loss: kept 2x (all the loss's: the GPT model drops the logits), peak 3x
    assert loss_kept_bytes(tiny, last, setup()) == 2 * logits + 4
    assert stage_constant_transient_bytes(tiny, last, setup()) == logits
    # TE's: the gradient written into the logits: the loss keeps the logits themselves (the stage output none:
    # tests/test_te_cross_entropy.py), nothing more at its peak
    assert loss_kept_bytes(tiny, last, setup(te_cross_entropy=True)) == logits + 4
    assert stage_constant_transient_bytes(tiny, last, setup(te_cross_entropy=True)) == 0


# ---------------------------------------------------------------- refused where not read


def _refused(**training):
    base = dict(runtime="torchtitan", runtime_version=None, compile=False, compile_loss=None, float8=False,
                fp8_all_gather=False, context_parallel=1, cp_comm=None, chunked_cross_entropy=False, mtp_layers=0,
                expert_tp=None)
    return runtimes.refused_settings(SimpleNamespace(**(base | training)))


def test_each_setting_is_refused_in_one_sentence_where_the_record_does_not_read_it():
    assert any("--grad-reduce-in-bf16" in line for line in _refused(grad_reduce_bf16=True))
    assert any("fused cross-entropy" in line for line in _refused(te_cross_entropy=True))
    assert _refused(runtime="megatron", grad_reduce_bf16=True, te_cross_entropy=True, float8=True,
                    fp8_all_gather=True) == []
    assert any("float8 all-gather" in line for line in _refused(runtime="deepspeed", float8=True, fp8_all_gather=True))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "tiny.json"
    path.write_text(profile().model_dump_json())
    return path


def _evaluate(path, *extra):
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                    "--ckpt-per-stage", "0", "--microbatches", "1", "--mem", "80GB",
                                    "--precision", "bf16-mixed", "--dp", "2", "--zero", "1", "--json", *extra])


def test_the_command_line_takes_them_under_megatron_and_refuses_them_elsewhere(tiny_path):
    def static(result) -> int:
        assert result.exit_code == 0, result.output
        found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
        return found["hand"]["stages"][0]["static_bytes"]

    plain = static(_evaluate(tiny_path, "--runtime", "megatron"))
    params = sum(layer.param_count for layer in layer_costs(profile()))
    assert static(_evaluate(tiny_path, "--runtime", "megatron", "--grad-reduce-in-bf16")) == plain - 2 * params
    refused = _evaluate(tiny_path, "--runtime", "torchtitan", "--te-cross-entropy")
    assert refused.exit_code != 0 and "fused cross-entropy" in refused.output and "Traceback" not in refused.output


def test_the_megatron_export_writes_the_flags_the_plan_was_scored_with():
    from planner.emit.megatron import _test_settings

    lines = _test_settings(setup(grad_reduce_bf16=True, te_cross_entropy=True).training)
    assert lines == ["--grad-reduce-in-bf16", "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl te"]
    assert _test_settings(setup().training) == []
