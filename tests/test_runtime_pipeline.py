"""Multi-process runs on CPU (gloo): the pipeline trains exactly like one process, the
bundled GPT runs in stages, and a failing rank ends the job cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import MODELS, ROOT
from fixtures.processes import children, gone, ranks_of
from fixtures.rt_plans import make_plan

import planner.runtime.launcher as launcher
from planner.cost.optimizers import make_optimizer
from planner.errors import UserError
from planner.models.modelfile import load_model_file, pipeline_layers
from planner.runtime import run_plan, validate_plan
from planner.runtime.checks import prepare
from planner.runtime.reference import reference_losses

pytestmark = pytest.mark.slow

TINY = ROOT / "tests" / "fixtures" / "rt_tiny.py"
GPT_LAYERS = ["embed"] + [f"blocks.{i}" for i in range(8)] + ["head"]
FIXTURES = ROOT / "tests" / "fixtures"
TIED_LAYERS = ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]


def _reference(plan, num_steps: int, seed: int = 0):
    """One process, no pipeline: the mean of the microbatch losses, as the schedule
    averages them, and the same optimizer."""
    model_file = load_model_file(TINY)
    torch.manual_seed(seed)
    model = model_file.build_model()
    layers = pipeline_layers(model)
    optimizer = make_optimizer(plan.setup.training.optimizer, model.parameters())
    num_mb = plan.setup.pipeline.microbatches
    inputs, targets = model_file.example_batch(plan.setup.pipeline.micro_batch_size * num_mb)
    losses = []
    for _ in range(num_steps):
        optimizer.zero_grad()
        total = 0.0
        for x, target in zip(inputs.tensor_split(num_mb), targets.tensor_split(num_mb), strict=True):
            for _, layer in layers:
                x = layer(x)
            loss = model_file.loss_fn(x, target) / num_mb
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses, model


@pytest.mark.parametrize(("stages", "checkpointed", "schedule"), [
    ([["0", "1"], ["2", "3", "4"]], [[], []], "1F1B"),
    ([["0", "1"], ["2", "3", "4"]], [["0", "1"], ["3"]], "1F1B"),
    # stage 2 holds only a parameter-free layer: it has no optimizer to step
    ([["0"], ["1"], ["2"], ["3", "4"]], [["0"], ["1"], [], ["3"]], "GPipe"),
])
def test_pipeline_trains_like_one_process(tmp_path, stages, checkpointed, schedule):
    plan = make_plan(TINY, stages, checkpointed=checkpointed, schedule=schedule, optimizer="sgd",
                     microbatches=4, micro_batch_size=3)
    report = run_plan(plan, steps=1, warmup_steps=1, state_dir=tmp_path)
    ref_losses, ref_model = _reference(plan, num_steps=len(report.losses))
    assert len(report.losses) == 3  # warm-up, timed, memory step
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(ref_losses))
    ref_params = dict(ref_model.named_parameters())
    seen = set()
    for index in range(len(stages)):
        state = torch.load(tmp_path / f"stage{index}.pt")
        for name, param in state["params"].items():
            torch.testing.assert_close(param, ref_params[name].detach())
            torch.testing.assert_close(state["grads"][name], ref_params[name].grad)
            seen.add(name)
    assert seen == set(ref_params)
    # validate's in-process replay holds what the pipeline holds, byte for byte
    for check, stage in zip(validate_plan(plan, plan_file=None), report.stages, strict=True):
        assert check.peak_bytes == stage.measured.peak_bytes


@pytest.mark.parametrize(("stages", "checkpointed", "on_meta"), [
    ([TIED_LAYERS[:3], TIED_LAYERS[3:]], [[], []], False),
    ([TIED_LAYERS[:2], TIED_LAYERS[2:3], TIED_LAYERS[3:5], TIED_LAYERS[5:]], [["embed"], [], ["blocks.2"], ["head"]],
     True),
])
def test_tied_embedding_and_head_train_like_one_process(tmp_path, stages, checkpointed, on_meta):
    """GPT-2's tying: the head reuses the token embedding's weight. Each end stage holds a
    copy; their gradients are summed before every step, so the copies stay equal and the
    losses match one process (untied copies drift apart from the first update). Built
    whole on every rank, or on meta with init_layer() (the last stage then initialises
    its copy itself, and takes the first stage's)."""
    model = FIXTURES / "tied_gpt.py"
    if not on_meta:
        model = tmp_path / "tied_gpt_whole.py"
        text = (FIXTURES / "tied_gpt.py").read_text()
        model.write_text(text[:text.index("def init_layer")])
    plan = make_plan(model, stages, checkpointed=checkpointed, microbatches=4, micro_batch_size=2)
    report = run_plan(plan, steps=1, warmup_steps=1, state_dir=tmp_path)
    reference = reference_losses(plan, prepare(plan, plan_file=None), num_steps=len(report.losses), seed=0)
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(reference), rtol=1e-6, atol=1e-5)
    embedding = torch.load(tmp_path / "stage0.pt")["params"]["embed.tokens.weight"]
    head = torch.load(tmp_path / f"stage{len(stages) - 1}.pt")["params"]["head.weight"]
    assert torch.equal(embedding, head)


def test_non_contiguous_outputs_and_dropout_train_like_one_process():
    """A ViT's patch embedding returns flatten(2).transpose(1, 2), a view; gloo sends and
    receives only contiguous tensors. Its MLP's dropout draws the same masks as in one
    process (each layer's random numbers are seeded per step and microbatch), also when
    the layer is checkpointed and recomputes them."""
    plan = make_plan(FIXTURES / "vit_like.py", [["0"], ["1", "2", "3"]], checkpointed=[[], ["2"]],
                     microbatches=4, micro_batch_size=2)
    report = run_plan(plan, steps=1, warmup_steps=0)
    reference = reference_losses(plan, prepare(plan, plan_file=None), num_steps=len(report.losses), seed=0)
    torch.testing.assert_close(torch.tensor(report.losses), torch.tensor(reference))


@pytest.mark.slow
def test_mlp_peak_per_stage_is_the_prediction(tmp_path):
    """Profile, solve and run the bundled MLP (MSE loss) on 2 stages, M = 8: every stage's
    measured peak within 1% of the prediction. The last stage was 2.2% over: torch's
    mse_loss returned each microbatch's loss as a view of a 0.5 MiB buffer, which the
    schedule keeps to the end of the step (planner.modelfile.compact_loss). Profiled at one
    repeat and no warmup: the peaks are bytes, which the repeats do not move (mlp.py's bytes at
    --repeats 2 and the default --warmup 2 are these, field for field: docs/testing.md)."""
    from fixtures.cli import run_ok

    from planner import io

    profile, plan_path = tmp_path / "profile.json", tmp_path / "plan.yaml"
    run_ok("profile", MODELS / "mlp.py", "--micro-batch-size", "4", "--threads", "1", "--repeats", "1", "--warmup", "0",
           "--out", profile)
    run_ok("solve", "--profile", profile, "--stages", "2", "--microbatches", "8", "--mem", "1GB", "--out", plan_path)
    report = run_plan(io.load_plan(plan_path), plan_file=plan_path, steps=1, warmup_steps=1)
    for stage in report.stages:
        measured, predicted = stage.measured.peak_bytes, stage.predicted.peak_bytes
        assert abs(measured - predicted) <= 0.01 * predicted, (stage.index, measured, predicted)


# 2 stages: 4 (a GPT's middle stages of blocks alone, 4 ranks) proved nothing more at twice the
# cost: 4-stage pipelines with weightless and weighted middle stages train like one process in
# test_pipeline_trains_like_one_process and test_tied_embedding_and_head_train_like_one_process, and
# the threads per rank at every stage count are test_calibrate's placement table
@pytest.mark.parametrize("num_stages", [2])
def test_gpt_runs_in_stages(num_stages):
    per = len(GPT_LAYERS) // num_stages
    cuts = [GPT_LAYERS[i * per:(i + 1) * per] for i in range(num_stages - 1)] + [GPT_LAYERS[(num_stages - 1) * per:]]
    plan = make_plan(MODELS / "gpt.py", cuts, checkpointed=[cut[:1] for cut in cuts], microbatches=4,
                     micro_batch_size=1, threads=None)
    started = time.monotonic()
    report = run_plan(plan, steps=2, warmup_steps=1)
    assert time.monotonic() - started < 90
    assert [stage.index for stage in report.stages] == list(range(num_stages))
    assert all(stage.measured.peak_bytes > 0 and stage.measured.fwd_ms > 0 and stage.measured.bwd_ms > 0
               and stage.measured.step_ms > 0 for stage in report.stages)  # every GPT stage has weights
    assert len(report.iteration_ms_all) == 2 and report.iteration_ms > 0
    assert report.losses[-1] < report.losses[0]  # Adam on one repeated batch
    assert report.device.threads == max(1, (os.cpu_count() or 1) // num_stages)
    assert report.threads_source == "cpu_count"


@pytest.fixture
def spawned(monkeypatch):
    """Record the rank processes the launcher starts (forked or spawned)."""
    procs = []
    real_start = launcher._start_rank

    def start(*args, **kwargs):
        proc = real_start(*args, **kwargs)
        procs.append(proc)
        return proc

    monkeypatch.setattr(launcher, "_start_rank", start)
    return procs



@pytest.mark.parametrize(("fault", "message"), [
    ("raise", "stage 1 failed: RuntimeError: layer 2 was told to fail at line "),
    ("die", "stage 1 died (SIGKILL)"),
    ("loss", "stage 2 failed: ValueError: the loss was told to fail at line "),
])
def test_a_failing_rank_ends_the_job(monkeypatch, spawned, fault, message):
    monkeypatch.setenv("RT_FAULT", fault)
    plan = make_plan(TINY, [["0"], ["1", "2"], ["3", "4"]])
    started = time.monotonic()
    with pytest.raises(UserError) as info:
        run_plan(plan, steps=2, warmup_steps=1)
    assert time.monotonic() - started < 60
    text = str(info.value)
    assert text.startswith(message) and "Traceback" not in text and "\n" not in text
    assert len(spawned) == 3 and all(gone(proc.pid) for proc in spawned)


def test_a_hung_rank_times_out(monkeypatch, spawned):
    monkeypatch.setenv("RT_FAULT", "hang")
    plan = make_plan(TINY, [["0", "1"], ["2", "3", "4"]])
    # the process group times out first (5 s); the launcher names the stage they waited for
    with pytest.raises(UserError, match=r"^stage 1 stopped making progress \(in a forward.*\) and its neighbours "
                                        r"timed out waiting for it"):
        run_plan(plan, steps=1, warmup_steps=0, timeout_s=5)
    assert all(gone(proc.pid) for proc in spawned)


def test_stale_plan_starts_no_process(tmp_path, spawned):
    model = tmp_path / "model.py"
    model.write_text(TINY.read_text())
    plan = make_plan(model, [["0", "1"], ["2", "3", "4"]])
    model.write_text(TINY.read_text() + "\n# changed\n")
    with pytest.raises(UserError, match="stale"):
        run_plan(plan, steps=1)
    assert spawned == []


def test_enforced_cap_fails_the_stage_that_exceeds_it(spawned):
    """On CPU the cap is checked against the tracked peak after the memory step."""
    plan = make_plan(TINY, [["0", "1"], ["2", "3", "4"]], caps=[10**9, 1000])
    with pytest.raises(UserError, match=r"^stage 1 exceeded its cap of 1000 B \(peak [0-9.]+ KiB\)"):
        run_plan(plan, steps=1, warmup_steps=0, enforce_cap=True)
    assert all(gone(proc.pid) for proc in spawned)


@pytest.mark.cuda
def test_cuda_run_with_enforced_caps():
    import torch as _torch

    if _torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    plan = make_plan(TINY, [["0", "1"], ["2", "3", "4"]])
    report = run_plan(plan, steps=2, warmup_steps=1, device="cuda", enforce_cap=True)
    assert report.backend == "nccl" and all(stage.measured.peak_bytes > 0 for stage in report.stages)
    tight = make_plan(MODELS / "gpt.py", [GPT_LAYERS[:5], GPT_LAYERS[5:]], caps=[2**20, 2**20])
    with pytest.raises(UserError, match=r"stage \d exceeded its cap of 1 MiB"):
        run_plan(tight, steps=1, warmup_steps=0, device="cuda", enforce_cap=True)



@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
@pytest.mark.parametrize("spawn", [pytest.param(False, id="forked"), pytest.param(True, id="spawned")])
def test_ranks_die_with_a_killed_launcher(tmp_path, spawn):
    """Even a launcher killed outright (SIGKILL: no cleanup runs) leaves no rank behind: spawned
    ranks are its children; forked ranks are the children of its fork server, which dies with it."""
    script = tmp_path / "launch.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "from fixtures.rt_plans import make_plan\n"
        "from planner.runtime import run_plan\n"
        f"run_plan(make_plan({str(TINY)!r}, [['0', '1'], ['2', '3', '4']]), steps=1, timeout_s=300, spawn={spawn})\n"
    )
    launcher_proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "RT_FAULT": "hang"})
    deadline = time.monotonic() + 180  # a loaded 2-core machine (load 14) took over 60 s to start them
    while len(started := ranks_of(launcher_proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(started) == 2, f"ranks of the launcher: {started}"
    started += children(launcher_proc.pid)  # the fork server too
    launcher_proc.kill()
    launcher_proc.wait()
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in started), [Path(f"/proc/{pid}/stat").read_text() for pid in started if not gone(pid)]
