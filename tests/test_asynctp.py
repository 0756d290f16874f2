"""AsyncTP: the collectives torch's micro-pipeline TP pass fuses are charged as the chunked pipeline
the fused op runs (planner/cost/asynctp.py), the rest whole; hand-computed on 2 and 4 chunks."""

import pytest

from planner.cost import asynctp, comm, costmodel
from planner.models.archs import ARCHS, GPUS
from planner.models.synthetic import layer, profile_of
from planner.profiler import analytic_asynctp, analytic_comm
from planner.profiler.formulas import Shape
from planner.schema import FusedMatmuls, LayerCollective, TrainSetup


def test_all_gather_matmul_runs_its_own_chunk_first_and_each_other_once_it_lands():
    # 4 ranks, chunk matmul 2 ms, copy 3 ms: own chunk [0, 2]; copies on the link [0, 3], [3, 6],
    # [6, 9] (step 3's stream is free at step 1's matmul end, 5); matmuls [3, 5], [6, 8], [9, 11]
    assert asynctp.all_gather_matmul_ms(2.0, 3.0, 4) == pytest.approx(11.0)
    # copies shorter than the matmuls: only the matmuls; copy 1 ms hides behind each 2 ms chunk
    # (copy 2 waits for its stream's previous matmul, own chunk's, ending at 2: [2, 3])
    assert asynctp.all_gather_matmul_ms(2.0, 1.0, 4) == pytest.approx(8.0)
    # 2 ranks: own chunk [0, 2] beside the one copy [0, 3], then its matmul [3, 5]
    assert asynctp.all_gather_matmul_ms(2.0, 3.0, 2) == pytest.approx(5.0)


def test_matmul_reduce_scatter_multiplies_the_peers_chunks_first_and_its_own_last():
    # 4 ranks, chunk 2 ms, copy 3 ms: matmuls [0, 2], [2, 4], then step 3 waits for step 1's copy
    # (same stream, [2, 5]): [5, 7]; copies [2, 5], [5, 8], [8, 11]; own chunk on stream 0 after
    # step 2's copy (8): [8, 10]; the end is the last copy's, 11
    assert asynctp.matmul_reduce_scatter_ms(2.0, 3.0, 4) == pytest.approx(11.0)
    # 2 ranks: the peer's chunk [0, 2], its copy [2, 5] beside the own chunk [2, 4]
    assert asynctp.matmul_reduce_scatter_ms(2.0, 3.0, 2) == pytest.approx(5.0)
    # fast copies: the 4 matmuls back to back and the last copy (step 3's, after [4, 6]) [6, 7]
    assert asynctp.matmul_reduce_scatter_ms(2.0, 1.0, 4) == pytest.approx(8.0)


def test_a_fused_op_adds_its_pipeline_and_copies_beyond_the_whole_matmul():
    # 4 ranks, 0.4 GB tensor at 40 GB/s: each copy 0.1 GB = 2.5 ms; chunks 2 ms (whole 7.5 ms: the
    # chunks run less efficiently); copy_ms 0.5
    fused = (7.5, 2.0, 0.5, None, None)
    # pipeline: own [0, 2]; copies [0, 2.5], [2.5, 5], [5, 7.5]; matmuls [2.5, 4.5], [5, 7], [7.5, 9.5]
    assert asynctp.fused_extra_ms("all-gather", 4e8, 4, 40.0, fused) == pytest.approx(9.5 + 0.5 - 7.5)
    # under float8 with fp8 figures: chunks 1 ms, whole 3.5: own [0, 1]; matmuls end 3.5, 6, 8.5
    fp8 = (7.5, 2.0, 0.5, 3.5, 1.0)
    assert asynctp.fused_extra_ms("all-gather", 4e8, 4, 40.0, fp8, float8=True) == pytest.approx(8.5 + 0.5 - 3.5)
    assert asynctp.fused_extra_ms("all-gather", 4e8, 4, 40.0, fp8) == pytest.approx(2.5)  # bf16 figures


def _block(collectives):
    one = layer("block", "block", fwd_ms=10.0, act_mib=1, input_mib=1, param_count=10)
    one = one.model_copy(update={"bwd_ms": 20.0, "collectives": collectives})
    return costmodel.layer_costs(profile_of([one]))[0]


def _setup(overlap: str) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime="torchtitan",
                      comm={"tp": 4, "tp_gb_per_s": 40.0, "tp_overlap": overlap})


def test_under_async_tp_the_fused_collectives_pipeline_and_the_unfused_stay_whole():
    fused = FusedMatmuls(whole_ms=7.5, chunk_ms=2.0, copy_ms=0.5)
    gather = LayerCollective(kind="all-gather", tensor_bytes=4 * 10**8, fwd=1, recompute=1, fused=fused)
    scatter = LayerCollective(kind="reduce-scatter", tensor_bytes=4 * 10**8, bwd=1)  # a sum's: not fused
    block = _block([gather, scatter])
    whole = 0.75 * 4e8 / 40e9 * 1e3  # a ring collective over 4 ranks: 3/4 of the tensor, 7.5 ms
    assert comm.layer_comm_ms(block, 0, _setup("none")) == pytest.approx(2 * whole)
    # forward: the fused all-gather adds 2.5 ms (above); backward: the reduce-scatter whole
    assert comm.layer_comm_ms(block, 0, _setup("async-tp")) == pytest.approx(2.5 + whole)
    assert comm.layer_comm_ms(block, 1, _setup("async-tp")) == pytest.approx(2 * 2.5 + whole)  # and the recompute's


def test_the_analytic_block_names_which_collectives_torch_fuses():
    arch, gpu = ARCHS["llama3-8b"], GPUS["h100-sxm"]
    shape = Shape(seq_len=1024, micro_batch_size=2, tp=4, sp=True)
    fused = analytic_asynctp.block_fused(arch, shape, gpu)
    collectives = analytic_comm.block_collectives(arch.hidden_size, shape, fused)
    # the forward's four and the backward's two gathers are fused; the backward's two reduce-scatters
    # (of the sums of Q/K/V's and gate/up's input gradients) are not
    assert [c.fused is not None for c in collectives] == [True] * 4 + [True, False, True, False]
    # wo's matmul: 2 x 2,048 tokens x 1,024 (its input width at TP 4) x 4,096; its 4 chunks each a quarter
    wo = fused["wo-scatter"]
    flops = 2 * 2048 * 1024 * 4096
    assert wo.whole_ms == pytest.approx(flops / (gpu.bf16_tflops * 1e12 * _eff(flops, gpu)) * 1e3)
    assert wo.chunk_ms == pytest.approx(flops / 4 / (gpu.bf16_tflops * 1e12 * _eff(flops / 4, gpu)) * 1e3)
    assert wo.chunk_ms * 4 > wo.whole_ms  # a chunk a quarter the size runs less efficiently
    # the reduce-scatter's sum reads the 4 partials (the whole tensor) and writes the rank's quarter
    whole = 2048 * 4096 * 2
    assert wo.copy_ms == pytest.approx((whole + whole / 4) / (gpu.hbm_tbps * 1e12) * 1e3)
    assert analytic_asynctp.block_fused(arch, Shape(seq_len=1024, micro_batch_size=2, tp=4), gpu) == {}  # no SP


def _eff(flops, gpu):
    from planner.profiler.roofline import matmul_efficiency

    return matmul_efficiency(flops, gpu)


def _evaluate(path, *extra):
    from click.testing import CliRunner

    from planner.cli import cli

    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "34",
                                    "--ckpt-per-stage", "0", "--microbatches", "2", "--precision", "bf16-mixed",
                                    "--mem", "80GB", "--runtime", "torchtitan", "--tp-overlap", "async-tp", "--compile",
                                    "--time-limit", "10", *extra])


def test_evaluate_says_how_many_collectives_async_tp_overlaps(tmp_path):
    from click.testing import CliRunner

    from planner.cli import cli

    for sp in (True, False):
        out = tmp_path / f"sp{sp}.json"
        args = ["profile", "--arch", "llama3-8b", "--seq-len", "1024", "--micro-batch-size", "1", "--tp", "2",
                "--gpu", "h100", "--out", str(out)] + (["--sp"] if sp else [])
        assert CliRunner().invoke(cli, args).exit_code == 0
        result = _evaluate(out)
        said = " ".join(result.output.split())
        assert result.exit_code == 0, result.output
        if sp:  # 32 blocks x 6 fused of 8; the embedding's 2 and the head's 2 are not compiled
            assert "AsyncTP overlaps 192 of the profile's 260 collectives" in said
            assert "symmetric-memory workspace (outside the caching allocator" in said  # in the nccl column
        else:  # all-reduces: never fused
            assert "names no collective torch fuses with a matmul" in said


def test_the_symmetric_workspace_is_the_largest_request_of_the_fused_ops():
    fused = FusedMatmuls(whole_ms=1.0, chunk_ms=0.3)
    gather = LayerCollective(kind="all-gather", tensor_bytes=4 * 10**8, fwd=1, fused=fused)
    scatter = LayerCollective(kind="reduce-scatter", tensor_bytes=4 * 10**8, fwd=1, fused=fused)
    summed = LayerCollective(kind="reduce-scatter", tensor_bytes=8 * 10**8, bwd=1)  # not fused: NCCL's
    # 4 ranks: the all-gather's shard 1e8 B (bf16), 0.5e8 in float8; the reduce-scatter's two row
    # chunks of bf16 partials 2 x 1e8 either way (torch 2.6.0 _symmetric_memory 172-175, 336-337)
    assert asynctp.symmetric_workspace_bytes([gather], 4, float8=False) == 10**8
    assert asynctp.symmetric_workspace_bytes([gather], 4, float8=True) == 5 * 10**7
    assert asynctp.symmetric_workspace_bytes([gather, scatter, summed], 4, float8=True) == 2 * 10**8
    assert asynctp.symmetric_workspace_bytes([summed], 4, float8=False) == 0


def test_async_tp_takes_its_workspace_beside_the_reserved_peak_not_in_it():
    from planner.schema import DeviceInfo

    fused = FusedMatmuls(whole_ms=7.5, chunk_ms=2.0, copy_ms=0.5)
    gather = LayerCollective(kind="all-gather", tensor_bytes=4 * 10**8, fwd=1, recompute=1, fused=fused)
    scatter = LayerCollective(kind="reduce-scatter", tensor_bytes=4 * 10**8, fwd=1, recompute=1, fused=fused)
    one = layer("block", "block", fwd_ms=10.0, act_mib=1, input_mib=1, param_count=10)
    one = one.model_copy(update={"bwd_ms": 20.0, "collectives": [gather, scatter]})
    profile = profile_of([one]).model_copy(update={"device": DeviceInfo(type="cuda", name="test gpu")})
    stages = costmodel.split_to_stages([0], [False], profile)
    plain, fused_run = (costmodel.evaluate(stages, profile, _setup(overlap)).stages[0] for overlap in ("none", "async-tp"))
    # one rank, no other group: the TP group's communicator (4 ranks) and, under AsyncTP, the
    # reduce-scatter's two 1e8 B row chunks
    assert fused_run.workspace_bytes - plain.workspace_bytes == 2 * 10**8
    assert (fused_run.peak_bytes, fused_run.reserved_bytes) == (plain.peak_bytes, plain.reserved_bytes)
    assert fused_run.device_need_bytes - plain.device_need_bytes == 2 * 10**8


def test_under_float8_a_fused_all_gather_copies_the_float8_shard():
    # as above (4 ranks, 40 GB/s, float8 chunks 1 ms, whole 3.5 ms), the shard a float8 cast: each
    # copy 0.05 GB = 1.25 ms and the own shard's copy_ms 0.25. Own chunk [0, 1]; copies [0, 1.25],
    # [1.25, 2.5], [2.5, 3.75]; matmuls [1.25, 2.25], [2.5, 3.5], [3.75, 4.75]
    fp8 = (7.5, 2.0, 0.5, 3.5, 1.0)
    assert asynctp.fused_extra_ms("all-gather", 4e8, 4, 40.0, fp8, float8=True,
                                  gathers_float8=True) == pytest.approx(4.75 + 0.25 - 3.5)
    # a reduce-scatter's partials are the bf16 matmul outputs: unchanged (chunks 1 ms, copies 2.5 ms:
    # matmuls [0, 1], [1, 2], [3.5, 4.5]; copies [1, 3.5], [3.5, 6], [6, 8.5]; own chunk [6, 7])
    assert asynctp.fused_extra_ms("reduce-scatter", 4e8, 4, 40.0, fp8, float8=True, gathers_float8=True) == \
        pytest.approx(asynctp.fused_extra_ms("reduce-scatter", 4e8, 4, 40.0, fp8, float8=True)) == \
        pytest.approx(8.5 + 0.5 - 3.5)
