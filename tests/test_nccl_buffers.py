"""NCCL's buffers per communicator (planner/cost/nccl_buffers.py): hand counts from NCCL v2.27.7's constants."""

from types import SimpleNamespace

import pytest

from planner.cost import nccl_buffers as nb

MIB = 1 << 20
A100, H100, GB200 = nb.NCCL_GPUS["a100-80g"], nb.NCCL_GPUS["h100-sxm"], nb.NCCL_GPUS["gb200"]


def test_the_protocols_buffers_are_nccls_defaults():
    assert nb.LL_BYTES == 512 * 1024  # 8 lines x 512 threads x 8 steps x 16 B
    assert nb.LL128_BYTES == 4_915_200  # 120 x 640 x 8 x 8 B = 4.6875 MiB
    assert nb.SIMPLE_BYTES == 4 * MIB


def test_a_channels_connection_is_12_mib_written_or_read():
    # write (H100): receive LL + LL128 + Simple + head = 9.19 MiB -> 10 MiB, send head -> 2 MiB (nccl#1685's log)
    assert nb.connection_bytes(H100) == 10 * MIB + 2 * MIB
    # read (A100 over NVLink): receive LL + LL128 + head -> 6 MiB, send Simple + head -> 6 MiB
    assert nb.connection_bytes(A100) == 6 * MIB + 6 * MIB


@pytest.mark.parametrize("gpu, rings", [(A100, 24), (H100, 24), (GB200, 32)])
def test_ring_channels_by_gpu(gpu, rings):
    # A100 240 GB/s / 40 = 6, H100 370.8 / 60 = 6, GB200 721.8 / 90 = 8; doubled by the search (speed >= 50) and
    # again by ncclTopoPostset
    assert nb.ring_channels(gpu) == rings
    assert nb.p2p_channels_per_peer(gpu) == 32  # pow2Up(min(rings, 2 x NVLinks)); nccl#1685: 32 on H100


def test_nvls_only_where_multicast_and_more_than_two_gpus():
    assert nb.nvls_bytes(A100, 8, 8) == 0
    assert nb.nvls_bytes(H100, 2, 8) == 0
    # 16 channels x 2 x (128 KiB x 8 steps) x 8 heads, and the credits (16 x 2 x 64 B x 8) in one 2 MiB granule
    assert nb.nvls_bytes(H100, 8, 8) == 16 * 2 * MIB * 8 + 2 * MIB
    assert nb.nvls_bytes(GB200, 8, 72) == 24 * 2 * MIB * 8 + 2 * MIB  # one NVLink domain: 24 channels
    assert nb.nvls_bytes(GB200, 144, 72) == 32 * 2 * MIB * 32 + 2 * MIB  # across domains: 32 channels, heads <= 32
    assert nb.nvls_bytes(H100, 16, 8, local=2) == 0  # two of the group a node (TP 4 on nodes of 8): no NVLS


def test_communicator_bytes_by_kind():
    assert nb.communicator_bytes(nb.Communicator("tp", 1), H100, domain=8) == 0
    assert nb.communicator_bytes(nb.Communicator("pp", 2, "p2p"), GB200, domain=72) == 32 * 12 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 2), H100, domain=8) == 24 * 12 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 8), GB200, domain=72) == 32 * 12 * MIB + 386 * MIB
    # no NCCL GPU known: NVIDIA/nccl#964's measurement
    assert nb.communicator_bytes(nb.Communicator("dp", 2), None, domain=8) == 544 * MIB
    assert nb.communicator_bytes(nb.Communicator("dp", 4), None, domain=8) == 688 * MIB


def test_nccl_964s_setup_the_difference_is_the_trees_and_256_mib_is_not_ncclbuffers():
    """nccl#964 (4 A100s over NVLink, NCCL 2.18 connecting ring and tree at init): 544 MiB a pair, 688 MiB a group
    of four. The buffers read from the code give 288 MiB (24 channels x 12 MiB) and 432 MiB (+ the tree's receive
    end, 24 x 6 MiB): the measured difference (144 MiB) is exactly the tree's; the 256 MiB both carry is no
    connection buffer (docs/framework-facts.md §115)."""
    pair, four = nb.eager_ring_tree_bytes(A100, 2), nb.eager_ring_tree_bytes(A100, 4)
    assert (pair, four) == (288 * MIB, 432 * MIB)
    assert four - pair == nb.MEASURED_GROUP_BYTES - nb.MEASURED_PAIR_BYTES
    assert nb.MEASURED_PAIR_BYTES - pair == nb.MEASURED_GROUP_BYTES - four == 256 * MIB


def _setup(stages, dp=1, shard=None, ep=1, chunks=1, node=8):
    return SimpleNamespace(pipeline=SimpleNamespace(stages=stages, chunks=chunks),
                           data_parallel=SimpleNamespace(dp=dp, shard_group=shard, ep=ep),
                           comm=SimpleNamespace(gpus_per_node=node, domain=node, pp_stride=0))


def _profile(gpu="h100-sxm", tp=1, experts=False):
    return SimpleNamespace(assumptions={"gpu": gpu, "tp": tp},
                           layers=[SimpleNamespace(expert_param_count=10 if experts else 0)],
                           device=SimpleNamespace(type="cuda", name=gpu))


def test_a_ranks_communicators():
    names = [c.name for c in nb.rank_communicators(1, _setup(4, dp=8, shard=4, ep=2), _profile(tp=2, experts=True))]
    assert names == ["pp-peer-0", "pp-peer-1", "dp-shard", "dp-replica", "ep", "expert-dp", "tp"]
    assert [c.name for c in nb.rank_communicators(0, _setup(1), _profile())] == []  # one rank: no NCCL
    assert len(nb.rank_communicators(0, _setup(4, chunks=2), _profile())) == 2  # chunks: both neighbours


def test_rank_buffers_on_gb200():
    got = nb.rank_buffers(0, _setup(2, dp=8, node=72), _profile("gb200", tp=4))
    assert got == {"pp-peer-0": 32 * 12 * MIB, "dp": 32 * 12 * MIB + 386 * MIB,
                   "tp": 32 * 12 * MIB + 24 * 2 * MIB * 4 + 2 * MIB}


def test_megatrons_further_communicators():
    setup = _setup(4, dp=2)
    setup.training, setup.comm.cp = SimpleNamespace(runtime="megatron"), 2
    comms = nb.rank_communicators(0, setup, _profile(tp=2))
    assert [(c.name, c.ranks, c.kind) for c in comms] == [
        ("pp-peer-0", 2, "p2p"), ("dp", 2, "collective"), ("tp", 2, "collective"), ("world", 32, "small"),
        ("model-parallel", 8, "small"), ("cp-peer-0", 2, "p2p")]
    setup.training = SimpleNamespace(runtime="torchtitan")
    assert [c.name for c in nb.rank_communicators(0, setup, _profile(tp=2))] == ["pp-peer-0", "dp", "tp"]


def test_a_pipeline_peer_in_another_node_takes_two_channels():
    setup = _setup(2, dp=8, node=8)
    setup.comm.pp_stride = 8  # stage 0 on GPUs 0-7, stage 1 on 8-15: the edge crosses
    comms = nb.rank_communicators(0, setup, _profile())
    assert comms[0] == nb.Communicator("pp-peer-0", 2, "p2p-net")
    assert nb.communicator_bytes(comms[0], H100, domain=8) == 2 * 12 * MIB  # min(2, 32) channels
    setup.comm.pp_stride = 4  # GPUs 0-3 send to 4-7: one node
    assert nb.rank_communicators(0, setup, _profile())[0].kind == "p2p"
