"""Megatron-LM's GPT test model (tests/functional_tests/test_cases/gpt/gpt3_7b_*_memory_speed): a GPT
block with grouped-query attention as an arch config, and what a Megatron rank holds after the
optimizer step (planner/cost/afterstep.py), by hand on tiny cases."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.models import archs
from planner.models.archconfig import from_hf_config
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.profiler.analytic_kept import gpt_block_terms
from planner.profiler.formulas import block_params, embedding_params, head_params
from planner.schema import FileRef

MIB = 1 << 20
# the test's model_config.yaml: 32 layers, h 4096, 32 heads in 8 query groups, 4h GeLU MLP (no
# --swiglu), learned positions of 8192, untied; vocab 131,073 padded by Megatron to a multiple of
# 128 x TP: 131,200 at TP 1, 131,584 at TP 4
MEGATRON_7B = {"model_type": "gpt2", "n_embd": 4096, "n_layer": 32, "n_head": 32, "num_key_value_heads": 8,
               "n_inner": 16384, "vocab_size": 131200, "n_positions": 8192, "tie_word_embeddings": False}


def test_the_gqa_gelu_config_counts_the_7b_tests_parameters_by_hand():
    arch = from_hf_config(MEGATRON_7B, where="c.json", name="megatron-7b")
    one = Shape(seq_len=8192, micro_batch_size=1)
    h, q, kv, f = 4096, 4096, 1024, 16384
    block = h * (q + 2 * kv) + (q + 2 * kv) + q * h + h + 2 * h * f + f + h + 2 * 2 * h  # matrices, biases, 2 LN
    assert block_params(arch, one) == block == 176_207_872
    assert head_params(arch, one) == 2 * h + 131_200 * h == 537_403_392
    assert embedding_params(arch, one) == (131_200 + 8192) * h == 570_949_632
    # M1's last rank (TP 1, PP 4, 8 virtual stages of one layer): layers 3, 7, ..., 31, the final
    # LayerNorm and the output layer
    assert 8 * block + head_params(arch, one) == 1_947_066_368
    # M4 (TP 4): the matrices and column-parallel biases / 4, LayerNorms and row-parallel biases whole,
    # the vocabulary padded to 131,584 and split / 4, the positions whole
    tp4 = from_hf_config(MEGATRON_7B | {"vocab_size": 131_584}, where="c.json", name="megatron-7b")
    four = Shape(seq_len=8192, micro_batch_size=2, tp=4)
    rank = 32 * block_params(tp4, four) + embedding_params(tp4, four) + head_params(tp4, four)
    assert block_params(tp4, four) == 44_070_400 and rank == 1_713_299_456


def test_a_gpt_block_keeps_k_and_v_at_the_groups_width():
    arch = from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4, "num_key_value_heads": 2,
                           "vocab_size": 128, "n_positions": 16}, where="c.json", name="t")
    terms = {t.what: t.num_bytes for t in gpt_block_terms(arch, Shape(seq_len=8, micro_batch_size=2))}
    tokens = 8 * 2
    assert terms["Q"] == tokens * 64 * 2  # 4 heads x 16, bf16
    assert terms["K (K/V heads only)"] == terms["V (K/V heads only)"] == tokens * 32 * 2  # 2 groups x 16


TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "num_key_value_heads": 2,
        "vocab_size": 128, "n_positions": 32, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    arch = from_hf_config(TINY, where="tiny.json", name="tiny-gpt-gqa")
    profile = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    path = tmp_path_factory.mktemp("p") / "tiny.json"
    path.write_text(profile.model_dump_json())
    return path


def _ranks(path, *extra) -> list[dict]:
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "1,1,1,1",
                                      "--ckpt-per-stage", "0,0,0,0", "--schedule", "interleaved-1F1B", "--chunks", "2",
                                      "--microbatches", "2", "--mem", "80GB", "--precision", "bf16-mixed", "--json",
                                      *extra])
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]["stages"]


def test_a_megatron_rank_holds_its_chunks_last_inputs_and_grads_and_the_workspaces_after_the_step(tiny_path):
    ranks = _ranks(tiny_path, "--runtime", "megatron")
    h, params = 64, {"embedding": (128 + 32) * 64, "block": 64 * 128 + 128 + 64 * 64 + 64 + 2 * 64 * 256 + 256 + 64
                                                            + 4 * 64, "head": 2 * 64 + 128 * 64}
    # static: bf16 weight (2) + fp32 main_grad (4) + fp32 master, m, v (12) over DP 1 = 18 B a parameter;
    # rank 0 holds stages 0 (the embedding) and 2 (block 1), rank 1 stages 1 (block 0) and 3 (the head)
    assert ranks[0]["static_bytes"] == 18 * (params["embedding"] + params["block"])
    assert ranks[1]["static_bytes"] == 18 * (params["block"] + params["head"])
    stage_input = 2 * 32 * h * 2  # a microbatch's hidden states, bf16
    workspaces = 2 * 32 * MIB + 32 * MIB + 1024  # CUBLAS_WORKSPACE_CONFIG :4096:8 twice (two threads), TE's on an H100
    # each chunk past the pipeline's first keeps its last input and that input's gradient
    assert ranks[0]["after_step_bytes"] - ranks[0]["static_bytes"] == 1 * 2 * stage_input + workspaces
    assert ranks[1]["after_step_bytes"] - ranks[1]["static_bytes"] == 2 * 2 * stage_input + workspaces


def test_other_runtimes_hold_only_static_after_the_step(tiny_path):
    for rank in _ranks(tiny_path, "--runtime", "torchtitan"):
        assert rank["after_step_bytes"] == rank["static_bytes"]


# tests/functional_tests/test_cases/gpt/gpt3_7b_tp1_pp4_memory_speed/model_config.yaml, Megatron-LM 6e091e1b
# (its logging, checkpoint and data paths left out)
TEST_YAML = """\
ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
  NVTE_ALLOW_NONDETERMINISTIC_ALGO: 0
  NCCL_ALGO: Ring
  CUBLAS_WORKSPACE_CONFIG: :4096:8
  NVTE_FWD_LAYERNORM_SM_MARGIN: 16
  NVTE_BWD_LAYERNORM_SM_MARGIN: 16
MODEL_ARGS:
  --num-layers: 32
  --hidden-size: 4096
  --num-attention-heads: 32
  --group-query-attention: true
  --num-query-groups: 8
  --untie-embeddings-and-output-weights: true
  --micro-batch-size: 1
  --global-batch-size: 8
  --seq-length: 8192
  --max-position-embeddings: 8192
  --tokenizer-type: NullTokenizer
  --vocab-size: 131073
  --transformer-impl: transformer_engine
  --tensor-model-parallel-size: 1
  --pipeline-model-parallel-size: 4
  --num-layers-per-virtual-pipeline-stage: 1
  --use-distributed-optimizer: true
  --overlap-grad-reduce: true
  --overlap-param-gather: true
  --deterministic-mode: true
  --no-gradient-accumulation-fusion: true
  --bf16: true
TEST_TYPE: regular
METRICS:
  - "mem-allocated-bytes"
"""


def test_the_tests_yaml_reads_directly_and_pins_its_last_ranks_prediction(tmp_path):
    path = tmp_path / "model_config.yaml"
    path.write_text(TEST_YAML)
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(path), "--gpus", "8", "--gpu", "h100",
                                      "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output[result.output.index("{"):])
    assert (found["tp"], found["pp"], found["virtual_stages"], found["dp"], found["microbatches"]) == (1, 4, 8, 2, 4)
    last = found["ranks"][3]
    assert last["static_bytes"] == 12 * 1_947_066_368  # 2 + 4 + 12 / DP 2 B a parameter
    # + 8 chunks' last input and its gradient (8192 x 4096 bf16 each) + torch's two and TE's cuBLAS workspaces
    assert last["after_step_bytes"] == 12 * 1_947_066_368 + 8 * 2 * 8192 * 4096 * 2 + 96 * MIB + 1024
    # with the cuBLAS workspaces (96 MiB + 1,024 B: torch's two since newrows): the golden values' 60,720,852,992: 1.009
    assert last["peak_bytes"] == 61_154_361_348 + 96 * MIB + 1024
    # rank 0 holds the learned positions (8192 x 4096) beside the word embedding
    assert found["ranks"][0]["static_bytes"] == 12 * (8 * 176_207_872 + (131_200 + 8192) * 4096)
    settings = {s["name"]: s["status"] for s in found["settings"]}
    assert settings["ENV_VARS.CUBLAS_WORKSPACE_CONFIG"] == "modelled"
    assert settings["ENV_VARS.NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "not modelled"
    # planner/cost/jobsettings.py (deterministic mode: torch's NaN fill; its attention backward not charged)
    assert settings["--no-gradient-accumulation-fusion"] == settings["--deterministic-mode"] == "modelled"
    assert settings["TEST_TYPE"] == settings["METRICS"] == "no effect"
    assert settings["--max-position-embeddings"] == settings["--transformer-impl"] == "modelled"


def test_calibrate_from_log_sets_megatrons_static_line_against_what_the_rank_holds_after_the_step(tmp_path):
    config = tmp_path / "model_config.yaml"
    config.write_text(TEST_YAML)
    log = tmp_path / "train.log"  # made by hand in Megatron-LM's format; the last rank's golden values, in MiB
    log.write_text(
        " [2026-05-30 10:00:01.000000] iteration        2/      25 | consumed samples:           16 | elapsed time per "
        "iteration (ms): 1150.0 | learning rate: 1.000000E-05 | global batch size:     8 | lm loss: 1.258E+01 |\n"
        "[Rank 7] (after 2 iterations) memory (MB) | allocated: 23659.70 | max allocated: 57908.00 | reserved: "
        "60000.00 | max reserved: 66000.00\n")
    result = CliRunner().invoke(cli, ["calibrate", "--from-log", str(log), "--from-megatron", str(config), "--gpus", "8",
                                      "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{"):])
    static = next(r for r in report["residuals"] if r["term"] == "static" and r["rank"] == 3)
    assert static["predicted"] == 12 * 1_947_066_368 + 8 * 2 * 8192 * 4096 * 2 + 96 * MIB + 1024
    assert static["logged"] == round(23659.70 * MIB)


@pytest.mark.parametrize("name, te_bytes", [("h100-sxm (analytic)", 32 * MIB + 1024), ("NVIDIA H100 80GB HBM3", 32 * MIB + 1024),
                                            ("gb200", 32 * MIB + 1024), ("a100-80g", 4 * MIB), ("l4", 4 * MIB)])
def test_transformer_engines_workspace_follows_the_compute_capability(name, te_bytes):
    from planner.cost import afterstep, runtimes
    from planner.schema import DeviceInfo

    record = runtimes.facts("megatron")
    assert afterstep.workspace_bytes(record, DeviceInfo(type="cuda", name=name)) == 2 * 32 * MIB + te_bytes
    assert afterstep.workspace_bytes(record, DeviceInfo(type="cpu", name="cpu")) == 0
    assert afterstep.workspace_bytes(runtimes.facts("torchtitan"), DeviceInfo(type="cuda", name=name)) == 0


def test_megatrons_step_reads_its_gradients_for_the_nan_check_and_the_clipping_norm_and_copies_its_shard(tiny_path):
    from planner import io
    from planner.cost.layers import layer_costs
    from planner.cost.rules import step_checks_ms
    from planner.schema import TrainSetup

    profile = io.load_profile(tiny_path)
    block = layer_costs(profile)[1]

    def setup(runtime):
        return TrainSetup(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**40], precision="bf16-mixed",
                          runtime=runtime, dp=2, zero=1)

    hbm = 3.35e12  # the H100's, as the profile records it
    # the NaN check reads every bucket's fp32 gradients (4 B) and the step's start zeroes them (4 B written);
    # the clipping norm reads the shard's (4 B) and the
    # copy of the fp32 main shard into the bf16 parameter buffer reads 4 and writes 2: (4 + 2 + 4) / DP 2
    assert step_checks_ms(block, profile, setup("megatron")) == pytest.approx(block.param_count * (4 + 4 + 10 / 2) / hbm * 1e3)
    # torchtitan's gradient clipping reads the shard's fp32 gradients for the norm (4) and scales them (8)
    assert step_checks_ms(block, profile, setup("torchtitan")) == pytest.approx(block.param_count * 12 / 2 / hbm * 1e3)
