"""TE's userbuffers ring exchange as its code runs it (planner/cost/ub_ring.py, planner/profiler/analytic_ubring.py;
docs/framework-facts.md §357-§360): the GEMM in tp row chunks at their own size's efficiency, issued as the peer
copies land; hand-computed pipelines on 2 and 4 chunks, and the block's charge by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.commands.comm_setup import _userbuffers
from planner.cost import comm, costmodel, ub_ring, ub_sms
from planner.models.archs import ARCHS, GPUS, gpu
from planner.models.synthetic import layer, profile_of
from planner.profiler import analytic_asynctp, analytic_comm, analytic_ubring
from planner.profiler.formulas import Shape
from planner.schema import LayerCollective, RingGemm, TrainSetup

H100_405B = "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"
RING = ub_sms.Overlap("ring_exchange", 1, False)


def test_all_gather_gemm_waits_for_each_chunk_as_it_lands():
    # 4 ranks, chunk GEMM 2 ms, copy 3 ms: own chunk [0, 2]; copies one after another [0, 3], [3, 6], [6, 9];
    # GEMMs [3, 5], [6, 8], [9, 11]
    assert ub_ring.all_gather_gemm_ms(2.0, 3.0, 4) == pytest.approx(11.0)
    # copies faster than the GEMMs: the four GEMMs back to back
    assert ub_ring.all_gather_gemm_ms(2.0, 1.0, 4) == pytest.approx(8.0)
    # aggregated, 4 ranks, two-chunk GEMM 4 ms, copy 1 ms a chunk: the first exchange [0, 1], GEMM 0 [1, 5]; the
    # two-chunk copy [1, 3]; GEMM 1 [5, 9]
    assert ub_ring.all_gather_gemm_ms(2.0, 1.0, 4, aggregate=True, pair_ms=4.0) == pytest.approx(9.0)
    # aggregated at 2 ranks: one exchange, then the one GEMM of both chunks (the whole)
    assert ub_ring.all_gather_gemm_ms(2.0, 1.0, 2, aggregate=True, pair_ms=3.5) == pytest.approx(4.5)


def test_gemm_reduce_scatter_copies_each_peers_chunk_once_its_gemm_is_done():
    # 4 ranks, chunk 2 ms, copy 3 ms: GEMMs [0, 2], [2, 4], [4, 6], [6, 8] (the own chunk last, not sent); copies
    # [2, 5], [5, 8], [8, 11]: the last copy's end
    assert ub_ring.gemm_reduce_scatter_ms(2.0, 3.0, 4) == pytest.approx(11.0)
    # copies faster: the GEMMs' end, the last copy [6, 7] beside the own chunk's GEMM
    assert ub_ring.gemm_reduce_scatter_ms(2.0, 1.0, 4) == pytest.approx(8.0)
    assert ub_ring.gemm_reduce_scatter_ms(2.0, 3.0, 2) == pytest.approx(5.0)  # [0, 2], its copy [2, 5]; own [2, 4]


def test_a_site_adds_its_pipeline_beyond_the_whole_gemm():
    ring = (7.0, 2.0, 4.0, 3.0, 1.0, 1.8)  # bf16 whole, chunk, pair; FP8 whole, chunk, pair (ms)
    # 4 ranks, a 4e8 B bf16 tensor at 40 GB/s: a chunk's copy 1e8 B, 2.5 ms
    extra, whole = ub_ring.site_extra_ms("reduce-scatter", 4e8, ring, RING, ranks=4, copy_gb_per_s=40.0, sms=0,
                                         float8=False, gathered_float8=False)
    # GEMMs end 8; copies [2, 4.5], [4.5, 7], [7, 9.5]
    assert (extra, whole) == (pytest.approx(9.5 - 7.0), 7.0)
    # FP8: chunks 1 ms, the all-gather's chunks 1 B an element (1.25 ms a copy): own [0, 1]; copies end 1.25, 2.5,
    # 3.75; GEMMs [1.25, 2.25], [2.5, 3.5], [3.75, 4.75]
    extra, whole = ub_ring.site_extra_ms("all-gather", 4e8, ring, RING, ranks=4, copy_gb_per_s=40.0, sms=0,
                                         float8=True, gathered_float8=True)
    assert (extra, whole) == (pytest.approx(4.75 - 3.0), 3.0)
    # set_sm_margin: each chunk on 3 of 4 SMs (4/3 its time); the compute scale on every GEMM
    margin = ub_sms.Overlap("ring_exchange", 1, True)
    extra, whole = ub_ring.site_extra_ms("reduce-scatter", 4e7, ring, margin, ranks=4, copy_gb_per_s=40.0, sms=4,
                                         float8=False, gathered_float8=False, compute_scale=1.5)
    assert (extra, whole) == (pytest.approx(4 * 2.0 * 1.5 * 4 / 3 - 7.0 * 1.5), 7.0 * 1.5)  # copies 0.25 ms: hidden
    # without use_ce the copies run on num_sm of the SMs: 1/4 of the three copies' 2.5 ms lost beside the GEMMs
    sm_copies = ub_sms.Overlap("ring_exchange", 1, False, use_ce=False)
    extra, _ = ub_ring.site_extra_ms("reduce-scatter", 4e8, ring, sm_copies, ranks=4, copy_gb_per_s=40.0, sms=4,
                                     float8=False, gathered_float8=False)
    assert extra == pytest.approx(9.5 + 3 * 2.5 / 4 - 7.0)


def _block(ring: RingGemm | None):
    """A dense block of 100 / 200 ms passes with its eight collectives of 4e8 B, the six ring sites with `ring`."""
    sites = [("all-gather", True), ("reduce-scatter", True), ("all-gather", True), ("reduce-scatter", True),
             ("all-gather", True), ("reduce-scatter", False), ("all-gather", True), ("reduce-scatter", False)]
    collectives = [LayerCollective(kind=kind, tensor_bytes=4 * 10**8, ring=ring if split else None,
                                   **({"fwd": 1, "recompute": 1} if i < 4 else {"bwd": 1}))
                   for i, (kind, split) in enumerate(sites)]
    one = layer("layers.0", "decoder_block", fwd_ms=100.0, act_mib=1, input_mib=1, param_count=10)
    one = one.model_copy(update={"bwd_ms": 200.0, "collectives": collectives})
    return costmodel.layer_costs(profile_of([one]))[0]


def _setup(**comm_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime="megatron",
                      comm=dict(tp=4, tp_gb_per_s=40.0, tp_overlap="tp-comm-overlap", **comm_fields))


def test_the_block_charges_its_ring_sites_as_pipelines_and_the_bulk_ones_beside_the_rest():
    ring = RingGemm(whole_ms=7.0, chunk_ms=2.0, pair_ms=4.0)
    setup = _setup(ub_cfg="userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192", gpu_sms=0)  # Bridge's: six rings
    # per ring site (copy 2.5 ms, a chunk a quarter of 4e8 B at 40 GB/s): all-gather own [0, 2], copies end 2.5, 5,
    # 7.5, GEMMs end 4.5, 7, 9.5 (+2.5 over 7); reduce-scatter +2.5 (above)
    # forward: four rings, 4 x 2.5; backward: two rings 2 x 2.5 and the two bulk scatters hidden beside 200 - 14 ms
    assert comm.layer_comm_ms(_block(ring), 0, setup) == pytest.approx(4 * 2.5 + 2 * 2.5)
    assert comm.layer_comm_ms(_block(ring), 1, setup) == pytest.approx(8 * 2.5 + 2 * 2.5)  # and the recompute's
    # a profile without the record keeps the first-order charge: every collective hidden beside its pass
    assert comm.layer_comm_ms(_block(None), 0, setup) == 0.0
    # TE's defaults pipeline proj_fprop and fc2_fprop: two forward rings
    assert comm.layer_comm_ms(_block(ring), 0, _setup(ub_cfg=None, gpu_sms=0)) == pytest.approx(2 * 2.5 + 2 * 2.5)


def test_the_ring_sites_leave_the_sms_the_first_order_charge_took():
    # Bridge's H100 70B config: proj_fprop / fc2_fprop rings with a one-SM margin, qkv_wgrad bulk on 24, fc1_wgrad
    # bulk on 4; TE's SMs: the ring's margin in its pipeline, the bulk overlaps' first order (ub_sms.lost_sm_ms)
    cfg = "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
    each = [1.0] * 8
    assert ub_sms.lost_sm_ms(each, "fwd", config=cfg, sms=132) == pytest.approx(2 / 132)
    assert ub_sms.lost_sm_ms(each, "fwd", config=cfg, sms=132, skip=frozenset({"proj_fprop", "fc2_fprop"})) == 0.0
    # the backward: qkv_wgrad 24, fc1_wgrad 4, and qkv_dgrad's 4 and fc1_dgrad's 2 bulk gathers
    assert ub_sms.lost_sm_ms(each, "bwd", config=cfg, sms=132, skip=frozenset({"proj_dgrad", "fc2_dgrad"})) == \
        pytest.approx((24 + 4 + 4 + 2) / 132)


def test_the_analytic_block_records_tes_fused_gemms_at_the_ring_sites():
    arch, h100 = ARCHS["llama3-8b"], GPUS["h100-sxm"]
    shape = Shape(seq_len=1024, micro_batch_size=2, tp=4, sp=True)
    ring = analytic_ubring.block_ring(arch, shape, h100, fp8=True)
    collectives = analytic_comm.block_collectives(arch.hidden_size, shape, ring=ring)
    # the forward's four and the backward's two gathers; the backward's two scatters are bulk overlaps
    assert [c.ring is not None for c in collectives] == [True] * 4 + [True, False, True, False]
    # linear_qkv one GEMM: 2 x 2,048 tokens x 4,096 x (1,024 + 2 x 256) at TP 4; a chunk a quarter, a pair a half
    flops = 2 * 2048 * 4096 * (1024 + 2 * 256)
    qkv = ring["attn-gather"]
    assert qkv.whole_ms == pytest.approx(analytic_asynctp.matmuls_ms([flops], h100, None))
    assert qkv.chunk_ms == pytest.approx(analytic_asynctp.matmuls_ms([flops // 4], h100, None))
    assert qkv.pair_ms == pytest.approx(analytic_asynctp.matmuls_ms([flops // 2], h100, None))
    assert qkv.fp8_chunk_ms == pytest.approx(analytic_asynctp.matmuls_ms([flops // 4], h100, None, fp8=True))
    assert 4 * qkv.chunk_ms > qkv.whole_ms  # a quarter-size GEMM runs less efficiently
    # linear_fc1: gate and up one GEMM, 2 x 2,048 x 4,096 x 2 x 3,584
    assert ring["mlp-gather"].whole_ms == pytest.approx(
        analytic_asynctp.matmuls_ms([2 * 2048 * 4096 * 2 * 3584], h100, None))
    assert analytic_ubring.block_ring(arch, Shape(seq_len=1024, micro_batch_size=2, tp=4), h100) == {}  # no SP
    assert analytic_ubring.block_ring(arch, Shape(seq_len=1024, micro_batch_size=2, sp=True), h100) == {}  # TP 1


def test_b4s_block_by_hand():
    # B4's block (405B, 4,096 tokens a CP rank, TP 8, FP8) on an H100 at the copy engines' 371.6 GB/s: proj_fprop's
    # chunks copy 512 x 16,384 x 2 B = 16.8 MB, 45.1 us each, longer than its 35.7 us FP8 chunk GEMM
    fields = _userbuffers(gpu("h100-sxm"), SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg=H100_405B))
    assert fields["tp_copy_gb_per_s"] == 371.6
    shape = Shape(seq_len=8192, micro_batch_size=1, tp=8, sp=True, cp=2)
    ring = analytic_ubring.block_ring(ARCHS["llama3.1-405b"], shape, GPUS["h100-sxm"], fp8=True)
    proj = ring["wo-scatter"]
    tensor = 4096 * 16384 * 2
    copy = tensor / 8 / 371.6e9 * 1e3
    chunk = proj.fp8_chunk_ms * 132 / 131  # the one-SM margin
    extra, _ = ub_ring.site_extra_ms("reduce-scatter", tensor, tuple(proj.model_dump().values()), ub_sms.CONFIGS[
        H100_405B]["proj_fprop"], ranks=8, copy_gb_per_s=371.6, sms=132, float8=True, gathered_float8=False)
    assert copy > chunk
    assert extra == pytest.approx(chunk + 7 * copy - proj.fp8_whole_ms)  # the first GEMM, then the copies
    assert extra == pytest.approx(0.1339, abs=1e-4)
    assert "tp_copy_gb_per_s" not in _userbuffers(gpu("b200"), SimpleNamespace(tp_overlap="tp-comm-overlap",
                                                                               ub_cfg=None))  # none published
