"""scripts/te_host_probe.py, the CUDA-host measurement of Transformer Engine's modules against the replica's stand-ins
(docs/published-runs.md §35.tehost): the excess it reports by hand, its table, its refusal of bad input, and its clean
skip on a machine without CUDA or TE."""

from __future__ import annotations

import os

import pytest
from fixtures.scripts import load_script


@pytest.fixture(scope="module")
def probe():
    return load_script("te_host_probe")


def test_excess_is_each_module_less_its_stand_in(probe):
    units = {
        "linear_qkv": (1.50, 5.26),
        "core_attention": (4.73, 9.96),
        "linear_proj": (1.00, 4.26),
    }
    fused = probe.excess(units, "fused")
    assert fused["linear_qkv"] == pytest.approx((0.50, 1.00))  # a torch Linear: 1.00 / 4.26
    assert fused["core_attention"] == pytest.approx((2.00, 3.00))  # SDPA's stand-in: 2.73 / 6.96
    assert fused["linear_proj"] == pytest.approx((0.0, 0.0))
    # TE's UnfusedDotProductAttention replicated: 8.93 / 12.95
    unfused = probe.excess(units, "unfused")
    assert unfused["core_attention"] == pytest.approx((4.73 - 8.93, 9.96 - 12.95))


def test_the_table_sums_the_blocks_excess_in_linear_forwards(probe):
    unit = 10.0  # µs a torch Linear forward
    found = {"unit": (unit, 40.0)}
    for name in probe.MODULES:
        found[name] = (20.0, 50.0)  # 2.00 / 5.00 units each
    found["core_attention"] = (37.3, 79.6)  # 3.73 / 7.96: one unit past SDPA's stand-in each way
    lines = probe.report(found, "fused")
    assert lines[0].startswith("unit: torch Linear 2048x2048 on 8192 tokens, forward 10.00 µs")
    assert "| linear_qkv | 20.00 | 50.00 | 2.00 | 5.00 | +1.00 | +0.74 |" in lines
    assert "| core_attention | 37.30 | 79.60 | 3.73 | 7.96 | +1.00 | +1.00 |" in lines
    # 4 x 1.00 + 1.00 forward; 4 x 0.74 + 1.00 backward
    assert lines[-1] == "| block (five modules) | | | | | +5.00 | +3.96 |"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--calls", "0"], "--calls must be a positive integer, got 0"),
        (["--tp", "3"], "--tp 3 must divide --heads 8 and --ffn 2048"),
        (["--megatron", "--fp8"], "--megatron times the layer in BF16 only"),
    ],
)
def test_bad_input_is_one_sentence_and_a_nonzero_exit(probe, capsys, argv, said):
    with pytest.raises(SystemExit) as exited:
        probe.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_it_skips_cleanly_where_it_cannot_time(probe, capsys, monkeypatch):
    for name in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    monkeypatch.setattr(probe, "unavailable", lambda megatron=False: "no CUDA device")
    assert probe.main(["--tp", "4", "--attention", "unfused"]) == 0
    assert capsys.readouterr().out == "te_host_probe: skipped: no CUDA device\n"
    # the unfused backend is chosen before TE is imported (its utils.py reads NVTE_FLASH_ATTN at import)
    assert os.environ["NVTE_FUSED_ATTN"] == os.environ["NVTE_FLASH_ATTN"] == "0"


def test_the_whole_layer_beside_the_records_block(probe):
    """--megatron: the layer's µs over the unit, against the Megatron record's block (flash 36.72 / 47.29, eager
    49.72 / 52.76 torch Linear forwards, docs/published-runs.md §23.hostcall)."""
    fused = probe.block_report(10.0, (400.0, 500.0), "fused")
    assert fused == [
        "Megatron-core TransformerLayer (TE spec): forward 400.00 µs = 40.00 units, backward 500.00 µs = 50.00 "
        "units; the record's block 36.72 / 47.29: +3.28 / +2.71 units"
    ]
    assert probe.block_report(10.0, (400.0, 500.0), "unfused")[0].endswith(
        "49.72 / 52.76: -9.72 / -2.76 units"
    )


def test_on_this_machine_it_says_why_it_skips(probe):
    import torch

    reason = probe.unavailable()
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the probe would run")
    assert reason.startswith("no CUDA device")


def test_the_host_share_bound_from_a_rows_gb200_run():
    """golden_runs --host-bound: G8's golden steps (Megatron-LM 93ebf8d7, H100 0.3280 s, GB200 0.3087 s) at Grace's
    37.08 / 13.48 µs a torch Linear (TransformerEngine#2053): share x 0.3280 x 2.7507 <= 0.3087."""
    golden = load_script("golden_runs")
    bound = golden.host_share_bound(0.3280, 0.3087, 37.08 / 13.48)
    assert bound == pytest.approx(0.3087 / (0.3280 * 2.750742), rel=1e-6)
    assert round(bound, 3) == 0.342


def test_host_split_is_the_first_blocks_passes_each_its_max(monkeypatch):
    from types import SimpleNamespace

    decompose = load_script("decompose_megatron")
    head = SimpleNamespace(kind="embedding", name="embedding", fwd_ms=9.0, bwd_ms=9.0)
    block = SimpleNamespace(kind="decoder_block", name="layers.0", fwd_ms=0.201, bwd_ms=0.346)
    monkeypatch.setattr(
        decompose.hosttime, "_block_host", lambda layer, profile, setup: (0.737, 0.300, 0.737)
    )
    lines = decompose.host_split([([head, block], [0, 0])], [0], None, None)
    assert lines == [
        "a block-microbatch (layers.0, recompute option 0): device / host / charged ms",
        "  forward   0.201 / 0.737 / 0.737",
        "  backward  0.346 / 0.300 / 0.346",
        "  both      0.547 / 1.037 / 1.083",
    ]  # a host-bound forward, a device-bound backward
    assert decompose.host_split([([head], [0])], [0], None, None) == []
