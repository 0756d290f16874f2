"""Megatron-LM's --test-mode (planner/cost/realtime_tests.py, docs/framework-facts.md §881): each attention forward
with q/k norms all-gathers them over DP and TP and asserts each rank's equal on the host (attention.py
run_realtime_tests at d98e8a64). Hand counts at the DGX H100's published Linear (13.48 µs, TransformerEngine#2053),
NCCL's Ring latency tables (tuning.cc v2.27.7-1), the reader's flag and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner.cost import realtime_tests, runtimes, terms
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

MODEL = FileRef(file="arch:test", sha256="0" * 64)
CALL = 13.48e-3  # ms: one torch Linear forward on the DGX H100's host (TransformerEngine#2053)
NVLINK = {"tp_gb_per_s": 350.0, "tp_step_latency_ms": 3.4e-3, "collective_latency_ms": 8.4e-3}
G14 = Path(__file__).parents[1] / "configs" / "megatron-lm" / \
    "gpt3_mcore_te_tp4_pp1_resume_torch_dist_qk_layernorm_test_mode.yaml"


def _arch(**extra) -> archs.Arch:
    return archs.Arch(name="tiny-gpt", hidden_size=64, intermediate_size=256, num_layers=1, num_heads=4,
                      num_kv_heads=4, vocab_size=128, style="gpt", tie_word_embeddings=True,
                      max_position_embeddings=32, **extra)


def _setup(*, tp=4, dp=2, gpus_per_node=8, test_mode=True, ring_simple=True, runtime="megatron") -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, comm={"tp": tp, "gpus_per_node": gpus_per_node, **NVLINK},
                      data_parallel={"dp": dp}, nccl_ring_simple=ring_simple, test_mode=test_mode)


def _profile(arch, gpu="h100"):
    return analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=1), gpu=archs.gpu(gpu), model=MODEL)


def test_ring_all_gather_latency_by_nccls_tables():
    """Ring / Simple on NVLink: 8.4 + (n-1) x 3.4 µs; across two nodes of one rank each the step is the network's
    14.0; NCCL's pick unforced: LL's 6.6 + (n-1) x 0.6."""
    one_node, two_nodes = _setup(), _setup(gpus_per_node=4)
    assert realtime_tests.all_gather_latency_us(2, 1, one_node) == pytest.approx(11.8)
    assert realtime_tests.all_gather_latency_us(4, 1, one_node) == pytest.approx(18.6)
    assert realtime_tests.all_gather_latency_us(2, 2, two_nodes) == pytest.approx(8.4 + 14.0)
    assert realtime_tests.all_gather_latency_us(4, 1, _setup(ring_simple=False)) == pytest.approx(6.6 + 3 * 0.6)
    assert realtime_tests.all_gather_latency_us(1, 1, one_node) == 0.0


def test_one_forward_check_is_its_host_issue_and_two_gathers_latency():
    """TP 4 x DP 2 on one node: the stack (0.13 Linears), six ranks' entries, unbinds and four asserts each (1.21),
    two all-gathers' issue (0.85 each) at 13.48 µs; the DP gather 11.8 µs and the TP gather 18.6 µs on the device.
    DP over two nodes of 4: its gather crosses the network (22.4 µs)."""
    profile = _profile(_arch(qk_norm=True))
    host = (0.13 + 6 * 1.21 + 2 * 0.85) * CALL
    assert realtime_tests.check_ms(profile, _setup()) == pytest.approx(host + (11.8 + 18.6) * 1e-3)
    assert realtime_tests.check_ms(profile, _setup(gpus_per_node=4)) == pytest.approx(host + (22.4 + 18.6) * 1e-3)


def test_the_term_charges_each_attention_forward_and_a_full_recomputes_rerun():
    profile = _profile(_arch(qk_norm=True))
    _, block, _ = layer_costs(profile)
    check = realtime_tests.check_ms(profile, _setup())
    on, off = terms.Context(profile, _setup()), terms.Context(profile, _setup(test_mode=False))
    assert terms.layer_value("time", block, 0, on) - terms.layer_value("time", block, 0, off) == pytest.approx(check)
    assert realtime_tests.realtime_tests_ms(block, 1, profile, _setup()) == pytest.approx(2 * check)


def test_no_check_without_qk_norms_the_flag_or_a_published_host():
    """run_realtime_tests returns at once without --qk-layernorm; DGX B200's host has no Linear figure (the A100's is carried, §873)."""
    assert realtime_tests.check_ms(_profile(_arch()), _setup()) == 0.0
    assert realtime_tests.check_ms(_profile(_arch(qk_norm=True)), _setup(test_mode=False)) == 0.0
    assert realtime_tests.check_ms(_profile(_arch(qk_norm=True), "b200"), _setup()) == 0.0


def test_another_runtime_refuses_test_mode():
    assert runtimes.refused_settings(_setup(runtime="torchtitan", ring_simple=False).training) == [
        "--test-mode is Megatron-LM's (its attention's realtime q/k norm checks), read for --runtime megatron only; "
        "torchtitan runs no such check: drop it or choose --runtime megatron"]
    assert runtimes.refused_settings(_setup().training) == []


def test_from_megatron_reads_test_mode_as_modelled():
    report = json.loads(run_ok("evaluate", "--from-megatron", G14, "--gpus", 8, "--gpu", "h100", "--json").output)
    said = {s["name"]: s for s in report["settings"]}
    assert said["--test-mode"]["status"] == "modelled"


def test_the_bench_replays_the_check_and_prints_its_parts_against_the_linear(capsys):
    """scripts/bench_host_testmode.py: a rank's share asserts each norm equal (a differing entry fails, as the check
    does), and the table holds the unit, the stack and a rank's share."""
    import torch
    from fixtures.scripts import load_script

    bench = load_script("bench_host_testmode")
    norms = bench._norms()
    inputs = torch.stack(norms)
    assert bench.one_rank(norms, inputs, inputs.clone()) > 0
    with pytest.raises(AssertionError):
        bench.one_rank(norms, inputs, inputs + 1)
    threads = torch.get_num_threads()
    try:
        bench.main(["--repeats", "1", "--calls", "2"])
    finally:
        torch.set_num_threads(threads)
    rows = [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| part")]
    assert rows == ["| torch Linear (the unit)", "| fixed (stack)", "| a rank (empty_like, unbind, 4 asserts)"]
