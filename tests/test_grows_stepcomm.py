"""The step's scalar all-reduces (planner/cost/stepcomm.py): which Megatron-LM makes under which flags, over which
group, each at NCCL's Ring/Simple latency where the launch forces it, as the functional tests do (base 8.4 µs + 2(n-1)
steps of 3.4 µs over NVLink, 14.0 each step crossing the network), once a step on the embedding's stage; NCCL's
tuner's pick without it: tests/test_e2host_nccltuner.py."""

from __future__ import annotations

import pytest

from planner.cost import runtimes, stepcomm, terms
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

MODEL = FileRef(file="arch:test", sha256="0" * 64)
GPT = archs.Arch(name="tiny-gpt", hidden_size=64, intermediate_size=256, num_layers=1, num_heads=4, num_kv_heads=4,
                 vocab_size=128, style="gpt", tie_word_embeddings=True, max_position_embeddings=32)
NVLINK = {"tp_gb_per_s": 350.0, "tp_step_latency_ms": 3.4e-3, "collective_latency_ms": 8.4e-3}


def _us(ranks: int, step_us: float = 3.4) -> float:  # NCCL's ring all-reduce latency by hand, in µs
    return 8.4 + 2 * (ranks - 1) * step_us


def _setup(*, tp=1, dp=1, cp=1, stages=1, zero=0, runtime="megatron", gpus_per_node=8, links=True,
           nccl_ring_simple=True, **training):
    comm = {"tp": tp, "cp": cp, "gpus_per_node": gpus_per_node, **(NVLINK if links else {})}
    return TrainSetup(stages=stages, microbatches=stages, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      precision="bf16-mixed", runtime=runtime, comm=comm, data_parallel={"dp": dp, "zero": zero},
                      nccl_ring_simple=nccl_ring_simple and runtime == "megatron", **training)


def _ms(setup) -> dict[str, float]:
    return {what: ms * 1e3 for what, _, ms in stepcomm.step_collectives(setup)}  # µs


def test_megatrons_record_lists_the_norms_and_counts():
    listed = runtimes.of(_setup().training).step_collectives
    assert [group for _, group, _ in listed] == ["grad_stats", "grad_stats", "dp_cp", "dp_cp", "expert_dp",
                                                 "expert_dp", "model_parallel", "dp_cp"]
    assert runtimes.of(_setup(runtime="torchtitan").training).step_collectives == ()


def test_g8s_step_by_hand():
    """TP 4 x DP 2, distributed optimizer, both logging flags (row G8): the norm and count_zeros over the world of 8,
    the params norm's four sums over DP 2 and one over the model-parallel group of 4."""
    found = _ms(_setup(tp=4, dp=2, zero=1, log_params_norm=True, log_num_zeros_in_grad=True))
    assert found["gradient norm"] == pytest.approx(_us(8), rel=1e-6)  # 56.0 µs
    assert found["count_zeros"] == pytest.approx(_us(8), rel=1e-6)
    assert found["params norm, sharded"] == pytest.approx(_us(2), rel=1e-6)  # 15.2 µs
    assert found["params norm, expert sharded (GTP)"] == pytest.approx(_us(2), rel=1e-6)
    assert found["params norm, model parallel"] == pytest.approx(_us(4), rel=1e-6)  # 28.8 µs
    assert sum(found.values()) == pytest.approx(2 * 56.0 + 4 * 15.2 + 28.8, rel=1e-6)  # 201.6 µs


def test_flags_off_leave_the_gradient_norm_alone():
    assert list(_ms(_setup(tp=4, dp=2, zero=1))) == ["gradient norm"]


def test_fp8_param_gathers_master_cast_all_reduces_its_amaxes_over_dp():
    """--fp8-param-gather: TE v2.9's master cast all-reduces the FP8 weights' packed amaxes over the optimizer's
    data-parallel group once a step (framework-facts §675): TP 4 x DP 2 on one node, ranks 0 and 4, Ring / Simple's
    latency over 2 ranks (15.2 µs); none without the flag."""
    found = _ms(_setup(tp=4, dp=2, zero=1, float8=True, fp8_current_scaling=True, fp8_all_gather=True))
    assert found == pytest.approx({"gradient norm": _us(8), "FP8 weights' amaxes (master cast)": _us(2)}, rel=1e-6)
    assert list(_ms(_setup(tp=4, dp=2, zero=1, float8=True, fp8_current_scaling=True))) == ["gradient norm"]


def test_without_the_distributed_optimizer_the_norm_runs_over_the_model_parallel_group():
    found = _ms(_setup(tp=1, dp=2, stages=4))  # pp 4 x dp 2: the model-parallel group is the 4 pipeline ranks
    assert found["gradient norm"] == pytest.approx(_us(4), rel=1e-6)
    assert _ms(_setup(tp=1, dp=8)) == {"gradient norm": 0.0}  # a model-parallel group of one rank: nothing


def test_context_parallel_ranks_are_in_the_setups_dp():
    """TP 2 x CP 2 x PP 2 on 8 GPUs (row G7): the setup's dp is Megatron's dp x cp = 2 (with_context_parallel), the
    world 8, the model-parallel group 4 ranks spanning ranks 0-5 of one node."""
    found = _ms(_setup(tp=2, cp=2, dp=2, stages=2, log_params_norm=True, log_num_zeros_in_grad=True))
    assert found["gradient norm"] == pytest.approx(_us(4), rel=1e-6)  # 28.8 µs
    assert found["params norm, sharded"] == pytest.approx(_us(2), rel=1e-6)
    assert sum(found.values()) == pytest.approx(3 * 28.8 + 4 * 15.2, rel=1e-6)  # 147.2 µs
    assert stepcomm.group_ranks("world", _setup(tp=2, cp=2, dp=2, stages=2)) == (8, 8)


def test_a_group_spanning_nodes_pays_the_networks_step():
    """8 ranks on 2 nodes of 4: of the ring's 14 steps 2(nodes-1) = 2 cross the network (14.0 µs), the other 12
    stay in a node at max(NVLink's 3.4, 3 x the host's 1.0 µs network overhead under Simple)."""
    found = _ms(_setup(tp=4, dp=2, zero=1, gpus_per_node=4))
    assert found["gradient norm"] == pytest.approx(8.4 + 12 * 3.4 + 2 * 14.0, rel=1e-6)  # 77.2 µs
    assert stepcomm.group_ranks("dp_cp", _setup(tp=4, dp=2, zero=1)) == (2, 5)  # ranks 0 and 4: one node of 8


def test_no_links_no_charge_and_only_the_embedding_carries_it():
    assert stepcomm.step_collectives(_setup(tp=4, dp=2, zero=1, links=False)) == []
    profile = analytic.analytic_profile(GPT, Shape(seq_len=32, micro_batch_size=1), gpu=archs.gpu("h100"), model=MODEL)
    embedding, block = layer_costs(profile)[:2]
    setup = _setup(tp=4, dp=2, zero=1, log_params_norm=True)
    assert stepcomm.step_collectives_ms(block, setup) == 0.0
    assert stepcomm.step_collectives_ms(embedding, setup) == pytest.approx((2 * 56.0 - 56.0 + 4 * 15.2 + 28.8) / 1e3,
                                                                          rel=1e-6)
    term = next(t for t in terms.TERMS if t.name.startswith("the step's scalar all-reduces"))
    assert term.quantity == "step" and term.where == "layer"
