"""NCCL's ring latency for a group across nodes with several ranks in each (comm.ring_latency_ms): of the ring's
steps, only tuning.cc's nInterSteps at the network's 14.0 µs, the rest at the node's step (docs/framework-facts.md
§208). Hand counts: base 8.4 µs; NVLink 3.4, PCI 5.7, network 14.0 a step; the network post overhead 3 x 1.0 µs."""

import pytest

from planner.cost import comm, contextparallel, links, nccltuner
from planner.schema import CommSetup

US = 1e-3
INSIDE, PCIE = comm.node_link(450.0), comm.node_link(64.0, pcie=True)
BETWEEN = comm.network_link(50.0, 1.0)


def latency_us(kind, ranks, stride, inside=INSIDE, per_node=8):
    return comm.ring_latency_ms(kind, ranks, comm.group_link(ranks, stride, per_node, inside, BETWEEN)) / US


@pytest.mark.parametrize(("kind", "ranks", "stride", "expected"), [
    # one node: every step at NVLink's 3.4 (unchanged)
    ("all-reduce", 8, 1, 8.4 + 14 * 3.4), ("all-gather", 8, 1, 8.4 + 7 * 3.4), ("reduce-scatter", 4, 2, 8.4 + 3 * 3.4),
    # one rank a node (4 ranks 8 apart): every step crosses (unchanged)
    ("all-reduce", 4, 8, 8.4 + 6 * 14.0), ("all-gather", 4, 8, 8.4 + 3 * 14.0), ("reduce-scatter", 4, 8, 8.4 + 3 * 14.0),
    # 4 ranks 4 apart: 2 nodes of 2; an all-reduce's 6 steps, 2(2-1) across; a gather's 3, 1 across
    ("all-reduce", 4, 4, 8.4 + 4 * 3.4 + 2 * 14.0), ("all-gather", 4, 4, 8.4 + 2 * 3.4 + 14.0),
    ("reduce-scatter", 4, 4, 8.4 + 2 * 3.4 + 14.0),
    # 16 adjacent ranks: 2 nodes of 8; 30 steps, 2 across; 15 steps, 1 across
    ("all-reduce", 16, 1, 8.4 + 28 * 3.4 + 2 * 14.0), ("all-gather", 16, 1, 8.4 + 14 * 3.4 + 14.0),
    # 32 ranks 2 apart: 8 nodes of 4; 62 steps, 14 across; 31 steps, 7 across
    ("all-reduce", 32, 2, 8.4 + 48 * 3.4 + 14 * 14.0), ("reduce-scatter", 32, 2, 8.4 + 24 * 3.4 + 7 * 14.0),
])
def test_ring_steps_in_a_node_at_the_nodes_latency(kind, ranks, stride, expected):
    assert latency_us(kind, ranks, stride) == pytest.approx(expected)


def test_pcie_nodes_step_and_the_network_post_overhead():
    # PCI's 5.7 µs a step inside a node; a node step under the 3 µs overhead is charged the overhead
    assert latency_us("all-reduce", 4, 4, PCIE) == pytest.approx(8.4 + 4 * 5.7 + 2 * 14.0)
    slow_inside = comm.Link(450.0, 1.0 * US, 8.4 * US)
    assert latency_us("all-reduce", 4, 4, slow_inside) == pytest.approx(8.4 + 4 * 3.0 + 2 * 14.0)


def test_what_the_ring_model_does_not_cover_keeps_the_links_step():
    # an all-to-all (grouped sends), a send, and a network link naming no node step (plans made before)
    assert latency_us("all-to-all", 4, 4) == pytest.approx(8.4 + 3 * 14.0)
    assert comm.ring_latency_ms("send", 2, comm.group_link(2, 8, 8, INSIDE, BETWEEN)) / US == pytest.approx(8.4 + 14.0)
    assert comm.ring_latency_ms("all-reduce", 4, comm.Link(50.0, 14.0 * US, 8.4 * US, nodes=2)) / US == \
        pytest.approx(8.4 + 6 * 14.0)


def test_the_same_as_nccltuners_ring_simple_all_reduce():
    for ranks, stride in ((4, 4), (16, 1), (32, 2), (4, 8), (8, 1)):
        nodes = comm.group_nodes(ranks, stride, 8)
        assert latency_us("all-reduce", ranks, stride) == pytest.approx(
            nccltuner.all_reduce_latency_us("Ring", "Simple", ranks, nodes))


def test_inter_steps_by_version():
    assert nccltuner.ring_inter_steps("all-reduce", 16, 2) == 2
    assert nccltuner.ring_inter_steps("all-reduce", 16, 2, nccltuner.V2_21) == 4
    assert nccltuner.ring_inter_steps("all-gather", 16, 2, nccltuner.V2_21) == 1
    assert nccltuner.ring_inter_steps("reduce-scatter", 16, 1) == 0
    assert links.ring_latency_us("all-reduce", 4, 2) == pytest.approx(8.4 + 2 * 3.4 + 4 * 14.0)  # v2.21.5: 2 x nodes
    with pytest.raises(ValueError):
        nccltuner.ring_inter_steps("all-to-all", 4, 2)


def test_a_setups_tp_and_cp_links_span_their_nodes():
    setup_comm = CommSetup(tp=16, tp_gb_per_s=50.0, tp_step_latency_ms=14.0 * US, collective_latency_ms=8.4 * US,
                           node_step_latency_ms=3.4 * US, cp=4, cp_gb_per_s=50.0, cp_step_latency_ms=14.0 * US,
                           gpus_per_node=8)
    tp = comm.tp_link(setup_comm)
    assert (tp.nodes, tp.node_step_latency_ms) == (2, 3.4 * US)
    assert comm.collective_ms("all-gather", 1.0, 16, tp) / US == pytest.approx(8.4 + 14 * 3.4 + 14.0, abs=1e-3)

    class Setup:
        comm = setup_comm

    cp = contextparallel.cp_link(Setup)
    assert cp.nodes == 4  # 4 ranks 16 apart: one a node
    assert comm.ring_latency_ms("all-gather", 4, cp) / US == pytest.approx(8.4 + 3 * 14.0)


def test_job_links_name_the_nodes_and_the_node_step():
    from planner.models import gpus

    gpu = gpus.gpu("h100")
    made = comm.job_links(gpu, tp=16, cp=2, pp_stride=32, gpus_per_node=8, nics_per_gpu=1.0)
    assert (made["tp"].nodes, made["tp"].node_step_latency_ms) == (2, pytest.approx(3.4 * US))
    assert made["cp"].nodes == 2 and made["cp"].node_step_latency_ms is not None  # 2 ranks 16 apart
    small = comm.job_links(gpu, tp=4, cp=2, pp_stride=8, gpus_per_node=8, nics_per_gpu=1.0)
    assert small["tp"].nodes == 1 and small["cp"].nodes == 1


def test_a_tensor_parallel_group_wider_than_the_node_is_evaluated():
    """TP 4 on hosts of 2 GPUs: the group spans 2 nodes; links.default_links asked the all-to-all rate of a one-rank
    expert group (no expert parallelism) and divided by zero."""
    from click.testing import CliRunner

    from planner.cli import cli

    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron",
                                      "configs/megatron-lm/gpt3_7b_tp4_pp1_memory_speed.yaml", "--gpus", "8",
                                      "--gpu", "h100", "--gpus-per-node", "2"])
    assert result.exit_code == 0, result.output
    assert "tensor-parallel 4 collectives at" in result.output and "(network)" in result.output
