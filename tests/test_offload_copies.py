"""--offload-copies defaults to how the runtime's code runs the offloaded step (the record's
offload_step_serial_zero): DeepSpeed v0.6.2's ZeRO 3 steps each sub-group on the host and then copies its fp16
partition back, one after the other (stage3.py 2300-2315; framework-facts §292); ZeRO 1/2, ckplan's own runtime and
every record not read keep the overlapped chunks. A value the user gives wins."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fixtures.cli import run_ok

from planner import io
from planner.cli import cli
from planner.cost import dataparallel


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copies")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 512, "n_layer": 2, "n_head": 8, "vocab_size": 1024,
                                  "n_positions": 128, "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", 128, "--micro-batch-size", 1, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return folder / "p.json"


def _setup(profile_path, *, runtime="deepspeed", zero=3, offload=True, copies=None, said=None):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    options = DataParallelOptions(dp=8, zero=zero, offload_optimizer=offload, offload_copies=copies)
    return build_setup(io.load_profile(profile_path), stages=1, mem="80GB", microbatches=1, schedule="1F1B",
                       optimizer="adam", precision="bf16-mixed", parallel_stages=None, runtime=runtime,
                       data_parallel=options, say=None if said is None else said.append)


@pytest.mark.parametrize("runtime, zero, copies, overlapped", [
    ("deepspeed", 3, None, False),  # the record: serial at ZeRO 3
    ("deepspeed", 3, "overlapped", True),  # the user's word wins
    ("deepspeed", 2, None, True),  # ZeRO 2: DeepSpeedCPUAdam's adam_update_copy, tile by tile
    ("ckplan", 3, None, True),  # not read: ckplan's overlapped chunks
    ("ckplan", 3, "serial", False),
])
def test_the_default_is_the_runtimes_record_and_a_given_value_wins(gpt_profile, runtime, zero, copies, overlapped):
    assert _setup(gpt_profile, runtime=runtime, zero=zero, copies=copies).data_parallel.offload_overlap is overlapped


def test_the_record_default_is_said_with_its_source_and_scored_as_the_sum_of_the_phases(gpt_profile):
    said: list[str] = []
    setup = _setup(gpt_profile, said=said)
    assert [s for s in said if s.startswith("--offload-copies serial: deepspeed's ZeRO 3")]
    assert any("offload_step_serial_zero, docs/framework-facts.md §292" in s for s in said)
    params = 8 * 2**25  # 2^25 a rank: eight of ckplan's overlapped chunks (2^22 each), so the two modes differ
    phases = dataparallel.offload_phases_ms(params, setup)
    assert dataparallel.offload_ms(params, setup) == pytest.approx(sum(phases))
    overlapped = _setup(gpt_profile, copies="overlapped")
    phases = dataparallel.offload_phases_ms(params, overlapped)
    assert dataparallel.offload_ms(params, overlapped) == pytest.approx(max(phases) + (sum(phases) - max(phases)) / 8)
    assert max(phases) < sum(phases)


def test_nothing_is_said_without_offload_or_when_given(gpt_profile):
    for kwargs in ({"offload": False}, {"copies": "serial"}, {"zero": 2}):
        said: list[str] = []
        _setup(gpt_profile, said=said, **kwargs)
        assert not [s for s in said if s.startswith("--offload-copies")], kwargs


def test_the_help_says_where_the_default_comes_from():
    result = CliRunner().invoke(cli, ["evaluate", "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "[default: as the runtime's code runs them: serial under DeepSpeed's ZeRO 3" in text
