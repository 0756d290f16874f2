"""DeepSpeed's activation checkpointing options (framework-facts §133, docs/published-runs.md §29.dsckpt):
cpu_checkpointing moves a whole-layer checkpoint's input to the host and copies it out and back on the compute
stream (checkpointing.py v0.6.2); partitioning at tensor parallelism 1 splits nothing; the options are refused
under another runtime, read from a Megatron-DeepSpeed script's flags and written by the DeepSpeed export."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import deepspeed_ckpt, terms
from planner.cost.layers import layer_costs

H, SEQ, MBS = 1024, 256, 2  # the tiny GPT: a block's input is SEQ x MBS x H in bf16


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsckpt")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": H, "n_layer": 4, "n_head": 8,
                                  "vocab_size": 1024, "n_positions": SEQ,
                                  "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", SEQ, "--micro-batch-size", MBS, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return folder / "p.json"


def _setup(profile_path, *, runtime="deepspeed", dp=8, **deepspeed):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = io.load_profile(profile_path)
    options = DataParallelOptions(dp=dp, zero=3, deepspeed=deepspeed)
    return profile, build_setup(profile, stages=1, mem="80GB", microbatches=1, schedule="1F1B", optimizer="adam",
                                precision="bf16-mixed", parallel_stages=None, runtime=runtime,
                                data_parallel=options)


def _block_full(profile):
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    return block, next(i for i, option in enumerate(block.options) if option.name == "full")


def test_the_checkpoint_goes_to_the_host_by_hand(gpt_profile):
    profile, setup = _setup(gpt_profile, checkpoint_in_cpu=True)
    block, full = _block_full(profile)
    assert block.options[full].kept_bytes == SEQ * MBS * H * 2  # the block's input, bf16
    assert deepspeed_ckpt.host_checkpoint_bytes(block, full, setup) == SEQ * MBS * H * 2
    assert deepspeed_ckpt.host_checkpoint_bytes(block, 0, setup) == 0  # not checkpointed: nothing copied
    # out in the forward and back before the rerun, each at the A100 record's host link: 25.9 GB/s, bandwidthTest's
    # pinned rate on NDm A100 v4 (SuperBench v0.4, framework-facts §575), which the 8 ranks of a node copying at once
    # share two a switch's uplink (Azure's ndv4-topo.xml, §175): 12.95 GB/s
    assert setup.data_parallel.host_gb_per_s == 12.95
    assert deepspeed_ckpt.copies_ms(block, full, setup) == pytest.approx(2 * SEQ * MBS * H * 2 / 12.95e9 * 1e3)


def test_the_rows_move_kept_bytes_to_the_host_and_back_for_the_backward(gpt_profile):
    profile, setup = _setup(gpt_profile, checkpoint_in_cpu=True)
    plain_profile, plain = _setup(gpt_profile)
    block, full = _block_full(profile)
    moved = SEQ * MBS * H * 2
    ctx, plain_ctx = terms.Context(profile, setup), terms.Context(plain_profile, plain)
    assert terms.layer_value("kept", block, full, plain_ctx) - terms.layer_value("kept", block, full, ctx) == moved
    assert terms.layer_value("offloaded", block, full, ctx) - terms.layer_value("offloaded", block, full,
                                                                               plain_ctx) == moved
    assert terms.layer_value("extra", block, full, ctx) - terms.layer_value("extra", block, full, plain_ctx) == moved
    # out to pageable memory at the A100 server's 10.8 GB/s and back at 10.0 (DGX A100's bandwidthTest --memory=pageable,
    # §578), both below the 12.95 GB/s a GPU of the shared uplink has
    assert terms.layer_value("time", block, full, ctx) - terms.layer_value("time", block, full, plain_ctx) == \
        pytest.approx((moved / 10.8e9 + moved / 10.0e9) * 1e3)


def test_the_copies_run_no_faster_than_pageable_memory_each_way(gpt_profile):
    profile, setup = _setup(gpt_profile, checkpoint_in_cpu=True)
    block, full = _block_full(profile)
    moved = SEQ * MBS * H * 2
    assert deepspeed_ckpt.pageable_rates(profile) == (10.0, 10.8)  # (h2d, d2h): the A100 record's server
    assert deepspeed_ckpt.copies_ms(block, full, setup, profile) == pytest.approx((moved / 10.8e9 + moved / 10.0e9) * 1e3)
    # a host link slower than the pageable rates sets both ways; one between them sets the faster direction only
    slow = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(update={"host_gb_per_s": 5.0})})
    assert deepspeed_ckpt.copies_ms(block, full, slow, profile) == pytest.approx(2 * moved / 5.0e9 * 1e3)
    mid = setup.model_copy(update={"data_parallel": setup.data_parallel.model_copy(update={"host_gb_per_s": 10.4})})
    assert deepspeed_ckpt.copies_ms(block, full, mid, profile) == pytest.approx((moved / 10.4e9 + moved / 10.0e9) * 1e3)
    # no profile (or a GPU with no pageable figure read): the host link's rate both ways
    assert deepspeed_ckpt.pageable_rates(None) == (0.0, 0.0)
    assert deepspeed_ckpt.copies_ms(block, full, setup) == pytest.approx(2 * moved / 12.95e9 * 1e3)


@pytest.mark.parametrize("given", [{}, {"partition_activations": True}, {"synchronize_each_layer": True},
                                   {"partition_activations": True, "contiguous_checkpointing": True}])
def test_without_cpu_checkpointing_nothing_moves(gpt_profile, given):
    """Partitioning at tensor parallelism 1 splits nothing (mp_size 1); synchronize drains the host's queue only."""
    profile, setup = _setup(gpt_profile, **given)
    block, full = _block_full(profile)
    assert deepspeed_ckpt.host_checkpoint_bytes(block, full, setup) == 0
    assert deepspeed_ckpt.copies_ms(block, full, setup) == 0.0


def test_evaluate_keeps_the_checkpoints_off_the_gpu_and_charges_the_copies(gpt_profile):
    args = ("evaluate", "--profile", gpt_profile, "--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8,
            "--zero", 3, "--microbatches", 1, "--precision", "bf16-mixed", "--runtime", "deepspeed", "--json")
    kept = json.loads(run_ok(*args).stdout)["hand"]["stages"][0]
    result = run_ok(*args, "--checkpoint-in-cpu")
    host = json.loads(result.stdout)["hand"]["stages"][0]
    blocks = [name for name, option in host["recompute"].items() if option == "full" and name.startswith("layers.")]
    assert len(blocks) == 3  # the embedding's input is token ids: not floating point, not copied
    moved = SEQ * MBS * H * 2  # out at the A100 server's pageable 10.8 GB/s, back at 10.0 (§578)
    assert host["time_ms"] - kept["time_ms"] == pytest.approx(3 * (moved / 10.8e9 + moved / 10.0e9) * 1e3, rel=1e-9)
    assert kept["peak_bytes"] > host["peak_bytes"]
    assert "DeepSpeed's activation checkpointing: --checkpoint-in-cpu" in result.output


def test_refused_under_another_runtime_and_contiguous_alone(gpt_profile):
    args = ("evaluate", "--profile", gpt_profile, "--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8,
            "--zero", 3, "--microbatches", 1, "--precision", "bf16-mixed", "--json")
    other = run(*args, "--runtime", "torchtitan", "--checkpoint-in-cpu")
    assert other.exit_code != 0 and "Traceback" not in other.output
    assert "--checkpoint-in-cpu is DeepSpeed's activation-checkpointing setting" in other.output
    alone = run(*args, "--runtime", "deepspeed", "--contiguous-checkpointing")
    assert alone.exit_code != 0 and "Traceback" not in alone.output
    assert "--contiguous-checkpointing needs --partition-activations" in alone.output


def test_the_export_writes_the_block_and_configures_deepspeeds_checkpointing():
    from planner.emit.deepspeed import _checkpointing_block, _configure_line
    from planner.schema import TrainSetup

    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[1 << 30],
                       dp=8, zero=3, runtime="deepspeed", checkpoint_in_cpu=True, partition_activations=True,
                       contiguous_checkpointing=True)
    assert _checkpointing_block(setup, 5) == (', "activation_checkpointing": {"partition_activations": True, '
                                              '"cpu_checkpointing": True, "contiguous_memory_optimization": True, '
                                              '"number_checkpoints": 5}')
    assert "deepspeed.checkpointing.configure(None, deepspeed_config=CKPLAN_DS_CONFIG)" in _configure_line(setup)
    plain = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[1 << 30],
                       dp=8, zero=3, runtime="deepspeed")
    assert _checkpointing_block(plain, 5) == "" and _configure_line(plain) == ""
