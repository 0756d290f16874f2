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
