"""Transformer Engine's userbuffers under Megatron-LM's --tp-comm-overlap (planner/cost/te_userbuffers.py,
framework-facts §158): the overlapped GEMMs' cuBLAS workspace, 3 x TE's in one torch allocation beside the plain
one, held from the first forward to the end, so in the allocated bytes after the step and at the peak; the
communication buffers themselves outside torch's allocator, charged nothing. Hand counts on tiny cases."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.cli import run_ok

from planner.cost import afterstep, runtimes, te_userbuffers
from planner.schema import CommSetup, DeviceInfo, TrainingSetup

MIB = 1 << 20
H100 = DeviceInfo(type="cuda", name="NVIDIA H100 80GB HBM3")
A100 = DeviceInfo(type="cuda", name="NVIDIA A100-SXM4-80GB")
MEGATRON = TrainingSetup(runtime="megatron", precision="bf16-mixed")
LOCAL = TrainingSetup(runtime="megatron", precision="bf16-mixed", local_layers=True)
UB = CommSetup(tp=2, tp_overlap="tp-comm-overlap")
TE_H100 = 32 * MIB + 1024  # get_cublas_workspace_size_bytes on compute capability 9+
MODEL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --tensor-model-parallel-size 2 "
         "--sequence-parallel")


def test_the_overlapped_gemms_workspace_is_three_of_tes_beside_the_plain_one():
    record = runtimes.of(MEGATRON)
    assert record.te_ub_workspaces == 3 and "4220403e" in record.sources["te_ub_workspaces"]
    assert afterstep.te_workspaces(record, H100, MEGATRON, UB) == (TE_H100, 3 * TE_H100)
    assert afterstep.te_workspaces(record, A100, MEGATRON, UB) == (4 * MIB, 12 * MIB)
    # torch's two (CUBLAS_WORKSPACE_CONFIG :4096:8 each), TE's plain one and the overlapped GEMMs' 100,666,368 B
    assert afterstep.workspace_bytes(record, H100, MEGATRON, UB) == 2 * 32 * MIB + TE_H100 + 100_666_368


def test_no_userbuffers_workspace_without_the_overlap_at_tp_1_or_without_te():
    record = runtimes.of(MEGATRON)
    assert afterstep.te_workspaces(record, H100, MEGATRON, CommSetup(tp=2)) == (TE_H100,)
    assert afterstep.te_workspaces(record, H100, MEGATRON, CommSetup(tp=1, tp_overlap="tp-comm-overlap")) \
        == (TE_H100,)
    assert afterstep.te_workspaces(record, H100, MEGATRON) == (TE_H100,)  # no comm part given: none
    assert afterstep.te_workspaces(record, H100, LOCAL, UB) == ()  # the local spec: no TE GEMM at all
    assert afterstep.workspace_bytes(record, DeviceInfo(type="cpu", name="cpu"), MEGATRON, UB) == 0
    # a record without TE's userbuffers: torchtitan's overlap is AsyncTP, not TE's
    titan = TrainingSetup(runtime="torchtitan", precision="bf16-mixed")
    assert te_userbuffers.workspace_bytes(TE_H100, CommSetup(tp=2, tp_overlap="tp-comm-overlap"), titan) == 0
    assert te_userbuffers.workspace_bytes(TE_H100, CommSetup(tp=2, tp_overlap="async-tp"), MEGATRON) == 0


def _evaluate(folder: Path, overlap: bool) -> dict:
    path = folder / ("on.sh" if overlap else "off.sh")
    path.write_text(f"torchrun --nproc-per-node 2 pretrain_gpt.py {MODEL}" + (" --tp-comm-overlap" if overlap else "")
                    + "\n")
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpu", "h100", "--json").stdout)["ranks"][0]


def test_a_launch_with_the_overlap_holds_the_workspace_after_the_step_and_at_the_peak(tmp_path):
    on, off = _evaluate(tmp_path, True), _evaluate(tmp_path, False)
    assert on["static_bytes"] == off["static_bytes"]
    assert on["after_step_bytes"] - off["after_step_bytes"] == 3 * TE_H100
    assert on["peak_bytes"] - off["peak_bytes"] == 3 * TE_H100
    # reserved as the caching allocator would: one large block, rounded up to 2 MiB (100,666,368 B -> 98 MiB)
    assert on["reserved_bytes"] - off["reserved_bytes"] == 98 * MIB
