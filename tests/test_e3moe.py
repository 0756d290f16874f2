"""Row E3 (Megatron-Bridge 25.11, GPT-OSS 120B on 64 B200s) at the recipe's EP 64: the B200 preset's expert
parallelism, whose all-to-all crosses the DGX B200s' InfiniBand (docs/framework-facts.md §157,
docs/published-runs.md §33.e3moe). Hand counts of the exchange's bytes, rate and time."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.cost import ep_exchange
from planner.models import archs
from planner.models.configs import megatron
from planner.models.network_rate import alltoall_rate
from planner.profiler.analytic import dispatch_bytes
from planner.profiler.formulas import Shape, expert_gemm_shape

ROWS = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"


def _job(name: str):
    return megatron.read(ROWS / f"{name}.yaml")


def _shape(job) -> Shape:
    return Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                 ep=job.ep)


def test_the_gpt_oss_rows_take_each_presets_expert_parallelism():
    # gpt_oss_workload_base_configs.py at 00b7660b: B200 and GB200 EP 64, H100 the base's EP 8
    assert {name: _job(f"{name}_gptoss_120b_bf16").ep for name in ("b200", "gb200", "h100")} == \
        {"b200": 64, "gb200": 64, "h100": 8}


def test_e3s_rank_holds_two_experts_of_32768_rows_each():
    job = _job("b200_gptoss_120b_bf16")
    # 4 x 4096 tokens x top-4 = 65,536 copies a rank sends; 128 experts / EP 64 = 2 local, each 65,536 / 2 rows
    assert expert_gemm_shape(job.arch, _shape(job)) == (2, 32768)
    assert dispatch_bytes(job.arch, _shape(job)) == 4 * 4096 * 4 * 2880 * 2 == 377_487_360


def test_ep_64_over_dgx_b200s_moves_its_remote_share_at_a_nic_and_ep_8_stays_on_nvlink():
    b200 = archs.gpu("b200")
    assert (b200.gpus_per_node, b200.network_collective_rate) == (8, 48.0)
    # 56 of 64 shares leave the node over the rank's NIC at 48 GB/s while 7 go over NVLink: 63 shares in 56 / 48 s
    assert alltoall_rate(b200, 64, 1, 8) == pytest.approx(63 / (56 / 48.0)) == pytest.approx(54.0)
    assert alltoall_rate(b200, 8, 1, 8) == b200.node_alltoall_rate


def test_e3s_exchanges_a_step_by_hand():
    job = _job("b200_gptoss_120b_bf16")
    sent = dispatch_bytes(job.arch, _shape(job))
    link = SimpleNamespace(ep_dispatch=None, ep=64, ep_gb_per_s=alltoall_rate(archs.gpu("b200"), 64, 1, 8))
    one = ep_exchange.exchange_ms(sent, link)
    assert one == pytest.approx(63 / 64 * 377_487_360 / 54e9 * 1e3) == pytest.approx(6.88128)
    # dispatch and combine in forward and backward (moe_act's and layernorm's recompute rerun neither), 36 blocks,
    # GA 2 (512 / (4 x DP 64)): 1.98 s of E3's 3.99 s step
    microbatches = job.global_batch_size // (job.micro_batch_size * 64)
    assert microbatches == 2
    assert 4 * one * 36 * microbatches / 1e3 == pytest.approx(1.9818, abs=1e-4)
