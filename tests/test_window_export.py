"""Transformer Engine's offload window end to end (CliRunner): `ckplan solve` under --runtime megatron takes it
where it is the fastest plan that fits (planner/solve/dpwindow.py), `ckplan export --to megatron` writes it as
megatron-core runs it (--cpu-offloading --cpu-offloading-num-layers N: planner/emit/megatron_window.py) with nothing
rounded, and a plan that offloads beside a pipeline under that runtime, which megatron-core refuses
(TransformerConfig, docs/framework-facts.md §321), is refused by export in one sentence rather than rounded."""

from __future__ import annotations

from fixtures.cli import run, run_ok
from test_launchers import _tiny_config

from planner import io
from planner.schema import OPTION_OFFLOAD

SOLVE = ["--microbatches", "8", "--precision", "bf16-mixed", "--runtime", "megatron"]


def _profile(tmp_path):
    """The tiny LLaMA (4 decoder layers) at micro-batch 1, 2,048 tokens, on a GB200 (its host link hides the
    copies behind the layers' compute)."""
    out = tmp_path / "tiny.json"
    run_ok("profile", "--arch-config", _tiny_config(tmp_path), "--seq-len", "2048", "--gpu", "gb200",
           "--micro-batch-size", "1", "--out", out)
    return out


def test_solve_takes_the_window_and_export_writes_it_as_megatron_flags(tmp_path):
    # at 760 MB (the divisor's reserve: --fragmentation 0.15) no plan at none fits (its allocated peak 659 MiB)
    # and the window's first 2 layers (598 MiB) run at none's time, faster than any recompute: TE v2.9's window
    # (the Bridge's megatron-core; v2.10's, whose copies have one layer to hide behind here: test_te210_window.py)
    profile, plan_path, script = _profile(tmp_path), tmp_path / "plan.yaml", tmp_path / "plan.sh"
    run_ok("solve", "--profile", profile, "--mem", "760MB", "--fragmentation", "0.15", "--stages", "1", *SOLVE,
           "--runtime-version", "92c8482e", "--out", plan_path)
    plan = io.load_plan(plan_path)
    assert plan.stages[0].recompute == {"layers.0": OPTION_OFFLOAD, "layers.1": OPTION_OFFLOAD}
    said = " ".join(run_ok("export", plan_path, "--to", "megatron", "--out", script).output.split())
    assert "rounded: nothing; the export is the plan exactly" in said
    text = script.read_text()
    assert "    --cpu-offloading\n    --cpu-offloading-num-layers 2\n" in text
    flags = [line.split()[0] for line in text.splitlines() if line.startswith("    --")]
    assert "--recompute-num-layers" not in flags and "--recompute-granularity" not in flags


def test_export_refuses_a_plan_that_offloads_beside_megatron_s_pipeline(tmp_path):
    profile, plan_path = _profile(tmp_path), tmp_path / "plan.yaml"
    run_ok("solve", "--profile", profile, "--mem", "4GB", "--stages", "2", *SOLVE, "--out", plan_path)
    plan = io.load_plan(plan_path)
    first = plan.stages[0]
    edited = first.model_copy(update={"recompute": {"layers.0": OPTION_OFFLOAD}, "checkpointed": []})
    io.save_plan(plan.model_copy(update={"stages": [edited, *plan.stages[1:]]}), plan_path)  # a plan file by hand
    result = run("export", plan_path, "--to", "megatron", "--out", tmp_path / "plan.sh")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and not (tmp_path / "plan.sh").exists(), result.output
    assert ("the plan offloads 1 layers' activations to the host (layers.0 first) over 2 pipeline stages, and "
            "--runtime megatron") in said and "refuses CPU offloading with pipeline parallelism" in said


def test_a_window_the_replay_puts_over_the_cap_is_not_taken(tmp_path):
    """On the profile as written (without the runtime's TE records, float8_profile) at micro-batch 8 on 2 GB the
    window at N = 3 meets the rows (allocated 1,510 MiB of a 1,620 MiB row) and not the replay, which plays the
    window (reserve_window.py: 2,182 MiB of the 1,907 MiB cap): the window taken is one evaluate admits. TE v2.9's
    window (the Bridge's megatron-core); v2.10's holds a group fewer, and its N = 3 fits the replay."""
    from planner.cost import costmodel
    from planner.schema import StagePlan
    from planner.solve import dpwindow, replayfit, search
    from planner.solve.deadline import Deadline

    profile_path, plan_path = tmp_path / "tiny8.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch-config", _tiny_config(tmp_path), "--seq-len", "2048", "--gpu", "gb200",
           "--micro-batch-size", "8", "--out", profile_path)
    run_ok("solve", "--profile", profile_path, "--mem", "2GB", "--stages", "1", "--microbatches", "1",
           "--precision", "bf16-mixed", "--runtime", "megatron", "--runtime-version", "92c8482e", "--out", plan_path)
    profile, setup = io.load_profile(profile_path), io.load_plan(plan_path).setup
    names = [layer.name for layer in profile.layers]
    three = [StagePlan(index=0, layers=names, recompute={f"layers.{i}": OPTION_OFFLOAD for i in range(3)})]
    cost = costmodel.evaluate(three, profile, setup)
    assert search.in_rows(cost) and not cost.feasible
    relaxed = replayfit.relaxed_caps(profile, setup)
    rows = setup.model_copy(update={"pipeline": setup.pipeline.model_copy(update={"mem_caps_bytes": relaxed})})
    found = dpwindow.admitted_window(profile, setup, rows=rows, faster_than_ms=float("inf"), deadline=Deadline(None))
    assert found is None or found[2].feasible
