"""scripts/moe_block_terms.py's fused parts: E4's block on Megatron's fused kernels split part by part, the parts adding up
to the record ckplan charges (te_fused.te_time), the experts' GEMMs by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures.scripts import load_script

from planner.profiler import analytic_time, te_fused

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
terms_mod = load_script("moe_block_terms")
import moe_job  # noqa: E402

E4 = "configs/megatron-bridge/h100_gptoss_120b_bf16.yaml"


@pytest.fixture(scope="module")
def e4():
    job, gpu, shape = moe_job.read([E4, "h100"], "test")
    return job.arch, shape, gpu, analytic_time.block_work(job.arch, shape, moe=True)


def test_the_parts_add_up_to_the_record(e4):
    arch, shape, gpu, passes = e4
    timed = te_fused.te_time(arch, shape, gpu, passes, moe=True)
    fwd, bwd = terms_mod.fused_parts(arch, shape, gpu, passes)
    assert sum(ms for _, ms in fwd) == pytest.approx(timed.fwd_ms, rel=1e-12)
    assert sum(ms for _, ms in bwd) == pytest.approx(timed.bwd_ms, rel=1e-12)


def test_the_experts_gemms_by_hand(e4):
    arch, shape, gpu, passes = e4
    fwd, bwd = terms_mod.fused_parts(arch, shape, gpu, passes)
    # 4,096 tokens x top 4 x 8 EP ranks over 128 experts: 1,024 rows an expert, 16 local experts; fc1 is gate and up
    # as one GEMM of width 2 x 2,880, fc2 2,880 -> 2,880: forward one each, backward dgrad and wgrad
    rows, h, f, local = 4096 * 4 * 8 // 128, 2880, 2880, 128 // 8
    assert rows == 1024 and shape.tokens == 4096 and arch.num_experts == 128
    fc1, fc2 = f"{2 * rows * h * 2 * f:.3g}", f"{2 * rows * f * h:.3g}"
    names = [name for name, _ in fwd]
    assert f"matmul {fc1} FLOPs x {local}" in names and f"matmul {fc2} FLOPs x {local}" in names
    names = [name for name, _ in bwd]
    assert f"matmul {fc1} FLOPs x {2 * local}" in names and f"matmul {fc2} FLOPs x {2 * local}" in names
