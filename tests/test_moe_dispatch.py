"""Megatron's flex dispatcher on DeepEP / HybridEP: the reader records the backend, and a MoE block's dispatch and
combine are timed at the backend's own published rates on the bytes its benchmark counts
(planner/models/ep_dispatch_rates.py, planner/models/configs/megatron_moe_dispatch.py, docs/framework-facts.md §116,
docs/published-runs.md §27.e1hybrid)."""

from math import comb

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.commands import evaluate_config
from planner.cost import dataparallel, ep_exchange, rules
from planner.cost.layers import LayerCost
from planner.errors import UserError
from planner.models import ep_dispatch_rates
from planner.models.configs import megatron
from planner.schema.setup import EpDispatchSetup

TINY = {"--num-layers": "2", "--hidden-size": "64", "--ffn-hidden-size": "160", "--num-attention-heads": "4",
        "--group-query-attention": "true", "--num-query-groups": "2", "--swiglu": "true",
        "--disable-bias-linear": "true", "--position-embedding-type": "rope", "--seq-length": "32",
        "--max-position-embeddings": "32", "--vocab-size": "128", "--num-experts": "8",
        "--moe-ffn-hidden-size": "32", "--moe-router-topk": "2", "--expert-model-parallel-size": "4",
        "--micro-batch-size": "2", "--global-batch-size": "16"}


def _job(**extra):
    flags = {**TINY, **extra}
    return megatron.from_pairs([(flag, [value]) for flag, value in flags.items()], "tiny.yaml")


def test_ranks_a_token_reaches_by_hand():
    # 8 experts over 2 ranks (4 each), top 2: a rank is missed when both experts are the other's, C(4,2)/C(8,2) = 6/28
    assert ep_dispatch_rates.ranks_per_token(8, 2, 2) == pytest.approx(2 * (1 - 6 / 28))
    # one expert a rank: every copy goes to its own rank
    assert ep_dispatch_rates.ranks_per_token(16, 16, 4) == pytest.approx(4.0)
    # brute force over every top-2 choice of 8 experts on 4 ranks (2 each)
    from itertools import combinations
    pairs = list(combinations(range(8), 2))
    mean = sum(len({e // 2 for e in pair}) for pair in pairs) / len(pairs)
    assert ep_dispatch_rates.ranks_per_token(8, 4, 2) == pytest.approx(mean)
    # Qwen3-235B at EP 32: 128 experts, 4 a rank, top 8
    assert ep_dispatch_rates.ranks_per_token(128, 32, 8) == pytest.approx(32 * (1 - comb(124, 8) / comb(128, 8)))


def test_the_published_rows_and_how_a_missing_one_is_taken():
    assert ep_dispatch_rates.rates("hybridep", "gb200", 32, 32)[:2] == (484.22, 464.54)
    assert ep_dispatch_rates.rates("hybridep", "gb200", 8, 16)[:2] == (550.10, 538.44)
    past = ep_dispatch_rates.rates("hybridep", "gb200", 64, 32)
    assert past[:2] == (479.02, 447.89) and "largest rank count" in past[2]
    between = ep_dispatch_rates.rates("deepep", "gb200", 12, 32)
    assert between[:2] == (520.76, 442.51) and "next measured rank count above EP 12" in between[2]
    nearest = ep_dispatch_rates.rates("hybridep", "gb200", 16, 20)
    assert nearest[:2] == (472.84, 474.48) and "nearest measured SM count to 20" in nearest[2]
    assert ep_dispatch_rates.rates("hybridep", "h100", 8, 32) is None


def test_the_reader_records_the_backend_and_its_sms():
    assert _job().ep_backend is None  # allgather, Megatron's default
    assert _job(**{"--moe-token-dispatcher-type": "alltoall"}).ep_backend is None
    assert _job(**{"--moe-token-dispatcher-type": "flex"}).ep_backend == ("deepep", 20)
    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep"})
    assert job.ep_backend == ("hybridep", 32)
    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep",
                  "--moe-hybridep-num-sms": "16"})
    assert job.ep_backend == ("hybridep", 16)
    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-enable-deepep": "true", "--moe-deepep-num-sms": "24"})
    assert job.ep_backend == ("deepep", 24)
    said = {s.name: s.status for s in job.settings}
    assert said["--moe-enable-deepep"] == said["--moe-deepep-num-sms"] == "modelled"


@pytest.mark.parametrize("extra, match", [
    ({"--moe-token-dispatcher-type": "ring"}, "takes allgather, alltoall, flex"),
    ({"--moe-token-dispatcher-type": "alltoall", "--moe-enable-deepep": "true"}, "needs --moe-token-dispatcher-type flex"),
    ({"--moe-token-dispatcher-type": "flex", "--moe-enable-deepep": "true",
      "--moe-flex-dispatcher-backend": "hybridep"}, "name two backends"),
    ({"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "ncclep"}, "no published rate"),
    ({"--moe-token-dispatcher-type": "alltoall", "--moe-hybridep-num-sms": "32"}, "does not run them"),
    ({"--moe-token-dispatcher-type": "flex", "--moe-hybridep-num-sms": "0"}, "positive number of SMs"),
])
def test_bad_dispatcher_flags_are_refused(extra, match):
    with pytest.raises(UserError, match=match):
        _job(**extra)


def test_a_pair_is_the_received_bytes_at_each_rate():
    backend = EpDispatchSetup(backend="hybridep", dispatch_gb_per_s=500.0, combine_gb_per_s=400.0, rank_copies=0.75)
    # 1 GB of routed copies, 3/4 of them a rank's distinct receipts: 0.75 GB at 500 then at 400 GB/s
    assert ep_exchange.ep_dispatch_pair_ms(1e9, backend) == pytest.approx(0.75 / 500 * 1e3 + 0.75 / 400 * 1e3)


def test_the_block_term_charges_two_pairs_and_three_under_full_recompute():
    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep"})
    prediction = evaluate_config.predict(job, gpus=8, gpu_name="gb200")
    setup = prediction.setup
    backend = setup.data_parallel.ep_dispatch
    # EP 4 is below the table's 8 ranks: the 8-rank row at HybridEP's default 32 SMs
    assert backend.backend == "hybridep" and (backend.dispatch_gb_per_s, backend.combine_gb_per_s) == (545.71, 568.94)
    assert backend.rank_copies == pytest.approx(ep_dispatch_rates.ranks_per_token(8, 4, 2) / 2, abs=1e-6)
    layer = LayerCost(name="moe", kind="moe_block", fwd_ms=0.0, bwd_ms=0.0, act_bytes=0, input_bytes=0, output_bytes=0,
                      input_in_act_bytes=0, param_count=0, transient_bytes=0, a2a_bytes=64 * 2 * 64 * 2)
    pair = layer.a2a_bytes * backend.rank_copies * (1 / 545.71e9 + 1 / 568.94e9) * 1e3
    assert rules.all_to_all_ms(layer, 0, setup) == pytest.approx(2 * pair)
    assert rules.all_to_all_ms(layer, 1, setup) == pytest.approx(3 * pair)
    # the same job on NCCL's all-to-all: 4 exchanges of 3/4 of the copies at the EP link
    plain = evaluate_config.predict(_job(**{"--moe-token-dispatcher-type": "alltoall"}), gpus=8, gpu_name="gb200")
    assert plain.setup.data_parallel.ep_dispatch is None
    assert rules.all_to_all_ms(layer, 0, plain.setup) == pytest.approx(
        4 * dataparallel.all_to_all_ms(layer.a2a_bytes, 4, plain.setup.data_parallel.ep_gb_per_s))


def test_no_published_figure_or_past_the_domain_falls_back_to_nccl_and_says_so():
    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep"})
    on_h100 = evaluate_config.predict(job, gpus=8, gpu_name="h100")
    assert on_h100.setup.data_parallel.ep_dispatch is None
    assert any("no published figure on h100" in note for note in on_h100.notes)
    across = evaluate_config.predict(job, gpus=8, gpu_name="gb200", gpus_per_node=2, nvlink_domain=2)
    assert across.setup.data_parallel.ep_dispatch is None
    assert any("past the 2-GPU NVLink domain" in note for note in across.notes)


def test_the_cli_refuses_an_unknown_backend_in_one_sentence(tmp_path):
    config = tmp_path / "job.yaml"
    lines = [f"  {flag}: {value}" for flag, value in {**TINY, "--moe-token-dispatcher-type": "flex",
                                                          "--moe-flex-dispatcher-backend": "nvshmem"}.items()]
    config.write_text("MODEL_ARGS:\n" + "\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(config), "--gpus", "8", "--gpu", "gb200"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--moe-flex-dispatcher-backend nvshmem: Megatron-LM takes deepep, hybridep, ncclep" in result.output



def test_the_host_floor_counts_the_passs_exchanges_as_device_time():
    # hosttime.host_bound_ms: a MoE block's pass takes max(device, host); its dispatch and combine run on the device
    # inside the pass, so the host is charged only past the experts' compute and the pass's two exchanges
    from dataclasses import replace

    from planner.cost import hosttime
    from planner.cost.layers import layer_costs

    job = _job(**{"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep"})
    prediction = evaluate_config.predict(job, gpus=8, gpu_name="gb200")
    profile, setup = prediction.profile, prediction.setup
    block = next(layer for layer in layer_costs(profile) if layer.kind == "moe_block")
    fwd_host, bwd_host, _ = hosttime._block_host(block, profile, setup)
    exchange = rules.all_to_all_ms(block, 0, setup) / 2
    assert fwd_host > 0 and exchange > 0
    # device passes shorter than the host's issue by less than a pass's exchanges: no host time charged
    short = replace(block, fwd_ms=fwd_host - exchange / 2, bwd_ms=bwd_host - exchange / 2)
    assert hosttime.host_bound_ms(short, 0, profile, setup) == 0.0
    # shorter still: the host's issue beyond the compute and the exchanges together
    shorter = replace(block, fwd_ms=fwd_host - 2 * exchange, bwd_ms=bwd_host - 3 * exchange)
    assert hosttime.host_bound_ms(shorter, 0, profile, setup) == pytest.approx(exchange + 2 * exchange)
