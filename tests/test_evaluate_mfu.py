"""The MFU `evaluate --from-megatron | --from-torchtitan` prints is the one the job's framework logs, as the search
prints it (search_report.mfu_named): Megatron-LM's num_floating_point_operations for a Megatron-LM job (with the
TFLOP/s/GPU its log prints), torchtitan's 6N + 12 l h q s for a torchtitan job (planner/profiler/throughput.py, one
count for both commands). Before, a Megatron-LM job printed torchtitan's count: 85.8% against Megatron-LM's 76.2% on
its shipped FP8 LLaMA 3 8B example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner.models import archs
from planner.models.configs import megatron, torchtitan
from planner.profiler import throughput

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = ROOT / "configs" / "megatron-lm" / "llama3_8b_h100_fp8.sh"
TITAN = ROOT / "tests" / "fixtures" / "configs" / "torchtitan_llama3_8b.toml"


@pytest.mark.parametrize(("option", "path", "whose", "count"), [
    ("--from-megatron", MEGATRON, "Megatron-LM", throughput.megatron_flops_per_token),
    ("--from-torchtitan", TITAN, "torchtitan", throughput.torchtitan_flops_per_token)])
def test_the_mfu_is_the_one_the_jobs_framework_logs(option, path, whose, count):
    extra = ["--gpus", "8"] if option == "--from-torchtitan" else []
    summary = json.loads(run_ok("evaluate", option, path, *extra, "--json").stdout)
    job = megatron.read(path) if option == "--from-megatron" else torchtitan.read(path)
    peak = archs.gpu(summary["gpu"]).bf16_tflops * 1e12
    assert summary["mfu_of"] == whose
    assert summary["mfu"] == pytest.approx(count(job.arch, job.seq_len) * summary["tokens_per_s_per_gpu"] / peak,
                                           rel=1e-12)
    said = " ".join(run_ok("evaluate", option, path, *extra).output.split())
    assert f"MFU {summary['mfu']:.1%} of the dense BF16 peak" in said
    if whose == "Megatron-LM":  # what its log prints beside: throughput per GPU (TFLOP/s/GPU)
        assert f"{summary['mfu'] * peak / 1e12:,.1f} TFLOP/s/GPU as Megatron-LM" in said
