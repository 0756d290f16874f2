"""The device check for torch's flash calls at the CP rows' ring shapes (scripts/cp_flash_probe.py): the calls and
their FLOPs by hand, a rank's ring pass from its calls, ckplan's charge beside a measurement, and the CPU dry run."""

from __future__ import annotations

import json

import pytest
from fixtures.scripts import load_script

probe = load_script("cp_flash_probe")


def test_the_rings_calls_at_32768_tokens_a_rank_and_their_flops_by_hand():
    shapes = {call.name: call for call in probe.calls(32768, 32, 16384, 16)}
    assert [(c.queries, c.keys, c.causal) for c in shapes.values()] == [
        (16384, 16384, True), (32768, 32768, True), (32768, 16384, False), (16384, 32768, False)]
    # step 0: 4 x 32,768^2 x 128 x 32 heads, halved (causal) = 8.796e12; each later call covers as many pairs
    assert shapes["step0"].flops("forward") == 4 * 32768**2 * 128 * 32 // 2 == 8_796_093_022_208
    assert shapes["q_all"].flops("forward") == shapes["q_half"].flops("forward") == shapes["step0"].flops("forward")
    assert shapes["q_all"].flops("backward") == 2.5 * 8_796_093_022_208
    # ckplan reads every ring call's rate at the rank's s / cp = 32,768 tokens
    assert {c.length for name, c in shapes.items() if name != "published"} == {32768}


def test_a_ring_pass_is_step_0_then_the_slower_later_call_at_every_barrier():
    assert probe.ring_pass_ms({"step0": 10.0, "q_all": 6.0, "q_half": 7.0}, 4) == 10.0 + 3 * 7.0
    assert probe.ring_pass_ms({"step0": 10.0, "q_all": 8.0, "q_half": 7.0}, 2) == 18.0


def test_ckplans_charge_beside_a_measurement_on_the_500_w_h100():
    # at ckplan's own rates the ratios are 1: forward 303.6 TFLOP/s (c0409aaf's 16,384 row, held flat past it), and a
    # C4 rank's forward pass 8 x 8.796e12 FLOP at it = 231.8 ms (§33.cptime's table), backward 593.3 ms at 296.5
    shapes = probe.calls(32768, 32, 16384, 16)
    rates = {"forward": 303.6008, "backward": 296.5063}
    found = {"calls": {c.name: {which: {"soaked_ms": c.flops(which) / rates[which] / 1e9,
                                        "burst_ms": c.flops(which) / rates[which] / 1e9,
                                        "soaked_tflops": rates[which], "burst_tflops": rates[which]}
                                for which in rates} for c in shapes}}
    report = probe.against_ckplan(found, shapes, "h100-96g", 8)
    assert report["step0 forward"]["ckplan_tflops"] == pytest.approx(303.6008, rel=1e-6)
    assert report["q_half backward"]["soaked_over_ckplan"] == pytest.approx(1.0, rel=1e-6)
    assert report["ring pass cp 8 forward"]["ckplan_ms"] == pytest.approx(231.8, abs=0.05)
    assert report["ring pass cp 8 backward"]["ckplan_ms"] == pytest.approx(593.3, abs=0.05)
    assert report["ring pass cp 8 backward"]["measured_over_ckplan"] == pytest.approx(1.0, rel=1e-6)


def test_the_dry_run_times_every_call_on_the_cpu_and_writes_its_report(tmp_path, capsys):
    assert probe.main(["--dry-run", "--soak-s", "0.1", "--out", str(tmp_path)]) == 0
    found = json.loads((tmp_path / "cp_flash_probe.json").read_text())
    assert set(found["calls"]) == {"published", "step0", "q_all", "q_half"}
    assert all(found["calls"][name][which]["soaked_ms"] > 0 for name in found["calls"]
               for which in ("forward", "backward"))
    assert "ring pass cp 8 backward" in found["against_ckplan"] and found["device"] == "cpu (dry run)"
    # the profiler names what one call ran: torch's flash path (on the CPU its own flash kernel), as sdpa_kernel forces
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in found["kernels"]
    assert "| step0 | forward |" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--tokens", "3"], ["--cp", "1"], ["--gpu", "nope"]])
def test_bad_arguments_are_one_sentence(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.main(["--dry-run", *args])
    assert exit_.value.code == 2 and "Traceback" not in capsys.readouterr().err
