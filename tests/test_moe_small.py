"""An expert-parallel all-to-all inside a node runs at NCCL's effective NVLink rate, not the datasheet's line rate
(planner/models/nvlink_rates.py, docs/framework-facts.md §102, docs/published-runs.md §25.moesmall)."""

import pytest
from export_plans import llm_profile

from planner.cost import dataparallel, links
from planner.models import gpus, nvlink_rates


def _profile(gpu: str, tp: int = 1):
    p = llm_profile(8)
    return p.model_copy(update={"device": p.device.model_copy(update={"type": "cuda", "name": f"{gpu} (analytic)"}),
                                "assumptions": {"gpu": gpu, "tp": tp}})


def test_nccls_nvlink_rate_is_its_per_link_figure_times_the_links():
    # H100 SXM: 450 GB/s one way is 18 NVLink 4 links of 25; NCCL's topo.h gives an sm_90 link 20.6: 18 x 20.6
    assert nvlink_rates.nccl_nvlink_rate(450.0, 90) == pytest.approx(370.8)
    # B200 / GB200: 900 GB/s one way is 18 NVLink 5 links of 50; sm_100's link 40.1: 18 x 40.1 (NCCL's maxBw 721.8)
    assert nvlink_rates.nccl_nvlink_rate(900.0, 100) == pytest.approx(721.8)
    # a part with fewer links scales with its count: 8 NVLink 4 links (200 GB/s one way) x 20.6
    assert nvlink_rates.nccl_nvlink_rate(200.0, 90) == pytest.approx(164.8)
    # A100 SXM: 300 GB/s one way is 12 NVLink 3 links of 25; sm_80's link 20.0: 12 x 20.0
    assert nvlink_rates.nccl_nvlink_rate(300.0, 80) == pytest.approx(240.0)


def test_the_gpu_records_read_it_and_others_keep_the_link():
    assert gpus.gpu("h100").node_alltoall_rate == pytest.approx(370.8)
    assert gpus.gpu("h200").node_alltoall_rate == pytest.approx(370.8)
    assert gpus.gpu("b200").node_alltoall_rate == pytest.approx(721.8)
    assert gpus.gpu("gb200").node_alltoall_rate == pytest.approx(721.8)
    assert "topo.h" in gpus.gpu("h100").alltoall_source and "nccl-tests#212" in gpus.gpu("b200").alltoall_source
    assert gpus.gpu("a100-80g").node_alltoall_rate == pytest.approx(240.0)
    assert gpus.gpu("a100-40g").node_alltoall_rate == pytest.approx(240.0)
    # no NCCL figure read for AMD's Infinity Fabric or a PCIe part: the datasheet's one-way rate
    assert gpus.gpu("mi300x").node_alltoall_rate == 448.0
    assert gpus.gpu("h100-pcie").node_alltoall_rate == 64.0


def test_an_expert_group_in_a_node_runs_at_nccls_rate_and_across_nodes_at_the_nic():
    chosen = links.default_links(_profile("h100-sxm"), stages=1, dp=8, shard_group=8, ep=8)
    assert chosen.ep_gb_per_s == pytest.approx(370.8)
    assert "NCCL's effective NVLink rate" in chosen.notes[0] and "nccl#2169" in chosen.notes[0]
    # the shard group's ring keeps nccl-tests' measured busbw (another record's figure, unchanged)
    assert chosen.shard_gb_per_s == 354.9
    # EP 16 at TP 1 leaves the 8-GPU node: a rank's 8/16 to the other node over its own NIC (NCCL's busbw, 0.96 x 50)
    # while its 7/16 to its node's peers go over NVLink (370.8) at once: the NIC's share bounds it, so the 15/16
    # charged moves at 15/16 x 16/8 x 48 = 90 GB/s (planner/models/network_rate.py alltoall_rate)
    assert links.default_links(_profile("h100-sxm"), stages=1, dp=16, shard_group=16, ep=16).ep_gb_per_s == \
        pytest.approx(90.0)
    # at TP 8 each node holds one of the group's ranks: its NIC alone
    assert links.default_links(_profile("h100-sxm", tp=8), stages=1, dp=2, shard_group=2, ep=2).ep_gb_per_s == 48.0
    # GB200's NVLink domain holds 72: EP 64 stays on NVLink
    assert links.default_links(_profile("gb200"), stages=1, dp=64, shard_group=64, ep=64).ep_gb_per_s == \
        pytest.approx(721.8)
    # --ep-bandwidth still replaces it
    given = links.default_links(_profile("h100-sxm"), stages=1, dp=8, shard_group=8, ep=8,
                                given={"--ep-bandwidth": 450.0})
    assert given.ep_gb_per_s == 450.0 and "--ep-bandwidth" in given.notes[0]


def test_e2s_all_to_all_by_hand():
    # Qwen3-30B-A3B, MBS 2 x 4096 tokens, top 8, hidden 2048, bf16: 65,536 copies x 2048 x 2 B = 268,435,456 B
    # a dispatch or combine; 7/8 of it leaves the rank: 234.9 MB at 370.8 GB/s = 0.6335 ms (at the line's 450: 0.522)
    copies_bytes = 8192 * 8 * 2048 * 2
    ms = dataparallel.all_to_all_ms(copies_bytes, 8, gpus.gpu("h100").node_alltoall_rate)
    assert ms == pytest.approx(copies_bytes * 7 / 8 / 370.8e9 * 1e3)
    assert ms == pytest.approx(0.6335, abs=1e-4)
