"""A collective across nodes runs over the NICs of its group's ranks in each node (planner/models/network_rate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run_ok

from planner.cost import comm, links
from planner.models import gpus, network_rate

A100 = gpus.GPUS["a100-80g"]  # 200 Gb/s HDR a GPU: 25 GB/s line, 24 at NCCL's busbw (nccl-tests#119); NVLink ring 300
H100 = gpus.GPUS["h100-sxm"]  # 400 Gb/s NDR a GPU: 50 line, 48 busbw; nccl-tests' in-node ring 354.9
CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def test_ranks_a_node_by_the_stride_of_the_degrees_inside_the_group():
    assert network_rate.ranks_per_node(8, 1, 8) == 8  # the whole group in one node
    assert network_rate.ranks_per_node(256, 1, 8) == 8  # ZeRO 3 over whole nodes: a node's 8
    assert network_rate.ranks_per_node(64, 4, 8) == 2  # data parallel across TP 4: two ranks a node
    assert network_rate.ranks_per_node(64, 8, 8) == 1  # TP 8 fills the node: one rank a node
    assert network_rate.ranks_per_node(4, 16, 8) == 1  # a stride past a node: still one a node
    assert network_rate.ranks_per_node(3, 2, 4) == 2  # 3 ranks 2 apart in nodes of 4: 2, then 1


def test_a_ring_across_nodes_by_hand_for_one_two_and_eight_ranks_a_node():
    # k ranks a node bring k NICs: k x 24 GB/s on A100's HDR, below NVLink's 300 up to the node's 8
    assert [network_rate.ring_rate_across_nodes(A100, k) for k in (1, 2, 8)] == [24.0, 48.0, 192.0]
    assert network_rate.ring_rate_across_nodes(A100, 2, 2.0) == 96.0  # --nics-per-gpu 2: four NICs
    # on H100 eight NICs' 8 x 48 = 384 exceed the in-node ring nccl-tests measured: capped at 354.9
    assert network_rate.ring_rate_across_nodes(H100, 4) == 192.0
    assert network_rate.ring_rate_across_nodes(H100, 8) == H100.node_collective_rate == 354.9
    # a group inside a node keeps the node's ring; across, its ranks a node
    assert network_rate.collective_rate(H100, 8, 1, 8) == 354.9
    assert network_rate.collective_rate(A100, 16, 2, 8) == 96.0  # 4 ranks a node
    assert network_rate.collective_rate(A100, 16, 8, 8) == 24.0


def test_an_all_to_all_across_nodes_by_hand():
    # 16 ranks in 2 nodes of 8 on A100: each rank sends 15/16 of its tensor, 8/16 to the other node over its own NIC
    # (24 GB/s) and 7/16 to its node's peers over NVLink (300) at once: the NIC's 8/16 at 24 takes 1/48 s a byte,
    # so the 15/16 moves at 15/16 x 48 = 45 GB/s; 64 ranks over 8 nodes: 56/64 at 24 -> 63/64 x 64/56 x 24 = 27
    assert network_rate.alltoall_rate(A100, 16, 1, 8) == pytest.approx(45.0)
    assert network_rate.alltoall_rate(A100, 64, 1, 8) == pytest.approx(27.0)
    assert network_rate.alltoall_rate(A100, 16, 8, 8) == pytest.approx(24.0)  # one rank a node: its NIC alone
    assert network_rate.alltoall_rate(A100, 8, 1, 8) == A100.node_alltoall_rate  # inside a node: NVLink's


def test_the_data_parallel_links_count_the_ranks_a_node():
    from test_dataparallel import gpu_profile

    # H100, tp 1, ZeRO 3 over 32 ranks in 4 nodes: 8 NICs a node, capped by the in-node ring; HSDP shards of 8 in a
    # node leave each replica group one rank a node: one NIC
    chosen = links.default_links(gpu_profile(1), stages=1, dp=32, shard_group=32)
    assert chosen.shard_gb_per_s == 354.9 and "8 rank(s) a node" in chosen.notes[0]
    chosen = links.default_links(gpu_profile(1), stages=1, dp=32, shard_group=8)
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s) == (354.9, 48.0)
    # tp 4: two data-parallel ranks a node, 2 x 48; shards of 4 over 2 nodes, their replicas one a node
    chosen = links.default_links(gpu_profile(4), stages=1, dp=16, shard_group=4)
    assert (chosen.shard_gb_per_s, chosen.replica_gb_per_s) == (96.0, 48.0)
    assert links.default_links(gpu_profile(4), stages=1, dp=16, shard_group=16, nics_per_gpu=2).shard_gb_per_s == 192.0


def test_job_links_a_context_parallel_group_across_nodes():
    # cp 4 at tp 4 in nodes of 8: two cp ranks a node, two NICs' busbw; a pipeline send keeps one NIC's line rate
    found = comm.job_links(H100, tp=4, cp=4, pp_stride=16, gpus_per_node=8, nics_per_gpu=1)
    assert found["cp"].gb_per_s == 96.0 and found["network"].gb_per_s == 50.0
    assert comm.job_links(H100, tp=8, cp=2, pp_stride=16, gpus_per_node=8, nics_per_gpu=1)["cp"].gb_per_s == 48.0


def test_a_job_across_nodes_on_the_command_line():
    # torchtitan's LLaMA 3 8B, FSDP over 16 H100s in nodes of 4: 4 ranks a node bring 4 NICs, 4 x 48 = 192 GB/s (one
    # NIC's 48 before); its replicas are one group of 16, no second level
    out = run_ok("evaluate", "--from-torchtitan", CONFIGS / "torchtitan_llama3_8b.toml", "--gpus", "16",
                 "--gpu", "h100", "--gpus-per-node", "4", "--json").stdout
    said = " ".join(json.loads(out)["notes"])
    assert "shard group of 16 x TP 1 over the network, 4 NIC(s) a node" in said
    assert "shard group reduces at 192 GB/s" in said


def test_a_pipeline_send_inside_a_node_runs_at_nccls_effective_nvlink_rate():
    # NCCL's send and receive over an H100 SXM's 18 NVLink 4 links: 18 x SM90_NVLINK_BW 20.6 = 370.8 GB/s, not the
    # 450 line rate; a B200's 18 NVLink 5: 18 x 40.1 = 721.8; the H100 PCIe (no NVLink) keeps its link
    found = comm.job_links(H100, tp=1, cp=1, pp_stride=2, gpus_per_node=8, nics_per_gpu=1)
    assert found["node"].gb_per_s == 370.8 and found["pp"].gb_per_s == 370.8
    assert found["node"].step_latency_ms == comm.node_link(450.0).step_latency_ms  # NVLink's step, as before
    # one 64 MiB activation (T15's 8192 tokens x hidden 4096, bf16): its bytes at 370.8 GB/s plus NCCL's latency
    ms = comm.send_ms(8192 * 4096 * 2, found["node"])
    assert ms == pytest.approx(comm.ring_latency_ms("send", 2, found["node"]) + 67108864 / 370.8e9 * 1e3)
    b200 = comm.job_links(gpus.GPUS["b200"], tp=1, cp=1, pp_stride=1, gpus_per_node=8, nics_per_gpu=1)
    assert b200["node"].gb_per_s == 721.8
    pcie = gpus.GPUS["h100-pcie"]
    assert comm.job_links(pcie, tp=1, cp=1, pp_stride=1, gpus_per_node=8, nics_per_gpu=1)["node"].gb_per_s == \
        pcie.node_link_gb_per_s
    assert found["network"].gb_per_s == 50.0  # across nodes a send keeps one NIC's line rate
