"""Transformer Engine's userbuffers SMs under --tp-comm-overlap (planner/cost/ub_sms.py, framework-facts §137): each
overlapped GEMM loses num_sm x T / S of work to its collective where the method runs on SMs (pipeline, bulk, a ring
exchange's margin), none for a ring exchange's copy-engine copies; by hand on a block's eight collectives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.commands.comm_setup import _userbuffers
from planner.cost import comm, ub_sms
from planner.cost.layers import LayerCost
from planner.errors import UserError
from planner.models.archs import gpu
from planner.models.configs.megatron import from_pairs
from planner.schema import LayerCollective, TrainSetup

H100_70B = "userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192"
EIGHT = [1.0] * 8  # each of a block's eight collectives 1 ms (site order: 4 forward, 4 backward)


def test_which_methods_take_sms():
    assert ub_sms.Overlap("ring_exchange", 1, False).sms == 0  # copy engines (use_ce)
    assert ub_sms.Overlap("ring_exchange", 1, True).sms == 1  # the GEMM's one-SM margin
    assert ub_sms.Overlap("pipeline", 16, True).sms == 16
    assert ub_sms.Overlap("bulk", 24, False).sms == 24


def test_bridges_h100_70b_config_by_hand():
    # forward: qkv_fprop, fc1_fprop ring exchanges (0); proj_fprop, fc2_fprop ring exchanges with a one-SM margin
    assert ub_sms.lost_sm_ms(EIGHT, "fwd", config=H100_70B, sms=132) == pytest.approx(2 / 132, rel=1e-12)
    assert ub_sms.lost_sm_ms(EIGHT, "recompute", config=H100_70B, sms=132) == pytest.approx(2 / 132, rel=1e-12)
    # backward: proj_dgrad, fc2_dgrad ring (0); qkv_wgrad 24, fc1_wgrad 4 on the listed scatters; the unlisted bulk
    # gathers qkv_dgrad 4 and fc1_dgrad 2 at the forward gathers' 1 ms
    assert ub_sms.lost_sm_ms(EIGHT, "bwd", config=H100_70B, sms=132) == pytest.approx((24 + 4 + 4 + 2) / 132,
                                                                                      rel=1e-12)


def test_te_defaults_by_hand():
    # TE v2.9 get_default_config: pipeline 16 (proj_fprop, fc2_fprop), bulk 16 (four), ring exchange 0
    times = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert ub_sms.lost_sm_ms(times, "fwd", config=None, sms=132) == pytest.approx(16 * (2 + 4) / 132, rel=1e-12)
    # bwd: qkv_wgrad (6 ms), fc1_wgrad (8 ms), the unlisted gathers at the forward gathers' 1 and 3 ms
    assert ub_sms.lost_sm_ms(times, "bwd", config=None, sms=132) == pytest.approx(16 * (6 + 8 + 1 + 3) / 132,
                                                                                  rel=1e-12)
    assert ub_sms.lost_sm_ms(times[:2], "bwd", config=None, sms=132) == 0.0  # not a dense block's eight
    assert ub_sms.lost_sm_ms(times, "bwd", config=None, sms=0) == 0.0


def _block(kind: str = "decoder_block") -> LayerCost:
    sites = [LayerCollective(kind=k, tensor_bytes=64 << 20, fwd=1, recompute=1) for k in ("all-gather",
                                                                                       "reduce-scatter") * 2]
    sites += [LayerCollective(kind=k, tensor_bytes=64 << 20, bwd=1) for k in ("all-gather", "reduce-scatter") * 2]
    return LayerCost(name="layers.0", kind=kind, fwd_ms=100.0, bwd_ms=200.0, act_bytes=0, input_bytes=0,
                     output_bytes=0, input_in_act_bytes=0, param_count=1, transient_bytes=0,
                     collectives=[(c.kind, c.tensor_bytes, c.fwd, c.bwd, c.recompute, None) for c in sites])


def _setup(**comm_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=4, tp_gb_per_s=100.0, tp_overlap="tp-comm-overlap", **comm_fields))


def test_a_hidden_pass_costs_the_sms_its_collectives_take():
    layer = _block()
    one = comm.collective_ms("all-gather", 64 << 20, 4, comm.tp_link(_setup().comm))  # each collective's ms
    assert one == comm.collective_ms("reduce-scatter", 64 << 20, 4, comm.tp_link(_setup().comm))
    # the compute (100 ms forward, 200 backward) outlasts the collectives: each pass adds what its GEMMs lose
    charged = comm.layer_comm_ms(layer, 0, _setup(gpu_sms=132, ub_cfg=H100_70B))
    assert charged == pytest.approx(one * (2 + 34) / 132, rel=1e-12)
    assert comm.layer_comm_ms(layer, 1, _setup(gpu_sms=132, ub_cfg=H100_70B)) == pytest.approx(
        one * (2 + 34 + 2) / 132, rel=1e-12)  # a full recompute reruns the forward's
    assert comm.layer_comm_ms(layer, 0, _setup()) == 0.0  # no SMs known: nothing charged, as before
    assert comm.layer_comm_ms(_block("moe_block"), 0, _setup(gpu_sms=132)) == 0.0  # not TE's dense block


def test_the_config_is_read_by_name_and_refused_otherwise():
    base = [("--num-layers", ["2"]), ("--hidden-size", ["256"]), ("--num-attention-heads", ["4"]),
            ("--seq-length", ["128"]), ("--max-position-embeddings", ["128"]), ("--vocab-size", ["1024"]),
            ("--tensor-model-parallel-size", ["2"]), ("--sequence-parallel", []), ("--tp-comm-overlap", []),
            ("--tp-comm-overlap-cfg", [H100_70B])]
    job = from_pairs(base, "job.sh")
    assert (job.modelled.tp_overlap, job.modelled.ub_cfg) == ("tp-comm-overlap", H100_70B)
    h100 = gpu("h100-sxm")
    assert _userbuffers(h100, SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg=H100_70B)) == \
        {"ub_cfg": H100_70B, "gpu_sms": 132, "ub_reduce_gb_per_s": pytest.approx(3.35 * 0.922 * 1e3),
         "tp_copy_gb_per_s": 371.6}  # the ring exchange's peer copies (planner/cost/ub_ring.py)
    with pytest.raises(UserError, match="is neither a YAML file nor one of Megatron-Bridge"):
        _userbuffers(h100, SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg="ub.yaml"))
    with pytest.raises(UserError, match="run only under --tp-comm-overlap"):
        _userbuffers(h100, SimpleNamespace(tp_overlap="none", ub_cfg=H100_70B))
