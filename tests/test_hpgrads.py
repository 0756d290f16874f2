"""DeepSpeed as BLOOM 176B ran it (--runtime deepspeed --runtime-version 56c52238, framework-facts §61):
the BF16_Optimizer's fp32 gradients added into after every microbatch's backward (planner/cost/hpgrads.py),
and its PipelineEngine's gradient all-reduce after the last microbatch, counted by hand on a tiny GPT."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fixtures.tiny_gpt2 import tiny_gpt2_profile

from planner import io
from planner.cli import cli
from planner.cost import dataparallel, hpgrads, runtimes
from planner.cost.layers import layer_costs
from planner.schema import TrainSetup

H, F, V, POS = 64, 256, 128, 32  # fixtures.tiny_gpt2's config
# a GPT-2 block: c_attn 3h x h + 3h, c_proj h x h + h, c_fc f x h + f, c_proj h x f + h, two LayerNorms 2 x 2h
BLOCK = 3 * H * H + 3 * H + H * H + H + F * H + F + H * F + H + 2 * 2 * H
BLOOM = ("--runtime", "deepspeed", "--runtime-version", "56c52238")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_gpt2_profile(tmp_path_factory.mktemp("p"), "a100-80g")


def _setup(version=None, *, precision="bf16-mixed", zero=1) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision=precision,
                      runtime="deepspeed", runtime_version=version, dp=8, zero=zero, shard_gb_per_s=10.0)


def test_the_accumulation_moves_18_bytes_a_parameter_at_the_measured_elementwise_rate(tiny_path):
    profile = io.load_profile(tiny_path)
    embedding, block, *_ = layer_costs(profile)
    assert block.param_count == BLOCK
    rate = profile.assumptions["membound_tbps"]["by_class"]["elementwise"] * 1e12  # the A100's measured eager rate
    assert hpgrads.elementwise_tbps(profile) * 1e12 == rate
    bloom = _setup("56c52238")
    # the cast (read 2, write 4) and the add (read 4 + 4, write 4) over every parameter, the embedding's too,
    # less the profile's bf16 .grad += new (read 2 + 2, write 2), which clear_lp_grads leaves autograd no need to run
    assert hpgrads.hp_grad_accumulate_ms(block, profile, bloom) == pytest.approx(BLOCK * (18 - 6) / rate * 1e3)
    assert hpgrads.hp_grad_accumulate_ms(embedding, profile, bloom) == pytest.approx(
        (V * H + POS * H) * (18 - 6) / rate * 1e3)
    assert hpgrads.hp_grad_accumulate_ms(block, profile, _setup()) == 0.0  # the newest DeepSpeed: not read
    assert hpgrads.hp_grad_accumulate_ms(block, profile, _setup("56c52238", precision="bf16")) == 0.0


def test_zero1_all_reduces_the_whole_gradients_after_the_last_microbatch():
    n = 1_000_000
    bloom, newest = _setup("56c52238"), _setup()
    # 2 (n-1)/n of the bf16 gradients (communication_data_type) a rank, where ZeRO 1 reduce-scatters (n-1)/n
    assert dataparallel.grad_reduce_ms(n, bloom) == pytest.approx(2 * 7 / 8 * n * 2 / 10e9 * 1e3)
    assert dataparallel.grad_reduce_ms(n, newest) == pytest.approx(7 / 8 * n * 2 / 10e9 * 1e3)
    assert not runtimes.of(bloom.training).overlaps_grad_reduce
    # not overlapped: every byte of the reduction and of the gather after the step exposed, whatever the backward
    gather = 7 / 8 * n * 2 / 10e9 * 1e3
    assert dataparallel.exposed_comm_ms(n, bloom, bwd_ms=1e9) == pytest.approx(2 * 7 / 8 * n * 2 / 10e9 * 1e3 + gather)
    assert dataparallel.exposed_comm_ms(n, newest, bwd_ms=1e9) == pytest.approx(gather)


def _rank(path, *extra):
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--json", *extra])
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]


def test_evaluate_charges_the_accumulation_once_a_microbatch(tiny_path):
    profile = io.load_profile(tiny_path)
    rate = hpgrads.elementwise_tbps(profile) * 1e12
    newest, bloom = _rank(tiny_path, "--runtime", "deepspeed"), _rank(tiny_path, *BLOOM)
    every = sum(layer.param_count for layer in layer_costs(profile))  # embedding, two blocks, head
    per_microbatch = every * (18 - 6) / rate * 1e3
    assert bloom["stages"][0]["time_ms"] - newest["stages"][0]["time_ms"] == pytest.approx(per_microbatch)
    assert bloom["iteration_ms"] - newest["iteration_ms"] == pytest.approx(3 * per_microbatch)


def test_an_unknown_deepspeed_version_is_refused_in_one_sentence(tiny_path):
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(tiny_path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB", "--runtime", "deepspeed",
                                      "--runtime-version", "0.6.0"])
    assert result.exit_code != 0
    assert "56c52238" in result.output and "Traceback" not in result.output


# ---- memory (framework-facts §69): what BF16_Optimizer holds beside the bf16 weights and gradients

EMBEDDING, HEAD = V * H + POS * H, V * H + 2 * H  # wte + wpe; the final LayerNorm and the untied lm_head
EVERY = EMBEDDING + 2 * BLOCK + HEAD


def test_static_holds_whole_fp32_gradients_beside_the_bf16_ones_under_zero1_over_dp2(tiny_path):
    assert sum(layer.param_count for layer in layer_costs(io.load_profile(tiny_path))) == EVERY
    # bf16 weights 2 + bf16 .grad 2 + fp32 gradients 4 (whole: BF16_Optimizer does not shard them) + the fp32
    # master 4, Adam's m 4 and v 4 sharded over the 2 data-parallel ranks: 14 B a parameter
    bloom = _rank(tiny_path, *BLOOM, "--dp", "2", "--zero", "1")["stages"][0]
    assert bloom["static_bytes"] == EVERY * (2 + 2 + 4 + (4 + 4 + 4) // 2)
    # the newest DeepSpeed's record keeps no second gradient: 10 B
    newest = _rank(tiny_path, "--runtime", "deepspeed", "--dp", "2", "--zero", "1")["stages"][0]
    assert newest["static_bytes"] == EVERY * (2 + 2 + (4 + 4 + 4) // 2)
    # the fp32 gradients stay whole at any data-parallel degree; the master and Adam's states are what DP shards
    dp8 = _rank(tiny_path, *BLOOM, "--dp", "8", "--zero", "1")["stages"][0]
    assert bloom["static_bytes"] - dp8["static_bytes"] == EVERY * 12 * (1 / 2 - 1 / 8)


def test_the_step_holds_a_bf16_copy_of_the_gradients_for_the_all_reduce(tiny_path):
    from planner.cost.stepscratch import layer_step_scratch_bytes

    profile = io.load_profile(tiny_path)
    _, block, *_ = layer_costs(profile)
    # allreduce_bucket's tensor.to(bfloat16) of the flat fp32 group: 2 B a parameter; FusedAdam allocates none
    assert layer_step_scratch_bytes(block, _setup("56c52238"), "cuda") == BLOCK * 2
    assert layer_step_scratch_bytes(block, _setup(), "cuda") == 0
    assert layer_step_scratch_bytes(block, _setup("56c52238", precision="bf16"), "cuda") == 0


def test_the_cast_of_one_parameter_is_the_larger_of_it_and_the_layers_own_scratch(tiny_path):
    import dataclasses

    _, block, *_ = layer_costs(io.load_profile(tiny_path))
    bloom = _setup("56c52238")
    huge = dataclasses.replace(block, largest_param_count=10**6, act_bytes=1000, transient_bytes=500,
                               input_bytes=100)
    # lp.grad.to(float32) of the largest tensor, less what the layer keeps (its activations, or its input when
    # checkpointed) and its own scratch (its transient; checkpointed, the recomputed 1000 - 100 besides):
    # together the larger of the two
    assert hpgrads.cast_extra_bytes(huge, 0, bloom) == 4 * 10**6 - 1000 - 500
    assert hpgrads.cast_extra_bytes(huge, 1, bloom) == 4 * 10**6 - 100 - (500 + 900)
    small = dataclasses.replace(huge, largest_param_count=100)
    assert hpgrads.cast_extra_bytes(small, 0, bloom) == 0
    # an analytic profile names no largest tensor: the layer's whole parameters
    unnamed = dataclasses.replace(huge, largest_param_count=0)
    assert hpgrads.cast_extra_bytes(unnamed, 0, bloom) == max(0, 4 * BLOCK - 1000 - 500)
    assert hpgrads.cast_extra_bytes(huge, 0, _setup()) == 0


def test_the_cast_sets_the_peak_of_a_stage_whose_first_layer_holds_a_large_tensor():
    from planner.cost import costmodel
    from planner.models.synthetic import layer, profile_of
    from planner.schema import StagePlan

    mib = 2**20
    profile = profile_of([layer("embed", "Embedding", fwd_ms=1, act_mib=1, input_mib=1, param_count=2**22,
                                largest_param_count=2**22),
                          layer("block", "Block", fwd_ms=1, act_mib=2, input_mib=1, param_count=2**10)])
    stages = [StagePlan(index=0, layers=["embed", "block"], checkpointed=[])]

    def peak(version):
        setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40],
                           precision="bf16-mixed", runtime="deepspeed", runtime_version=version)
        cost = costmodel.evaluate(stages, profile, setup).stages[0]
        return cost.peak_bytes - cost.static_bytes - cost.buffer_bytes

    # the newest record: the microbatch's kept bytes, the embedding's 1 MiB and the block's 2, and 1 MiB its pipe
    # buffer holds (the stage's output, let go only after update_hp_grads: pipe/engine.py 758-764)
    assert peak(None) == (1 + 2 + 1) * mib
    # 56c52238: after the backward the layers' kept bytes are gone, the buffer is not, and the embedding's
    # 4 Mi-element gradient is cast to fp32 (16 MiB), above the step's bf16 copy of the gradients (on this cpu
    # profile twice the largest layer's: 2 x 2 B x 4 Mi)
    assert peak("56c52238") == 4 * 2**22 + 1 * mib


def test_another_zero_stage_than_the_bf16_optimizer_runs_is_refused_in_one_sentence(tiny_path):
    for zero in ("0", "2"):
        result = CliRunner().invoke(cli, ["evaluate", "--profile", str(tiny_path), "--layers-per-stage", "4",
                                          "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB",
                                          "--precision", "bf16-mixed", *BLOOM, "--dp", "2", "--zero", zero])
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert f"--zero {zero} under --runtime deepspeed" in result.output and "give --zero 1" in result.output
    # one data-parallel rank shards nothing, whatever the stage; the newest record takes the stage given
    assert _rank(tiny_path, *BLOOM)["stages"][0]["static_bytes"] == EVERY * (2 + 2 + 4 + 12)
    assert _rank(tiny_path, "--runtime", "deepspeed", "--dp", "2")["stages"][0]["static_bytes"] == EVERY * (2 + 2 + 12)
