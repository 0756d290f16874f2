"""NCCL's latency model and its tuner's pick for the step's scalar all-reduces (planner/cost/nccltuner.py,
planner/cost/stepcomm.py; NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc), and the launch that forces Ring / Simple
(Megatron-LM's functional tests' _run_training.sh, read by the Megatron reader as the setting nccl_ring_simple)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from fixtures.tiny_gpt2 import tiny_gpt2_profile

from planner.cli import cli
from planner.cost import nccltuner, stepcomm
from planner.models.configs import megatron
from planner.models.configs.megatron_flags import launch_forces_ring_simple
from planner.schema import TrainSetup

ROOT = Path(__file__).resolve().parents[1]
NVLINK = {"tp_gb_per_s": 350.0, "tp_step_latency_ms": 3.4e-3, "collective_latency_ms": 8.4e-3}


def _setup(*, tp=1, dp=1, stages=1, zero=1, gpus_per_node=8, pcie=False, **training):
    links = dict(NVLINK, tp_step_latency_ms=5.7e-3) if pcie else NVLINK
    return TrainSetup(stages=stages, microbatches=stages, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime="megatron", comm={"tp": tp, "gpus_per_node": gpus_per_node,
                                                                         **links},
                      data_parallel={"dp": dp, "zero": zero}, **training)


def test_one_nodes_latencies_by_hand():
    """8 ranks on one NVLink node: Ring / LL 6.6 + 14 x 0.6, Tree / LL 6.8 + 2 x 7 x 0.6, Ring / Simple 8.4 + 14 x 3.4,
    Tree / LL128 14.0 + 2 x 7 x 1.25; the tuner keeps Ring / LL."""
    assert nccltuner.all_reduce_latency_us("Ring", "LL", 8, 1) == pytest.approx(15.0)
    assert nccltuner.all_reduce_latency_us("Tree", "LL", 8, 1) == pytest.approx(15.2)
    assert nccltuner.all_reduce_latency_us("Ring", "Simple", 8, 1) == pytest.approx(56.0)
    assert nccltuner.all_reduce_latency_us("Tree", "LL128", 8, 1) == pytest.approx(31.5)
    assert nccltuner.tuned_all_reduce(8, 1) == ("Ring", "LL", pytest.approx(15.0))
    assert nccltuner.tuned_all_reduce(8, 1, "pcie") == ("Ring", "LL", pytest.approx(6.6 + 14 * 1.0))
    assert nccltuner.tuned_all_reduce(1, 1)[2] == 0.0


def test_across_nodes_the_tree_wins():
    """1,024 ranks on 128 nodes of 8 (row B4's world): Tree / LL 6.8 + 2 (7 x 0.6 + log2 128 x 5.0) = 85.2 µs; Ring /
    Simple 8.4 + (2046 - 254) x max(3.4, 3 x 1.0) + 254 x 14.0 = 9,657.2 µs."""
    assert nccltuner.tuned_all_reduce(1024, 128) == ("Tree", "LL", pytest.approx(85.2))
    assert nccltuner.all_reduce_latency_us("Ring", "Simple", 1024, 128) == pytest.approx(9657.2)
    # Ring / LL across nodes: the 1.0 µs network overhead (not x3) above NVLink's 0.6 in a node
    assert nccltuner.all_reduce_latency_us("Ring", "LL", 16, 2) == pytest.approx(6.6 + 28 * 1.0 + 2 * 2.7)


def test_one_rank_a_node_takes_the_trees_network_figure():
    """ppn = 1 (16 ranks on 16 nodes): every ring step crosses the network at the Tree's LL figure 5.0 (not the
    Ring's 2.7); the tree's in-node term is nil."""
    assert nccltuner.all_reduce_latency_us("Ring", "LL", 16, 16) == pytest.approx(6.6 + 30 * 5.0)
    assert nccltuner.all_reduce_latency_us("Tree", "LL", 16, 16) == pytest.approx(6.8 + 2 * 4 * 5.0)


def test_unknown_algorithm_refused():
    with pytest.raises(ValueError, match="CollNetDirect"):
        nccltuner.all_reduce_latency_us("CollNetDirect", "Simple", 8, 1)


def test_stepcomm_charges_the_tuners_pick_unless_forced():
    world = _setup(tp=8, dp=128, zero=1)  # 1,024 ranks, a distributed optimizer: the norm over the world
    assert stepcomm.group_nodes("world", world) == 128
    (what, ranks, ms), = stepcomm.step_collectives(world)
    assert (what, ranks) == ("gradient norm", 1024) and ms == pytest.approx(85.2e-3)
    forced = _setup(tp=8, dp=128, zero=1, nccl_ring_simple=True)
    assert stepcomm.step_collectives(forced)[0][2] == pytest.approx(9657.2e-3)
    assert stepcomm.scalar_all_reduce(8, 1, _setup(tp=8)) == ("Ring", "LL", pytest.approx(15.0e-3))
    assert stepcomm.scalar_all_reduce(8, 1, _setup(tp=8, pcie=True))[2] == pytest.approx(20.6e-3)


def test_a_groups_nodes_are_those_its_ranks_lie_on():
    setup = _setup(tp=4, dp=2, stages=2, zero=0)  # model parallel: ranks 0-3 and 8-11; nodes of 8
    assert stepcomm.group_positions("model_parallel", setup) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert stepcomm.group_nodes("model_parallel", setup) == 2
    assert stepcomm.group_nodes("dp_cp", setup) == 1  # ranks 0 and 4
    assert stepcomm.group_ranks("model_parallel", setup) == (8, 12)


def test_the_functional_tests_force_ring_simple():
    """_run_training.sh exports NCCL_ALGO=Ring and NCCL_PROTO=simple before a test's ENV_VARS, which may override."""
    assert launch_forces_ring_simple({"ENV_VARS": {"CUDA_DEVICE_MAX_CONNECTIONS": 1}, "MODEL_ARGS": {}})
    assert launch_forces_ring_simple({"ENV_VARS": {"NCCL_ALGO": "Ring"}, "MODEL_ARGS": {}})
    assert not launch_forces_ring_simple({"ENV_VARS": {"NCCL_PROTO": "LL"}, "MODEL_ARGS": {}})
    assert not launch_forces_ring_simple({"ENV_VARS": {"NCCL_ALGO": "Tree"}, "MODEL_ARGS": {}})
    assert not launch_forces_ring_simple({"MODEL_ARGS": {}})  # no ENV_VARS: no functional test's launch
    assert not launch_forces_ring_simple(["not", "a", "mapping"])


@pytest.mark.parametrize("name, forced", [("configs/megatron-lm/gpt3_mcore_te_tp2_pp2_cp2.yaml", True),
                                          ("configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml", True),
                                          ("configs/megatron-bridge/h100_405b_fp8cs.yaml", False)])
def test_the_reader_sets_the_launchs_protocol(name, forced):
    job = megatron.read(ROOT / name)
    assert job.modelled.nccl_ring_simple is forced


def test_other_runtimes_refuse_the_setting(tmp_path):
    path = tiny_gpt2_profile(tmp_path, "h100")
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--runtime", "torchtitan", "--nccl-ring-simple"])
    assert result.exit_code != 0
    assert "--nccl-ring-simple" in result.output and "--runtime megatron" in result.output
    assert "Traceback" not in result.output


def test_search_compare_says_a_forced_protocol_the_search_did_not_score():
    from planner.commands.search_compare import _settings_unsaid

    job = megatron.read(ROOT / "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml")
    said = _settings_unsaid(job.modelled, {"log_params_norm": job.modelled.log_params_norm,
                                           "log_num_zeros_in_grad": job.modelled.log_num_zeros_in_grad,
                                           "deterministic": job.modelled.deterministic,
                                           "unfused_grad_accumulation": job.modelled.unfused_grad_accumulation,
                                           "runtime_version": job.modelled.runtime_version})
    assert "NCCL's Ring / Simple forced on (scored off, as the search)" in said


def test_the_megatron_export_says_the_forced_ring_simple_it_was_scored_with():
    from planner.emit import megatron as emit_megatron

    forced = _setup(tp=8, dp=2, zero=1, nccl_ring_simple=True)
    tuned = _setup(tp=8, dp=2, zero=1)
    said = [line for line in emit_megatron._test_settings(forced.training) if "NCCL_ALGO=Ring NCCL_PROTO=simple" in line]
    assert len(said) == 1 and said[0].startswith("#")
    assert not any("NCCL_ALGO" in line for line in emit_megatron._test_settings(tuned.training))
