"""Megatron-LM's timers above level 0 (--timing-log-level; planner/cost/hosttime.py timer_sync_ms and host_step_ms,
the record's timer_syncs; docs/framework-facts.md §275-§277): each timer's start and stop calls
torch.cuda.synchronize(), so the host issues nothing ahead across it. Hand counts at the DGX H100's published
Linear (13.48 µs, TransformerEngine#2053), what the A100 functional tests' configs read, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner.cost import hosttime, runtimes, terms
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

MODEL = FileRef(file="arch:test", sha256="0" * 64)
GPT = archs.Arch(name="tiny-gpt", hidden_size=64, intermediate_size=256, num_layers=1, num_heads=4, num_kv_heads=4,
                 vocab_size=128, style="gpt", tie_word_embeddings=True, max_position_embeddings=32)
CALL = 13.48e-3  # ms: one torch Linear forward on the DGX H100's host (TransformerEngine#2053)
A100_TEST = Path(__file__).parents[1] / "configs" / "megatron-lm" / "a100" / \
    "gpt3_mcore_te_tp1_pp1_resume_torch_dist_uniform_full_recompute.yaml"


def _setup(runtime="megatron", level=0, stages=1) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=stages, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime=runtime, timing_log_level=level)


def _layers(gpu="h100"):
    profile = analytic.analytic_profile(GPT, Shape(seq_len=32, micro_batch_size=1), gpu=archs.gpu(gpu), model=MODEL)
    return profile, layer_costs(profile)


def test_megatrons_record_reads_which_timers_sync_at_which_level():
    assert runtimes.of(_setup().training).timer_syncs == (
        ("forward-compute", 2, "microbatch"), ("backward-compute", 2, "microbatch"),
        ("forward-backward", 1, "step"), ("optimizer", 1, "step"))
    assert runtimes.of(_setup("torchtitan").training).timer_syncs == ()


def test_each_timed_region_starts_with_the_device_idle_for_one_call():
    """Level 2: forward-compute and backward-compute on every stage, each microbatch; each begins after a
    synchronize, so the device waits while the host issues the region's first call; level 1 times no region per
    microbatch; the A100's host has no published figure (hosttime.py): nothing."""
    profile, _ = _layers()
    for stages in (1, 2):
        for stage in range(stages):
            ctx = terms.Context(profile, _setup(level=2, stages=stages))
            assert hosttime.timer_sync_ms(stage, profile, ctx.setup) == pytest.approx(2 * CALL)
            assert terms.stage_value("time", stage, ctx) - terms.stage_value(
                "time", stage, terms.Context(profile, _setup(level=0, stages=stages))) == pytest.approx(2 * CALL)
    assert hosttime.timer_sync_ms(0, profile, _setup(level=1)) == 0.0
    assert hosttime.timer_sync_ms(0, profile, _setup(level=0)) == 0.0
    b200, _ = _layers("b200")
    assert hosttime.timer_sync_ms(0, b200, _setup(level=2)) == 0.0


def test_a_timed_region_is_its_passes_max_plus_the_idle_start_not_host_plus_device():
    """Inside the region the host issues and the device runs as before: a host-bound block's passes are the host's
    time at every level (the sync adds its idle start once a region, not the device's time on top)."""
    profile, (_, block, _) = _layers()
    fwd, bwd, _ = hosttime._block_host(block, profile, _setup())
    assert block.fwd_ms < fwd and block.bwd_ms < bwd  # a 64-wide block at 32 tokens: host-bound
    for level in (0, 1, 2):
        assert hosttime.host_bound_ms(block, 0, profile, _setup(level=level)) == pytest.approx(
            fwd - block.fwd_ms + bwd - block.bwd_ms)


def test_a_step_timer_leaves_the_optimizer_no_lead_in_the_last_backward():
    """Level 1: forward-backward stops (after finalize_model_grads) and the optimizer starts with a synchronize
    (schedules.py 545, training.py 1421 at 2795ebde): the step's loops before its first .item() can no longer run
    while the device finishes the last backward; at level 0 a device-bound backward hides them."""
    profile, (_, block, _) = _layers()
    slow = block.__class__(**{**block.__dict__, "bwd_ms": 10.0})  # a backward far longer than its issue: a lead
    tensors = hosttime.param_tensors(slow, profile, _setup())
    before = (0.48 + 0.41) * tensors * CALL  # the record's "step" and "inner_step" per tensor, no count_zeros
    assert hosttime.host_step_ms(slow, profile, _setup(level=0)) == pytest.approx(0.0)
    for level in (1, 2):
        assert hosttime.host_step_ms(slow, profile, _setup(level=level)) == pytest.approx(before)


def test_another_runtime_refuses_a_timing_level():
    assert runtimes.refused_settings(_setup("torchtitan", level=2).training) == [
        "--timing-log-level 2 is Megatron-LM's, read for --runtime megatron only; torchtitan's timers were not read: "
        "drop it or choose --runtime megatron"]
    assert runtimes.refused_settings(_setup(level=2).training) == []


def test_from_megatron_lists_the_a100_tests_level_2_as_modelled():
    result = run_ok("evaluate", "--from-megatron", A100_TEST, "--gpus", 8, "--gpu", "a100-80g", "--json")
    report = json.loads(result.output)
    said = {s["name"]: s for s in report["settings"]} if "settings" in report else None
    assert said is not None and said["--timing-log-level"]["status"] == "modelled"


def test_the_megatron_export_writes_the_level_it_was_scored_with():
    from planner.emit import megatron as emit

    assert "--timing-log-level 2" in emit._test_settings(_setup(level=2).training)
    assert not [line for line in emit._test_settings(_setup().training) if "timing" in line]
