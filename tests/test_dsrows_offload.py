"""DeepSpeed ZeRO 3 with the optimizer offloaded keeps its fp16 gradient partitions in pinned host memory, not on
the GPU (stage3.py 532-545 at v0.6.2: grad_partitions_flat_buffer on `self.device`, the offload device;
framework-facts §124, docs/published-runs.md §29.dsrows): deepspeed_terms.offloaded_grad_partition_bytes and its
two rows in planner/cost/terms.py."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import deepspeed_terms, terms
from planner.cost.layers import layer_costs

H = 1024  # the tiny GPT's width: a block holds 12h^2 + 13h parameters


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsrows")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": H, "n_layer": 4, "n_head": 8,
                                  "vocab_size": 1024, "n_positions": 256,
                                  "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return folder / "p.json"


def _setup(profile_path, *, runtime="deepspeed", zero=3, offload=True):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = io.load_profile(profile_path)
    options = DataParallelOptions(dp=8, zero=zero, offload_optimizer=offload)
    return profile, build_setup(profile, stages=1, mem="80GB", microbatches=1, schedule="1F1B", optimizer="adam",
                                precision="bf16-mixed", parallel_stages=None, runtime=runtime,
                                data_parallel=options)


def _block(profile):
    return next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")


def test_the_offloaded_gradient_partitions_by_hand(gpt_profile):
    profile, setup = _setup(gpt_profile)
    block = _block(profile)
    assert block.param_count == 12 * H * H + 13 * H
    # the rank's 1/8 of the block's gradients, 2 B each (bf16-mixed under DeepSpeed: gradients in the weights' dtype)
    assert deepspeed_terms.offloaded_grad_partition_bytes(block, setup) == pytest.approx(block.param_count * 2 / 8)


@pytest.mark.parametrize("runtime, zero, offload", [("deepspeed", 3, False), ("torchtitan", 3, True),
                                                    ("deepspeed", 2, True)])
def test_nothing_moves_without_offload_under_another_runtime_or_another_stage(gpt_profile, runtime, zero, offload):
    profile, setup = _setup(gpt_profile, runtime=runtime, zero=zero, offload=offload)
    assert deepspeed_terms.offloaded_grad_partition_bytes(_block(profile), setup) == 0.0


def test_the_rows_move_the_partitions_from_the_device_to_the_host(gpt_profile):
    """The layer's device static bytes with the term: 2 B of weights a partitioned parameter, 2 B of gradients
    gone to the host, no optimizer state (offloaded): 2/8 B a parameter; its host bytes: fp32 master, moments,
    fp32 gradient (16 B) and the fp16 gradient partition (2 B), an 8th of each."""
    profile, setup = _setup(gpt_profile)
    block = _block(profile)
    ctx = terms.Context(profile, setup)
    assert terms.layer_value("static", block, 1, ctx) == pytest.approx(block.param_count * 2 / 8)
    assert terms.layer_value("host", block, 1, ctx) == pytest.approx(block.param_count * (16 + 2) / 8)
    kept, kept_setup = _setup(gpt_profile, offload=False)  # not offloaded: weights, gradients, master and moments
    assert terms.layer_value("static", _block(kept), 1, terms.Context(kept, kept_setup)) == pytest.approx(
        block.param_count * 16 / 8)


def test_evaluate_charges_the_rank_two_bytes_less_a_partitioned_parameter(gpt_profile):
    args = ("evaluate", "--profile", gpt_profile, "--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8,
            "--zero", 3, "--microbatches", 1, "--precision", "bf16-mixed", "--runtime", "deepspeed", "--json")
    kept = json.loads(run_ok(*args).stdout)["hand"]["stages"][0]
    offloaded = json.loads(run_ok(*args, "--offload-optimizer").stdout)["hand"]["stages"][0]
    profile = io.load_profile(gpt_profile)
    copies = sum((len(item.layers) - 1) * item.param_count for item in profile.tied)
    assert copies == 1024 * H  # the LM head tied to the token embedding: held once
    params = sum(layer.param_count for layer in layer_costs(profile)) - copies
    # kept: 2 + 2 + 12 B a parameter, an 8th each; offloaded: the 12 B of state and the 2 B of gradients gone
    assert kept["static_bytes"] - offloaded["static_bytes"] == pytest.approx(params * 14 / 8, rel=1e-6)
    # the stage's rows: the tied copy's partition given back to the device, taken off the host
    setup_profile, setup = _setup(gpt_profile)
    ctx = terms.Context(setup_profile, setup)
    assert terms.stage_value("static", 0, ctx) - terms.stage_value("static", 0, terms.Context(
        *_setup(gpt_profile, offload=False))) == pytest.approx(-copies * (2 / 8 - 16 / 8))
    assert deepspeed_terms.tied_offloaded_grad_partition_bytes(setup_profile, setup) == pytest.approx(copies * 2 / 8)


def test_the_gradient_bucket_by_hand_at_deepspeeds_default_and_as_given(gpt_profile):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = io.load_profile(gpt_profile)

    def bucket(runtime="deepspeed", zero=3, **knobs):
        options = DataParallelOptions(dp=8, zero=zero, deepspeed=knobs)
        setup = build_setup(profile, stages=1, mem="80GB", microbatches=1, schedule="1F1B", optimizer="adam",
                            precision="bf16-mixed", parallel_stages=None, runtime=runtime, data_parallel=options)
        return deepspeed_terms.gradient_bucket_bytes(setup), terms.stage_value("buffers", 0, terms.Context(profile,
                                                                                                          setup))

    default, default_buffers = bucket()
    assert default == 500_000_000 * 2  # DeepSpeed's reduce_bucket_size, 2 B elements
    given, given_buffers = bucket(reduce_bucket_size=90_000_000)  # the Azure recipes' 9e7
    assert given == 180_000_000 and default_buffers - given_buffers == pytest.approx(default - given)
    assert bucket(runtime="torchtitan")[0] == 0.0 and bucket(zero=2)[0] == 0.0


def test_the_bucket_option_needs_deepspeeds_zero_3_not_the_blocks_submodules(gpt_profile, tmp_path):
    from fixtures.cli import run

    args = ("evaluate", "--profile", gpt_profile, "--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8,
            "--microbatches", 1, "--precision", "bf16-mixed", "--json")
    refused = run(*args, "--zero", 3, "--runtime", "torchtitan", "--reduce-bucket-size", "9e7")
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "--reduce-bucket-size is DeepSpeed's ZeRO 3 setting" in refused.output
    small = json.loads(run_ok(*args, "--zero", 3, "--runtime", "deepspeed", "--reduce-bucket-size", "9e7").stdout)
    large = json.loads(run_ok(*args, "--zero", 3, "--runtime", "deepspeed").stdout)
    assert large["hand"]["stages"][0]["peak_bytes"] - small["hand"]["stages"][0]["peak_bytes"] == \
        (500_000_000 - 90_000_000) * 2


def test_the_export_writes_the_bucket_given():
    from planner.emit.deepspeed import _zero_block
    from planner.schema import TrainSetup

    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[1 << 30],
                       dp=8, zero=3, runtime="deepspeed", reduce_bucket_size=90_000_000)
    assert _zero_block(setup) == ', "zero_optimization": {"stage": 3, "reduce_bucket_size": 90000000}'
