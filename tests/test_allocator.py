"""The reserved peak on cuda: the caching allocator's rounding and fragmentation margin and
NCCL's buffers, charged against the cap by every solver alike; cpu stays exact."""

import itertools
import json
import math

import pytest
import torch
import yaml
from fixtures.cli import run_ok

from planner import io
from planner.cost import allocator, costmodel
from planner.models.synthetic import uniform_blocks
from planner.runtime.memtrack import PeakMemory
from planner.schema import DeviceInfo, TrainSetup
from planner.solve import search

MIB = 2**20
GIB = 2**30


def test_blocks_and_segments_follow_the_caching_allocators_size_classes():
    # round_size: multiples of 512 bytes, at least 512
    assert [allocator.block_bytes(n) for n in (0, 1, 512, 513, 1000, 4096)] == [0, 512, 512, 1024, 1024, 4096]
    # get_allocation_size: up to 1 MiB from 2 MiB segments, below 10 MiB from 20 MiB ones, the
    # rest rounded up to 2 MiB
    assert allocator.segment_bytes(1) == 2 * MIB
    assert allocator.segment_bytes(MIB) == 2 * MIB
    assert allocator.segment_bytes(MIB + 1) == 20 * MIB
    assert allocator.segment_bytes(10 * MIB - 512) == 20 * MIB
    assert allocator.segment_bytes(10 * MIB) == 10 * MIB
    assert allocator.segment_bytes(11 * MIB + 1) == 12 * MIB


def test_the_allocated_limit_inverts_the_reserved_peak():
    """reserved_bytes(a) <= X exactly when a <= allocated_limit(X): a solver constraining the
    allocated peak agrees with the check on the reserved one."""
    for fragmentation in (0.0, 0.15, 0.33):
        for reservable in (3 * MIB, 10 * GIB + 12345, 78 * GIB):
            limit = allocator.allocated_limit(reservable, fragmentation)
            assert allocator.reserved_bytes(limit - 1, fragmentation) <= reservable
            assert allocator.reserved_bytes(limit + 4096, fragmentation) > reservable
    # 15% fragmentation: 1 - allocated / reserved = 0.15, rounded up to 2 MiB segments
    assert allocator.reserved_bytes(17 * GIB, 0.15) == math.ceil(17 * GIB / 0.85 / (2 * MIB)) * 2 * MIB == 20 * GIB


def _cuda(profile):
    return profile.model_copy(update={"device": DeviceInfo(type="cuda", name="test gpu")})


def _setup(stages, caps, **fields):
    return TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1, mem_caps_bytes=list(caps), **fields)


def test_a_cuda_stage_reserves_beyond_its_peak_and_holds_nccls_buffers():
    profile = uniform_blocks(4)
    setup = _setup(3, [80 * GIB] * 3, dp=4, zero=1, shard_group=2)
    cpu = costmodel.evaluate(costmodel.split_to_stages([0, 2, 4], [False] * 6, profile), profile, setup)
    cuda_profile = _cuda(profile)
    cuda = costmodel.evaluate(costmodel.split_to_stages([0, 2, 4], [False] * 6, cuda_profile), cuda_profile, setup)
    for c in cpu.stages:  # cpu: the cap, the peak, nothing else
        assert (c.reserved_bytes, c.workspace_bytes, c.allocated_limit_bytes) == (None, 0, 80 * GIB)
    for s, mine in enumerate(cuda.stages):
        assert mine.reserved_bytes == math.ceil(mine.peak_bytes / 0.85 / (2 * MIB)) * 2 * MIB
        # a pair communicator per pipeline neighbour, the shard group (2) and the replica group (2)
        neighbours = 1 if s in (0, 2) else 2
        assert mine.workspace_bytes == (neighbours + 2) * 544 * MIB
        assert mine.predicted().reserved_bytes == mine.reserved_bytes
    assert cuda.stages[1].allocated_limit_bytes == (80 * GIB - 4 * 544 * MIB) // (2 * MIB) * 2 * MIB * 0.85 // 1
    stated = _setup(3, [80 * GIB] * 3, dp=4, zero=1, shard_group=2, fragmentation=0.0)
    first = costmodel.evaluate(costmodel.split_to_stages([0, 2, 4], [False] * 6, cuda_profile), cuda_profile,
                               stated).stages[0]
    assert first.peak_bytes == cuda.stages[0].peak_bytes
    assert first.reserved_bytes == math.ceil(first.peak_bytes / (2 * MIB)) * 2 * MIB


def _fits_reserved(stages, profile, setup):
    """The check written out independently: ceil((peak + margin) / (1 - f) / 2 MiB) 2 MiB
    + NCCL's buffers within the cap, every stage."""
    cost = costmodel.evaluate(stages, profile, setup)
    return all(math.ceil((c.peak_bytes + costmodel.FIT_MARGIN_BYTES) / 0.85 / (2 * MIB)) * 2 * MIB
               + c.workspace_bytes <= c.cap_bytes for c in cost.stages)


def _brute(profile, setup):
    n, best = len(profile.layers), None
    for cuts in itertools.combinations(range(1, n), setup.pipeline.stages - 1):
        for mask in range(2**n):
            flags = [bool(mask >> i & 1) for i in range(n)]
            stages = costmodel.split_to_stages([0, *cuts], flags, profile)
            if _fits_reserved(stages, profile, setup):
                ms = costmodel.evaluate(stages, profile, setup).iteration_ms
                best = ms if best is None else min(best, ms)
    return best


def test_both_solvers_plan_against_the_reserved_peak_as_brute_force_does():
    cpu_profile = uniform_blocks(4)
    profile = _cuda(cpu_profile)
    bounds, flags = [0, 3], [False] * 6
    plain = costmodel.evaluate(costmodel.split_to_stages(bounds, flags, profile), profile, _setup(2, [GIB] * 2))
    # a cap the plain plan fits by its allocated peak plus NCCL, but not by its reserved one
    cap = max(c.peak_bytes for c in plain.stages) + 544 * MIB + 64 * MIB
    setup = _setup(2, [cap, cap])
    on_cpu = search.plan(cpu_profile, setup)
    assert not any(stage.checkpointed for stage in on_cpu.stages)
    best = _brute(profile, setup)
    assert best is not None and best > on_cpu.cost.iteration_ms  # the reserve costs recompute
    for solver in ("dp", "milp"):
        found = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
        assert _fits_reserved(found.stages, profile, setup), solver
        assert found.cost.iteration_ms == pytest.approx(best, rel=1e-6), solver


def test_a_fake_profile_for_a_gpu_counts_the_allocators_blocks(tmp_path):
    model = tmp_path / "chain.py"
    model.write_text("import torch\nfrom torch import nn\n\n\ndef build_model():\n"
                     "    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))\n\n\n"
                     "def example_batch(micro_batch_size):\n"
                     "    return torch.randn(micro_batch_size, 64), torch.randn(micro_batch_size, 32)\n")
    for device in ("cpu", "cuda"):
        run_ok("profile", model, "--fake", "--device", device, "--micro-batch-size", "1", "--gpu", "a100-80g",
               "--out", tmp_path / f"{device}.json")
    cpu, cuda = (io.load_profile(tmp_path / f"{d}.json") for d in ("cpu", "cuda"))
    # the first Linear keeps its input: 64 fp32 = 256 bytes on cpu; 64 bf16 = 128 bytes, one
    # 512-byte block, on the GPU. The last Linear's output, 32 values: 128 B, a 512-byte block
    assert (cpu.layers[0].act_bytes, cuda.layers[0].act_bytes) == (256, 512)
    assert (cpu.layers[2].output_bytes, cuda.layers[2].output_bytes) == (128, 512)
    assert cuda.batch_input_bytes == 512 and cpu.batch_input_bytes == 256


def test_solve_on_a_gpu_profile_states_the_reserved_peak_beside_the_allocated(tmp_path):
    run_ok("profile", "--arch", "llama3-8b", "--gpu", "h100", "--seq-len", "2048", "--micro-batch-size", "1",
           "--out", tmp_path / "p.json")
    result = run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "4", "--precision", "bf16-mixed",
                    "--out", tmp_path / "plan.yaml", "--json")
    summary = json.loads(result.stdout)
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    for stage in plan["stages"]:
        predicted = stage["predicted"]
        # the analytic profile's layers carry records, and its loss one from the terms charged
        # (planner/cost/loss_records.py): the allocator's replay on every stage, the last too
        assert predicted["reserved_by"] == "replay"
        assert predicted["reserved_bytes"] >= predicted["peak_bytes"]
        # H100: a point-to-point peer per neighbour, 32 channels x 12 MiB (planner/cost/nccl_buffers.py)
        assert predicted["workspace_bytes"] == (1 if stage["index"] in (0, 3) else 2) * 32 * 12 * MIB
        mine = next(s for s in summary["stages"] if s["index"] == stage["index"])
        assert sum(mine["nccl_buffers"].values()) == predicted["workspace_bytes"]
    assert summary["stages"][0]["reserved_bytes"] == plan["stages"][0]["predicted"]["reserved_bytes"]
    assert summary["stages"][0]["reserved_by"] == "replay"
    table = run_ok("evaluate", "--profile", tmp_path / "p.json", "--precision", "bf16-mixed",
                   "--fragmentation", "0.3", "--layers-per-stage", "9,8,8,9", "--ckpt-per-stage", "0,0,0,0")
    assert "reserved" in table.output and "nccl" in table.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_peak_memory_reads_the_reserved_peak_on_cuda():
    with PeakMemory("cuda") as mem:
        x = torch.empty(3 * MIB + 1, dtype=torch.uint8, device="cuda")
        del x
    assert mem.peak_bytes >= allocator.block_bytes(3 * MIB + 1)
    assert mem.reserved_bytes >= allocator.segment_bytes(3 * MIB + 1)


def test_launchs_memory_table_sets_the_measured_reserved_peak_beside_the_prediction():
    from planner.commands.launch import memory_table
    from planner.console import console
    from planner.schema import FileRef, RunReport, StageMeasured, StagePredicted, StageReport

    predicted = StagePredicted(peak_bytes=40 * GIB, static_bytes=10 * GIB, activation_bytes=30 * GIB, time_ms=1.0,
                               reserved_bytes=48 * GIB, workspace_bytes=544 * MIB)
    measured = StageMeasured(peak_bytes=41 * GIB, fwd_ms=1, bwd_ms=2, time_ms=3, reserved_bytes=45 * GIB)
    report = RunReport(created_at="now", plan=FileRef(file="plan.yaml", sha256="0"),
                       device=DeviceInfo(type="cuda", name="H100"), backend="nccl", steps=1, warmup_steps=0,
                       microbatches=4, iteration_ms=1.0, iteration_ms_all=[1.0], predicted_iteration_ms=1.0,
                       losses=[1.0], stages=[StageReport(index=0, cap_bytes=80 * GIB, predicted=predicted,
                                                         measured=measured)])
    with console.capture() as captured:
        console.print(memory_table(report))
    text = captured.get()
    assert "reserved pred" in text and "48 GiB" in text and "45 GiB" in text and "-6.2%" in text


def test_fragmentation_is_refused_where_no_caching_allocator_reserves(tmp_path):
    from fixtures.cli import run

    from planner import io

    path = tmp_path / "cpu.json"
    io.save_profile(uniform_blocks(4), path)
    result = run("solve", "--profile", path, "--stages", "2", "--mem", "1GiB", "--fragmentation", "0.2")
    assert result.exit_code != 0 and "--fragmentation applies to a GPU" in result.output
    assert "Traceback" not in result.output
