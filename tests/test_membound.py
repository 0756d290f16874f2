"""Memory-bound kernels at their measured rate (planner/profiler/membound.py): the bytes of one of
Liger-Kernel's benchmark ops as ckplan counts them, by hand, and the time charged for them; the
eager/fused split of a pass; GPUs without published kernel data."""

import importlib.util
from pathlib import Path

import pytest
import torch

from planner.models.gpus import GPUS, MEMBOUND_A100, MEMBOUND_H100
from planner.profiler.fake import OpBytes, new_mode
from planner.profiler.membound import achieved_tbps, membound_ms
from planner.profiler.roofline import Work, roofline_ms


def _benchmark_script():
    """scripts/membound_rates.py, whose LlamaRMSNorm is the module Liger-Kernel's benchmark times."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "membound_rates.py"
    spec = importlib.util.spec_from_file_location("membound_rates", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LlamaRMSNorm = _benchmark_script().LlamaRMSNorm


def rms_norm_forward_bytes(rows: int, hidden: int) -> int:
    """By hand, per element of x (bf16 in): to fp32 2+4, pow 4+4, mean reads 4, x * rsqrt 4+4,
    to bf16 4+2, fp32 weight * bf16 2+4 out fp32 = 38; per row: mean's write 4, + eps 4+4, rsqrt 4+4,
    the multiply's read 4 = 24; the weight read once, 4 a column."""
    return 38 * rows * hidden + 24 * rows + 4 * hidden


def test_rms_norm_benchmark_bytes_are_the_fake_profilers_count():
    with new_mode():
        norm = LlamaRMSNorm(4)
        x = torch.randn(2, 4, dtype=torch.bfloat16)
        with OpBytes() as counted:
            norm(x)
    assert counted.bytes == rms_norm_forward_bytes(2, 4) == 368


def test_rms_norm_benchmark_time_at_the_measured_eager_rate():
    """Liger's H100 NVL row at M 2048, H 32768 (1.2193 ms published): 2,550 MB at the H100's eager rate."""
    moved = rms_norm_forward_bytes(2048, 32768)
    assert moved == 2_550_317_056
    h100 = GPUS["h100-sxm"]
    assert achieved_tbps(h100) == pytest.approx(3.35 * MEMBOUND_H100[0])
    assert membound_ms(moved, h100) == pytest.approx(moved / (3.35e12 * MEMBOUND_H100[0]) * 1e3)


def test_a_pass_charges_eager_and_fused_bytes_each_at_its_rate():
    gpu = GPUS["h100-sxm"]
    done = Work(0, 1_000_000, (), 400_000)
    eager_s = 600_000 / (gpu.hbm_tbps * 1e12 * gpu.membound_eager_efficiency)
    fused_s = 400_000 / (gpu.hbm_tbps * 1e12 * gpu.membound_fused_efficiency)
    assert roofline_ms(done, gpu) == pytest.approx((eager_s + fused_s) * 1e3)
    assert (done + done).fused_bytes == 800_000
    assert (done - Work(0, 500_000, (), 0)).fused_bytes == 400_000
    assert (done - Work(0, 900_000, (), 0)).fused_bytes == 100_000  # never more than the bytes left


def test_measured_fractions_are_the_harmonic_means_of_the_sweeps_in_the_docs():
    """docs/gpus.md "Memory-bound kernels": each architecture's sweeps, forward+backward, as fractions of
    their GPU's datasheet bandwidth (scripts/membound_rates.py's summary)."""
    def harmonic(*fractions):
        return len(fractions) / sum(1 / f for f in fractions)

    assert MEMBOUND_H100 == (round(harmonic(0.633, 0.422, 0.464, 0.391, 0.429, 0.633), 3),
                             round(harmonic(0.426, 0.598, 0.400, 0.418), 3))
    assert MEMBOUND_A100 == (round(harmonic(0.733, 0.416, 0.583, 0.426, 0.757, 0.432, 0.589, 0.446), 3),
                             round(harmonic(0.433, 0.536, 0.502, 0.344), 3))


@pytest.mark.parametrize(("name", "nearest", "fractions"), [
    ("b200", "H100", MEMBOUND_H100), ("mi300x", "H100", MEMBOUND_H100), ("h200", "H100", MEMBOUND_H100),
    ("l4", "A100", MEMBOUND_A100)])
def test_a_gpu_without_kernel_data_takes_its_nearest_architectures_fractions_and_says_so(name, nearest, fractions):
    gpu = GPUS[name]
    assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == fractions
    assert "no memory-bound kernel benchmark published" in gpu.membound_source
    assert f"the {nearest}'s fractions assumed" in gpu.membound_source


@pytest.mark.parametrize(("name", "fractions"), [("h100-sxm", MEMBOUND_H100), ("a100-80g", MEMBOUND_A100)])
def test_gpus_with_kernel_data_carry_their_measured_fractions(name, fractions):
    gpu = GPUS[name]
    assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == fractions
    assert gpu.membound_source.startswith("measured on")
