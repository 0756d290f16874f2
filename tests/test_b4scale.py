"""TE's reduce kernel after a ring-exchange reduce-scatter under --tp-comm-overlap (planner/cost/ub_sms.py
ring_reduce_bytes, planner/cost/comm.py userbuffers_reduce_ms; docs/framework-facts.md §187): the tp partial chunks
of the GEMM's output read and their sum written, on the pass's path; by hand on a block's eight collectives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner.commands.comm_setup import _userbuffers
from planner.cost import comm, ub_sms
from planner.cost.layers import LayerCost
from planner.models.archs import gpu
from planner.schema import LayerCollective, TrainSetup

H100_405B = "userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192"
MIB = 1 << 20


def _block(tensor_bytes: int, kind: str = "decoder_block") -> LayerCost:
    """A dense block's eight collectives in site order (forward: AG, RS, AG, RS; backward likewise)."""
    sites = [LayerCollective(kind=k, tensor_bytes=tensor_bytes, fwd=1, recompute=1) for k in ("all-gather",
                                                                                          "reduce-scatter") * 2]
    sites += [LayerCollective(kind=k, tensor_bytes=tensor_bytes, bwd=1) for k in ("all-gather", "reduce-scatter") * 2]
    return LayerCost(name="layers.0", kind=kind, fwd_ms=100.0, bwd_ms=200.0, act_bytes=0, input_bytes=0,
                     output_bytes=0, input_in_act_bytes=0, param_count=1, transient_bytes=0,
                     collectives=[(c.kind, c.tensor_bytes, c.fwd, c.bwd, c.recompute, None) for c in sites])


def _setup(tp: int, **comm_fields) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=tp, tp_gb_per_s=100.0, tp_overlap="tp-comm-overlap", **comm_fields))


def test_the_reduce_bytes_by_hand():
    eight = _block(64 * MIB).collectives
    # Bridge's 405B H100 config: proj_fprop and fc2_fprop ring exchanges; each reads 64 MiB (8 chunks of 8 MiB) and
    # writes 8 MiB
    assert ub_sms.ring_reduce_bytes(eight, "fwd", config=H100_405B, tp=8) == 2 * (64 + 8) * MIB
    assert ub_sms.ring_reduce_bytes(eight, "recompute", config=H100_405B, tp=8) == 2 * (64 + 8) * MIB
    assert ub_sms.ring_reduce_bytes(eight, "bwd", config=H100_405B, tp=8) == 0  # the backward's scatters are bulk
    # TE's defaults: proj_fprop and fc2_fprop pipelined, reduced inside the userbuffers kernel
    assert ub_sms.ring_reduce_bytes(eight, "fwd", config=None, tp=8) == 0
    assert ub_sms.ring_reduce_bytes(eight[:2], "fwd", config=H100_405B, tp=8) == 0  # not a dense block's eight
    assert ub_sms.ring_reduce_bytes(eight, "fwd", config=H100_405B, tp=1) == 0


def test_a_files_one_ring_exchange_scatter():
    # Megatron-LM's weekly tp_overlap functional test's file: proj_fprop pipelined, fc2_fprop a ring exchange
    gemms = {name: SimpleNamespace(method=o.method, num_sm=o.num_sm, set_sm_margin=o.set_sm_margin, use_ce=True,
                                   aggregate=False)
             for name, o in ub_sms.TE_DEFAULT.items()}
    gemms["fc2_fprop"] = SimpleNamespace(method="ring_exchange", num_sm=1, set_sm_margin=False, use_ce=True,
                                         aggregate=False)
    eight = _block(64 * MIB).collectives
    assert ub_sms.ring_reduce_bytes(eight, "fwd", config="ub.yaml", tp=2, gemms=gemms) == (64 + 32) * MIB


def test_the_pass_pays_the_reduce_at_the_rate_given():
    layer, rate = _block(64 * MIB), 1000.0  # GB/s
    reduce_ms = 2 * (64 + 8) * MIB / 1e12 * 1e3  # a pass's two kernels at 1 TB/s
    # and the buffers' copies at the same rate (tests/test_fp8cs.py): bf16 shards of 8 MiB, each read and written,
    # two ring-exchange gathers a forward; the backward's two and the two bulk scatters' chunks
    forward_copy_ms, backward_copy_ms = 2 * 16 * MIB / 1e12 * 1e3, 4 * 16 * MIB / 1e12 * 1e3
    without = comm.layer_comm_ms(layer, 0, _setup(8, gpu_sms=132, ub_cfg=H100_405B))
    assert comm.layer_comm_ms(layer, 0, _setup(8, gpu_sms=132, ub_cfg=H100_405B, ub_reduce_gb_per_s=rate)) == \
        pytest.approx(without + reduce_ms + forward_copy_ms + backward_copy_ms, rel=1e-12)
    assert comm.layer_comm_ms(layer, 1, _setup(8, gpu_sms=132, ub_cfg=H100_405B, ub_reduce_gb_per_s=rate)) - \
        comm.layer_comm_ms(layer, 1, _setup(8, gpu_sms=132, ub_cfg=H100_405B)) == pytest.approx(
            2 * reduce_ms + 2 * forward_copy_ms + backward_copy_ms)
    assert comm.userbuffers_reduce_ms(_block(64 * MIB, "moe_block"), "fwd",
                                      _setup(8, ub_cfg=H100_405B, ub_reduce_gb_per_s=rate).comm) == 0.0
    assert comm.userbuffers_reduce_ms(layer, "fwd", _setup(8, ub_cfg=None, ub_reduce_gb_per_s=rate).comm) == 0.0


def test_b4s_block_by_hand():
    # B4: 4,096 tokens a CP rank (8,192 / CP 2) x hidden 16,384 x 2 B = 128 MiB a scatter's partial output, tp 8;
    # H100 SXM's eager elementwise class 0.922 of 3.35 TB/s (Liger-Kernel's sweep, planner/models/membound_published.py)
    fields = _userbuffers(gpu("h100-sxm"), SimpleNamespace(tp_overlap="tp-comm-overlap", ub_cfg=H100_405B))
    assert fields["ub_reduce_gb_per_s"] == pytest.approx(3.35 * 0.922 * 1e3)
    whole = 4096 * 16384 * 2
    setup = _setup(8, **fields)
    assert comm.userbuffers_reduce_ms(_block(whole), "fwd", setup.comm) == pytest.approx(
        2 * whole * 9 / 8 / (3.35 * 0.922 * 1e12) * 1e3)  # 0.0978 ms a block's forward
    assert comm.userbuffers_reduce_ms(_block(whole), "fwd", setup.comm) == pytest.approx(0.09777, abs=1e-5)


# ---------------------------------------------------------------- TE's amax all-reduces under FP8 current scaling


def _fp8_setup(tp: int, *, current: bool = True, float8: bool = True, **training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[80 << 30], runtime="megatron",
                      comm=dict(tp=tp, tp_gb_per_s=100.0, tp_step_latency_ms=3.4e-3),
                      training=dict(float8=float8, fp8_current_scaling=current, **training))


def test_the_amax_all_reduces_by_hand():
    layer = _block(64 * MIB)
    # NCCL v2.27.7's tuner on one node of NVLink: Ring / LL, 6.6 µs + 2 (n - 1) x 0.6 µs (tuning.cc; nccltuner.py)
    tp8, tp4 = 6.6 + 2 * 7 * 0.6, 6.6 + 2 * 3 * 0.6  # 15.0, 10.2 µs
    assert comm.amax_reduce_ms(layer, "fwd", _fp8_setup(8)) == pytest.approx(2 * tp8 / 1e3)
    assert comm.amax_reduce_ms(layer, "bwd", _fp8_setup(4)) == pytest.approx(2 * tp4 / 1e3)
    # Megatron-LM's functional tests force Ring / Simple: 8.4 + 2 (n - 1) x 3.4 µs
    assert comm.amax_reduce_ms(layer, "fwd", _fp8_setup(8, nccl_ring_simple=True)) == pytest.approx(
        2 * (8.4 + 14 * 3.4) / 1e3)
    # the layer's TP term: the collectives unhidden (no overlap) plus four a microbatch, six under full recompute
    plain = comm.layer_comm_ms(layer, 0, _fp8_setup(8, current=False))
    assert comm.layer_comm_ms(layer, 0, _fp8_setup(8)) == pytest.approx(plain + 4 * tp8 / 1e3)
    assert comm.layer_comm_ms(layer, 1, _fp8_setup(8)) - comm.layer_comm_ms(layer, 1, _fp8_setup(8, current=False)) \
        == pytest.approx(6 * tp8 / 1e3)


def test_no_amax_all_reduce_without_its_conditions():
    layer = _block(64 * MIB)
    assert comm.amax_reduce_ms(layer, "fwd", _fp8_setup(8, current=False)) == 0.0  # delayed scaling
    assert comm.amax_reduce_ms(layer, "fwd", _fp8_setup(8, float8=False)) == 0.0
    assert comm.amax_reduce_ms(layer, "fwd", _fp8_setup(1)) == 0.0  # no TP group
    assert comm.amax_reduce_ms(_block(64 * MIB, "moe_block"), "fwd", _fp8_setup(8)) == 0.0
    no_sp = LayerCost(name="layers.0", kind="decoder_block", fwd_ms=1.0, bwd_ms=2.0, act_bytes=0, input_bytes=0,
                      output_bytes=0, input_in_act_bytes=0, param_count=1, transient_bytes=0,
                      collectives=[("all-reduce", 64 * MIB, 2, 2, 2, None)])
    assert comm.amax_reduce_ms(no_sp, "fwd", _fp8_setup(8)) == 0.0  # without SP TE reduces no amax


def test_the_reader_sets_the_recipe():
    from pathlib import Path

    from planner.models.configs import megatron

    root = Path(__file__).resolve().parents[1]
    assert megatron.read(root / "configs/megatron-bridge/h100_405b_fp8cs.yaml").modelled.fp8_current_scaling
    assert not megatron.read(root / "configs/megatron-lm/gpt3_mcore_tp1_pp2.yaml").modelled.fp8_current_scaling


def test_the_setting_is_refused_outside_megatrons_fp8(tmp_path):
    from click.testing import CliRunner
    from fixtures.tiny_gpt2 import tiny_gpt2_profile

    from planner.cli import cli

    path = tiny_gpt2_profile(tmp_path, "h100")
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--runtime", "megatron", "--fp8-current-scaling"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--fp8-current-scaling is Transformer Engine's FP8 recipe under --runtime megatron with --float8" in \
        result.output


def test_search_compare_says_the_recipe_it_did_not_score():
    from pathlib import Path

    from planner.commands.search_compare import _settings_unsaid
    from planner.models.configs import megatron

    job = megatron.read(Path(__file__).resolve().parents[1] / "configs/megatron-bridge/h100_405b_fp8cs.yaml")
    said = _settings_unsaid(job.modelled, {"float8": True, "fp8_all_gather": job.modelled.fp8_all_gather,
                                           "tp_overlap": job.modelled.tp_overlap, "nccl_nvls_off": True,
                                           "optimizer_state_dtype": job.modelled.optimizer_state_dtype,
                                           "runtime_version": job.modelled.runtime_version,
                                           "compile": job.modelled.compile, "compile_loss": job.modelled.compile_loss})
    # the recipe's settings the search was not given, each said (§42.searchscale: bf16 reduction, TE's loss)
    assert said == ["FP8 current scaling (TE's amax all-reduces over TP) on (scored off, as the search)",
                    "gradients reduced in bf16 (--grad-reduce-in-bf16) on (scored off, as the search)",
                    "Transformer Engine's fused cross-entropy on (scored off, as the search)"]
