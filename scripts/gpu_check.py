#!/usr/bin/env python3
"""The GPU check: ckplan's CUDA paths end to end on one CUDA GPU, in one command, one report.

    python3 scripts/gpu_check.py                  # on a machine with one CUDA GPU (about 10 min)
    python3 scripts/gpu_check.py --dry-run        # the same plumbing on CPU at tiny shapes (CI runs it)
    python3 scripts/gpu_check.py --fetch-wheels   # fill scripts/gpu_wheels/ (a machine with pip and an index)

It profiles a LLaMA-class Hugging Face config three ways (measured on the device, fake
tensors, analytic) and sets their per-layer bytes and times side by side; replays real
stages at full width (`ckplan validate`) under whole-layer recompute, selective options and
offload against the predicted allocated and reserved peaks; enforces a cap below the card;
launches one rank on NCCL (activation offload and optimizer offload, overlapped and serial,
against their predictions). The report is REPORT_DIR/gpu_check.json and gpu_check.md
(default out/gpu_check/); every ckplan command's output is kept in REPORT_DIR/logs/, with its
wall and CPU seconds. The dry run runs each command in a fork of the script with torch and
ckplan imported once (--spawn: a new Python each, as on the GPU), and its launches fork their
ranks from one server it starts (SharedRankServer; a launch's CPU seconds then leave out its
ranks', which are the server's children).

Set-up stays inside the script: a GPU machine without a package index has torch,
transformers, click, rich and pyyaml but not pulp, highspy or pydantic; those are installed
from the wheels in --wheels (default scripts/gpu_wheels/, ignored by git) into a private
folder that is put first on the path, never over the machine's own packages. Fill it with
--fetch-wheels, for the GPU machine's Python (--python-version, default 3.12).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ["pulp==3.3.2", "highspy==1.16.0", "pydantic==2.14.4", "pydantic_core==2.50.5",
          "annotated-types==0.8.0", "typing-inspection==0.4.5", "typing_extensions==4.16.0"]
NEEDED = ("pulp", "highspy", "pydantic", "click", "rich", "yaml", "transformers", "torch")
GIB = 2**30
# What ckplan states as its error on a real stage (issue 31): allocated, reserved, time.
BOUNDS = {"allocated": 0.02, "reserved": 0.10, "time": 0.15}


def llama_config(dry: bool, layers: int) -> dict:
    """LLaMA 3 8B's widths (meta-llama/Meta-Llama-3-8B config.json), `layers` decoder layers;
    the dry run keeps the shape of the config at toy widths."""
    if dry:
        widths = dict(hidden_size=64, intermediate_size=224, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=512, max_position_embeddings=256)
    else:
        widths = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192)
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16", **widths}


# ------------------------------------------------------------------ set-up


def fetch_wheels(folder: Path, python_version: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28)] + ["--platform=manylinux2014_x86_64"]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    f"--python-version={python_version}", "--implementation=cp", *platforms, "-d", str(folder),
                    *WHEELS], check=True)
    print(f"wheels in {folder}: {', '.join(sorted(p.name for p in folder.glob('*.whl')))}")


def missing_modules(env: dict) -> list[str]:
    code = "import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    out = subprocess.run([sys.executable, "-c", code, *NEEDED], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def environment(wheels: Path, site: Path) -> dict:
    """The environment every ckplan command runs in: the repository and, where the machine
    lacks them, the wheels' private site first on the path."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    missing = missing_modules(env)
    if missing and {"pulp", "highspy", "pydantic"} & set(missing):
        found = sorted(wheels.glob("*.whl"))
        if not found:
            raise SystemExit(f"gpu_check: {', '.join(missing)} missing and no wheels in {wheels}; fill it with "
                             "`python3 scripts/gpu_check.py --fetch-wheels` on a machine with an index, then carry it")
        print(f"[setup] installing {len(found)} wheels from {wheels} into {site}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), *map(str, found)], check=True)
        env["PYTHONPATH"] = os.pathsep.join([str(site), env["PYTHONPATH"]])
        missing = missing_modules(env)
    if missing:
        raise SystemExit(f"gpu_check: still missing after set-up: {', '.join(missing)}")
    return env


# ------------------------------------------------------------------ running ckplan


class Check:
    """The work folder, the environment, the log of every command, and the report."""

    def __init__(self, work: Path, env: dict, *, dry: bool, budget_s: float, fork: bool = False):
        self.work, self.env, self.dry, self.fork = work, env, dry, fork
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + budget_s
        self.count = 0

    def ckplan(self, name: str, *args: str, expect_fail: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        return self.python(name, "-m", "planner.cli", *args, expect_fail=expect_fail, timeout=timeout)

    def python(self, name: str, *args: str, expect_fail: bool = False, timeout: float = 600) -> subprocess.CompletedProcess:
        self.count += 1
        started, cpu = time.monotonic(), _children_cpu_s()
        left = max(10.0, min(timeout, self.deadline - started))
        try:
            if self.fork:
                done = _forked(list(args), cwd=self.work, env=self.env, timeout=left)
            else:
                done = subprocess.run([sys.executable, *args], cwd=self.work, env=self.env, capture_output=True,
                                      text=True, timeout=left, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise Failed(f"{name}: still running after {left:.0f} s") from exc
        log = self.logs / f"{self.count:02d}-{name}.log"
        took = f"{time.monotonic() - started:.1f} s, {_children_cpu_s() - cpu:.1f} CPU-s"
        log.write_text(f"$ {' '.join(args)}\n# exit {done.returncode} after {took}\n"
                       f"{done.stdout}\n--- stderr ---\n{done.stderr}")
        print(f"  {name}: exit {done.returncode} in {took} ({log.name})", flush=True)
        if (done.returncode != 0) != expect_fail:
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
            raise Failed(f"{name}: exit {done.returncode}: {' / '.join(tail)}")
        return done


# What the dry run's commands import, imported once before they are forked (_forked).
PRELOAD = ("torch", "torch._subclasses.fake_tensor", "transformers.models.llama.modeling_llama", "pulp", "highspy",
           "planner.cli", "planner.commands.profile", "planner.commands.solve", "planner.commands.launch",
           "planner.runtime.replay", "planner.profiler.fake")


def preload() -> None:
    """(dry run) Import what every command imports, once, in this process: a fork of it starts
    each command with them loaded, rather than a fresh Python importing torch again (about 4
    CPU seconds of each of the dry run's 19 commands). No torch op runs here, so no thread
    pool is started before a fork."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # the command imports it itself, and says what is missing
            pass


class SharedRankServer:
    """(dry run) One rank fork server for every launch the dry run forks, as the test suite shares
    one (tests/conftest.py _one_rank_server): started here before the first fork, so each forked
    `ckplan launch` borrows it (planner.runtime.launcher.RankServer is this) instead of starting a
    Python of its own and importing torch in it, about 4.5 of a launch's 8 CPU seconds. The server
    reads no thread of this process (select on its pipes), and the dry run's commands run one at a
    time, each waiting for its ranks' ends, so each reads only its own ranks' answers."""

    def __init__(self, server_class, env: dict):
        self._class, self._env, self._server = server_class, env, None

    def available(self) -> bool:
        return self._class.available()

    def start_here(self) -> None:
        self._server = self._class(env=self._env)

    def __call__(self, **kwargs):
        if self._server is None or not _alive(self._server.pid):  # none, or it died: this launch's own
            return self._class(**kwargs)
        return _Borrowed(self._server)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def _alive(pid: int) -> bool:
    """Whether the process is there: in a fork the server is not this process's child, and
    Popen.poll there takes waitpid's ECHILD for an exit (RankServer.running() would say ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _Borrowed:
    def __init__(self, server):
        self.start = server.start

    def close(self) -> None:  # the server outlives the launch: the dry run closes it at its end
        pass


def share_rank_server(env: dict) -> SharedRankServer:
    import planner.runtime.launcher as launcher

    shared = SharedRankServer(launcher.RankServer, env)
    shared.start_here()
    launcher.RankServer = shared
    return shared


def _forked(args: list[str], *, cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python ARGS` (`-m planner.cli ...` or `SCRIPT ...`) in a fork of this process (the dry
    run, after preload()): its own process, folder, environment, arguments, output and exit
    status, as subprocess.run gives them; a timeout kills it and raises subprocess.TimeoutExpired."""
    import tempfile

    from planner.runtime.children import exit_forked, redirect_stdio

    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's frames
            def command() -> int:
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(env)
                redirect_stdio(out.fileno(), err.fileno())
                return _run_in_child(args)

            exit_forked(command)
        deadline = time.monotonic() + timeout
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired([sys.executable, *args], timeout)
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, *args], os.waitstatus_to_exitcode(ended[1]),
                                           out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def _run_in_child(args: list[str]) -> int:
    if args[:2] == ["-m", "planner.cli"]:
        sys.path.insert(0, os.getcwd())  # as `python -m` puts the current folder first
        sys.argv = ["ckplan", *args[2:]]
        from planner.cli import main

        main()
        return 0
    import runpy

    sys.path.insert(0, str(Path(args[0]).resolve().parent))  # as `python SCRIPT` puts its folder first
    sys.argv = list(args)
    runpy.run_path(args[0], run_name="__main__")
    return 0


def _children_cpu_s() -> float:
    """CPU seconds of the finished processes this one started (and theirs: a launch's ranks)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


class Failed(Exception):
    pass


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def within(measured: float | None, predicted: float | None, bound: float) -> str:
    if measured is None or predicted is None or not predicted:
        return "–"
    return "ok" if abs(measured / predicted - 1) <= bound else "OFF"


# ------------------------------------------------------------------ sections


def section_profiles(check: Check, cfg: dict, a: argparse.Namespace) -> dict:
    """One config, three profiles; each layer's kept, transient and times side by side."""
    made = [check.work / name for name in ("measured.json", "fake.json", "analytic.json", "hf_llama.py")]
    if a.reuse and all(path.exists() for path in made):
        print("  profiles: reusing the report folder's (--reuse-profiles)", flush=True)
    else:
        _profile(check, cfg, a)
    kinds = {name: load(check.work / f"{name}.json") for name in ("measured", "fake", "analytic")}
    return {"rows": _rows(kinds), "device": kinds["measured"]["device"]["name"]}


def _profile(check: Check, cfg: dict, a: argparse.Namespace) -> None:
    (check.work / "llama.json").write_text(json.dumps(cfg, indent=1))
    common = ["--seq-len", str(a.seq_len), "--micro-batch-size", "1"]
    # on CPU (the dry run) one thread: the thread timings and the copy beside it are CPU launch facts a GPU
    # run never makes, and the slowest part of the dry run
    threads = ["--threads", "1"] if a.device == "cpu" else []
    check.ckplan("profile-measured", "profile", "--hf-config", "llama.json", *common, "--device", a.device,
                 "--dtype", "bfloat16", "--warmup", str(a.warmup), "--repeats", str(a.repeats), *threads,
                 "--out", "measured.json")
    check.ckplan("profile-fake", "profile", "--hf-config", "llama.json", *common, "--fake", "--device", "cuda",
                 "--gpu", a.gpu, "--dtype", "bfloat16", "--out", "fake.json")
    check.ckplan("profile-analytic", "profile", "--arch-config", "llama.json", *common, "--gpu", a.gpu,
                 "--out", "analytic.json")


def _rows(kinds: dict) -> list[dict]:
    rows = []
    for place in ("first", "block", "last"):
        layers = {name: _layer(profile, place) for name, profile in kinds.items()}
        for field in ("act_bytes", "transient_bytes", "fwd_ms", "bwd_ms"):
            rows.append(_row(f"{layers['measured']['name']}", field, {n: layer[field] for n, layer in layers.items()}))
    block = {name: _layer(profile, "block") for name, profile in kinds.items()}
    options = {name: {o["name"]: o for o in layer.get("recompute_options", [])} for name, layer in block.items()}
    for option in options["measured"]:
        for field in ("kept_bytes", "recompute_ms", "host_bytes"):
            values = {n: opts[option][field] if option in opts else None for n, opts in options.items()}
            if field == "host_bytes" and not any(values.values()):
                continue
            rows.append(_row(f"{block['measured']['name']} {option}", field, values))
    loss = {n: (p.get("loss_bytes"), p.get("loss_ms")) for n, p in kinds.items()}
    rows.append(_row("loss", "loss_bytes", {n: v[0] for n, v in loss.items()}))
    rows.append(_row("loss", "loss_ms", {n: v[1] for n, v in loss.items()}))
    return rows


def _layer(profile: dict, place: str) -> dict:
    layers = profile["layers"]
    return layers[0] if place == "first" else layers[-1] if place == "last" else layers[1]


def _row(layer: str, field: str, values: dict) -> dict:
    measured = values.get("measured")
    return {"layer": layer, "field": field, **values,
            "fake/measured": ratio(values.get("fake"), measured), "analytic/measured": ratio(values.get("analytic"), measured)}


def _hand_plan(check: Check, name: str, stages: list[str], a: argparse.Namespace, *, microbatches: int,
               mem_gib: float) -> str:
    args = ["scripts/mixed_options_plan.py"]
    check.python(f"plan-{name}", str(ROOT / args[0]), "measured.json", "hf_llama.py", f"{name}.yaml",
                 *[f"--stage={stage}" for stage in stages], "--microbatches", str(microbatches),
                 "--mem-gib", f"{mem_gib:.3f}")
    return f"{name}.yaml"


def block_names(check: Check) -> list[str]:
    return [layer["name"] for layer in load(check.work / "measured.json")["layers"][1:-1]]


def section_stage_memory(check: Check, cfg: dict, a: argparse.Namespace) -> dict:
    """Stage 0 of a 4-stage 1F1B plan holds 4 in-flight microbatches of its blocks: replayed
    alone (`ckplan validate`, one process per replay so no allocator cache carries over)."""
    blocks = block_names(check)
    options = {o["name"] for o in _layer(load(check.work / "measured.json"), "block")["recompute_options"]}
    first, rest = blocks[:-2], blocks[-2:]
    rows = []
    # the dry run replays one plan without recompute and one with (its plumbing is the same for
    # every option); on a GPU every option the profile lists
    for option in ("none", "full") if check.dry else ("none", "full", "attn", "mlp-act", "offload"):
        if option not in options:
            rows.append({"plan": option, "skipped": "the measured profile lists no such option"})
            continue
        chosen = ",".join(["embed", *(f"{b}={option}" if option != "none" else b for b in first)])
        stages = (0, 3) if option == "none" else (0,)
        done = [a.reuse and (check.work / f"replay-{option}-{stage}.json").exists() for stage in stages]
        plan = f"stage-{option}.yaml" if all(done) else _hand_plan(
            check, f"stage-{option}", [chosen, *rest, "head"], a, microbatches=8, mem_gib=a.card_gib)
        for stage, kept in zip(stages, done):
            if not kept:
                check.python(f"validate-{option}-{stage}", __file__, "--replay", plan, str(stage),
                             f"replay-{option}-{stage}.json")
            got = load(check.work / f"replay-{option}-{stage}.json")
            rows.append({"plan": option, "stage": stage, **got,
                         "allocated": within(got["peak_bytes"], got["predicted_peak_bytes"], BOUNDS["allocated"]),
                         "reserved": within(got["reserved_bytes"], got["predicted_reserved_bytes"], BOUNDS["reserved"])})
    return {"rows": rows}


def _build_on_the_gpu() -> None:
    """Random init of billions of parameters takes the host minutes and the GPU seconds: the
    replay's model is built on the GPU, then handed to the replay on the host as usual (the
    replay empties the allocator's cache before it measures)."""
    import torch

    import planner.runtime.replay as replay_module

    build = replay_module.build_layers

    def on_the_gpu(*args, **kwargs):
        with torch.device("cuda"):
            layers = build(*args, **kwargs)
        for _, layer in layers:
            layer.to("cpu")
        return layers

    replay_module.build_layers = on_the_gpu


def replay(plan_path: str, stage: int, out: str) -> None:
    """(--replay) One stage of PLAN replayed by `ckplan validate`'s code, its peaks as json."""
    from planner import io
    from planner.runtime.replay import validate_plan

    plan = io.load_plan(Path(plan_path))
    if plan.device.type == "cuda":
        _build_on_the_gpu()
    (check,) = validate_plan(plan, plan_file=plan_path, stage=stage, device=plan.device.type)
    Path(out).write_text(json.dumps({
        "in_flight": check.in_flight, "peak_bytes": check.peak_bytes, "reserved_bytes": check.reserved_bytes,
        "predicted_peak_bytes": check.predicted_peak_bytes, "predicted_reserved_bytes": check.predicted_reserved_bytes,
        "cap_bytes": check.cap_bytes}))


def _launch(check: Check, name: str, plan: str, a: argparse.Namespace, *extra: str, expect_fail: bool = False) -> dict | str:
    backend = "gloo" if check.dry else "nccl"
    done = check.ckplan(f"launch-{name}", "launch", plan, "--device", a.device, "--backend", backend, "--steps",
                        str(a.steps), "--warmup-steps", str(a.warmup), "--report", f"run-{name}.json", *extra,
                        expect_fail=expect_fail)
    if expect_fail:
        return (done.stderr.strip() or done.stdout.strip()).splitlines()[-1]
    report = load(check.work / f"run-{name}.json")
    stage = report["stages"][0]
    predicted, measured = stage.get("predicted") or {}, stage["measured"]
    return {"iteration_ms": report["iteration_ms"], "predicted_iteration_ms": report["predicted_iteration_ms"],
            "peak_bytes": measured["peak_bytes"], "predicted_peak_bytes": predicted.get("peak_bytes"),
            "reserved_bytes": measured.get("reserved_bytes"), "predicted_reserved_bytes": predicted.get("reserved_bytes"),
            "step_ms": measured.get("step_ms"), "predicted_step_ms": predicted.get("step_ms"),
            "cap_bytes": stage["cap_bytes"], "time": within(report["iteration_ms"], report["predicted_iteration_ms"], BOUNDS["time"])}


def _one_stage(option: str, blocks: list[str]) -> list[str]:
    return [",".join(["embed", *(f"{b}={option}" if option != "none" else b for b in blocks), "head"])]


def section_caps(check: Check, cfg: dict, a: argparse.Namespace) -> dict:
    """A cap below the card held by the allocator: the plan made for it fits; the same plan
    held to a cap below its predicted peak fails, naming the stage and its cap."""
    blocks = block_names(check)
    probe = load(check.work / _plan_json(check, "cap-probe", _hand_plan(check, "cap-probe", _one_stage("full", blocks), a,
                                                                      microbatches=4, mem_gib=a.card_gib)))
    need = probe["stages"][0]["predicted"]["reserved_bytes"] or probe["stages"][0]["predicted"]["peak_bytes"]
    fits_gib = need * 1.25 / GIB
    fits = _hand_plan(check, "cap-fits", _one_stage("full", blocks), a, microbatches=4, mem_gib=fits_gib)
    over_gib = need * 0.4 / GIB
    over = _hand_plan(check, "cap-over", _one_stage("full", blocks), a, microbatches=4, mem_gib=over_gib)
    result = {"card_gib": a.card_gib, "fits": _launch(check, "cap-fits", fits, a, "--enforce-cap")}
    result["over"] = {"cap_gib": over_gib, "message": _launch(check, "cap-over", over, a, "--enforce-cap", expect_fail=True)}
    return result


def _plan_json(check: Check, name: str, plan: str) -> str:
    """A plan's yaml as json beside it (yaml is on every machine this runs on)."""
    import yaml

    (check.work / f"{name}.plan.json").write_text(json.dumps(yaml.safe_load((check.work / plan).read_text())))
    return f"{name}.plan.json"


def section_offload(check: Check, cfg: dict, a: argparse.Namespace) -> dict:
    """Activation offload's added time against the profile's, and the optimizer offload with
    its copies overlapped against serial."""
    blocks = block_names(check)
    options = {o["name"] for o in _layer(load(check.work / "measured.json"), "block")["recompute_options"]}
    result: dict = {}
    solve = ["solve", "--profile", "measured.json", "--stages", "1", "--microbatches", "4", "--mem", f"{a.card_gib:.1f}GiB",
             "--offload-optimizer", "--host-mem", "64GiB", "--time-limit", "60", "--precision", "bf16"]
    runs = {}
    for copies in ("overlapped", "serial"):
        check.ckplan(f"solve-opt-{copies}", *solve, "--offload-copies", copies, "--out", f"opt-{copies}.yaml")
        runs[copies] = _launch(check, f"opt-{copies}", f"opt-{copies}.yaml", a)
    result["optimizer"] = {"runs": runs, "serial/overlapped step": ratio(runs["serial"]["step_ms"], runs["overlapped"]["step_ms"]),
                           "predicted serial/overlapped step": ratio(runs["serial"]["predicted_step_ms"],
                                                                     runs["overlapped"]["predicted_step_ms"])}
    if "offload" in options:
        runs = {option: _launch(check, f"act-{option}", _hand_plan(check, f"act-{option}", _one_stage(option, blocks), a,
                                                                   microbatches=4, mem_gib=a.card_gib), a)
                for option in ("none", "offload")}
        added = {kind: runs["offload"][key] - runs["none"][key]
                 for kind, key in (("measured", "iteration_ms"), ("predicted", "predicted_iteration_ms"))}
        result["activations"] = {"runs": runs, "added_ms": added}
    else:
        result["activations"] = {"skipped": "the measured profile lists no offload option (cpu profile)"}
    return result


def section_time(check: Check, cfg: dict, a: argparse.Namespace) -> dict:
    """One rank on NCCL: the plan `ckplan solve` writes for the whole model on this card."""
    check.ckplan("solve-time", "solve", "--profile", "measured.json", "--stages", "1", "--microbatches", "4",
                 "--mem", f"{a.card_gib:.1f}GiB", "--time-limit", "60", "--precision", "bf16", "--out", "time.yaml")
    result = {"one_rank": _launch(check, "time", "time.yaml", a)}
    result["stages_on_one_gpu"] = ("not run: `ckplan launch` places one rank per GPU (NCCL refuses two ranks "
                                   "on one device), and this machine has one")
    return result


SECTIONS = {"profiles": section_profiles, "stage_memory": section_stage_memory, "caps": section_caps,
            "offload": section_offload, "time": section_time}


# ------------------------------------------------------------------ report


def fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int) and abs(value) >= 1 << 20:
        return f"{value / 2**20:,.1f} MiB"
    return str(value)


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU check: {env.get('device')} (torch {env.get('torch')}, CUDA {env.get('cuda')}), {report['date']}",
             "", f"mode: {'dry run on CPU (tiny shapes)' if report['dry_run'] else 'GPU'}; config: {report['config']}",
             f"bounds ckplan states: allocated ±{BOUNDS['allocated']:.0%}, reserved ±{BOUNDS['reserved']:.0%}, "
             f"time ±{BOUNDS['time']:.0%}", ""]
    for name, result in report["sections"].items():
        lines += [f"## {name} ({result.get('seconds', 0):.0f} s)", ""]
        if "error" in result:
            lines += [f"ERROR: {result['error']}", ""]
            continue
        lines += _section_lines(name, result) + [""]
    return "\n".join(lines)


def _table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + \
        ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]


def _section_lines(name: str, result: dict) -> list[str]:
    if name == "profiles":
        return _table(["layer", "field", "measured", "fake", "analytic", "fake/measured", "analytic/measured"],
                      [[r["layer"], r["field"], r.get("measured"), r.get("fake"), r.get("analytic"), r["fake/measured"],
                        r["analytic/measured"]] for r in result["rows"]])
    if name == "stage_memory":
        return _table(["plan", "stage", "in flight", "allocated pred", "allocated meas", "alloc", "reserved pred",
                       "reserved meas", "res"],
                      [[r["plan"], r.get("stage"), r.get("in_flight"), r.get("predicted_peak_bytes"), r.get("peak_bytes"),
                        r.get("allocated", r.get("skipped")), r.get("predicted_reserved_bytes"), r.get("reserved_bytes"),
                        r.get("reserved")] for r in result["rows"]])
    runs = {}
    if name == "caps":
        runs["cap-fits"] = result["fits"]
        extra = [f"over: a cap of {int(result['over']['cap_gib'] * GIB):,} B: {result['over']['message']}"]
    elif name == "offload":
        runs.update({f"act-{k}": v for k, v in result["activations"].get("runs", {}).items()})
        runs.update({f"opt-{k}": v for k, v in result["optimizer"]["runs"].items()})
        extra = [f"activation offload adds (ms/iteration): {result['activations'].get('added_ms', result['activations'].get('skipped'))}",
                 f"optimizer step serial/overlapped: measured {fmt(result['optimizer']['serial/overlapped step'])}, "
                 f"predicted {fmt(result['optimizer']['predicted serial/overlapped step'])}"]
    else:
        runs["one-rank"] = result["one_rank"]
        extra = [f"several stages: {result['stages_on_one_gpu']}"]
    rows = [[k, v["iteration_ms"], v["predicted_iteration_ms"], v["time"], v["step_ms"], v["predicted_step_ms"],
             v["peak_bytes"], v["predicted_peak_bytes"], v["reserved_bytes"], v["predicted_reserved_bytes"], v["cap_bytes"]]
            for k, v in runs.items()]
    return _table(["run", "iter ms", "pred ms", "time", "step ms", "pred step", "alloc", "pred alloc", "reserved",
                   "pred reserved", "cap"], rows) + [""] + extra


def environment_facts(dry: bool) -> dict:
    import torch

    facts = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if torch.cuda.is_available() and not dry:
        props = torch.cuda.get_device_properties(0)
        facts.update(device=props.name, memory_gib=props.total_memory / GIB, sms=props.multi_processor_count)
    else:
        facts.update(device="cpu", memory_gib=None)
    return facts


def gpu_kind(name: str, memory_gib: float | None) -> str:
    """ckplan's --gpu name for the card (planner's GPU table)."""
    upper = name.upper()
    for word, kind in (("H200", "h200"), ("B200", "b200"), ("MI300X", "mi300x")):
        if word in upper:
            return kind
    if "H100" in upper:
        return "h100-pcie" if "PCIE" in upper else "h100-sxm"
    if "A100" in upper:
        return "a100-80g" if (memory_gib or 0) > 50 else "a100-40g"
    return "h100-sxm"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: the plumbing only (CI)")
    parser.add_argument("--out", type=Path, default=None, help="report folder [default: out/gpu_check or out/gpu_check_dry]")
    parser.add_argument("--wheels", type=Path, default=ROOT / "scripts" / "gpu_wheels")
    parser.add_argument("--fetch-wheels", action="store_true", help="download the wheels into --wheels and stop")
    parser.add_argument("--python-version", default="3.12", help="with --fetch-wheels: the GPU machine's Python")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers of the LLaMA 3 8B-wide model, at least 3 [default: 6; dry run 3]")
    parser.add_argument("--seq-len", type=int, default=None, help="[default: 4096; dry run 32]")
    parser.add_argument("--repeats", type=int, default=None, help="profile repeats [default: 5; dry run 1]")
    parser.add_argument("--steps", type=int, default=None, help="launch steps [default: 5; dry run 1]")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting sections after this many seconds [default: 570; dry run 1200]")
    parser.add_argument("--reuse-profiles", dest="reuse", action="store_true",
                        help="keep the report folder's profiles from an earlier run instead of profiling again")
    parser.add_argument("--spawn", action="store_true",
                        help="dry run: start each command as a new Python process, as the GPU run does, rather than "
                             "a fork of this one with torch and ckplan imported (slower)")
    parser.add_argument("--replay", nargs=3, metavar=("PLAN", "STAGE", "OUT"), help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.replay:
        return replay(a.replay[0], int(a.replay[1]), a.replay[2])
    if a.fetch_wheels:
        return fetch_wheels(a.wheels, a.python_version)
    unknown = set(a.sections.split(",")) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"gpu_check: unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    work = (a.out or ROOT / "out" / ("gpu_check_dry" if a.dry_run else "gpu_check")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"[setup] report folder {work}", flush=True)
    env = environment(a.wheels, work / "site")
    sys.path[:0] = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
    facts = environment_facts(a.dry_run)
    if not a.dry_run and facts["device"] == "cpu":
        raise SystemExit("gpu_check: torch sees no CUDA device; run with --dry-run on a machine without one")
    a.device = "cpu" if a.dry_run else "cuda"
    a.seq_len = a.seq_len or (32 if a.dry_run else 4096)
    a.repeats = a.repeats or (1 if a.dry_run else 5)
    a.layers = a.layers or (3 if a.dry_run else 6)
    if a.layers < 3:
        raise SystemExit("gpu_check: --layers must be at least 3 (stage 0 of the replayed plan gets all but the last two)")
    a.steps = a.steps or (1 if a.dry_run else 5)
    a.warmup = 1 if a.dry_run else 2
    a.budget_s = a.budget_s or (1200 if a.dry_run else 570)
    a.gpu = gpu_kind(facts["device"], facts["memory_gib"])
    a.card_gib = (facts["memory_gib"] or 8.0) * 0.95
    cfg = llama_config(a.dry_run, a.layers)
    fork = a.dry_run and not a.spawn and hasattr(os, "fork")
    if fork:
        preload()
        shared = share_rank_server(env)
    check = Check(work, env, dry=a.dry_run, budget_s=a.budget_s, fork=fork)
    report = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "dry_run": a.dry_run,
              "environment": {**facts, "gpu_kind": a.gpu},
              "config": f"LLaMA 3 8B widths, {a.layers} layers, seq {a.seq_len}, micro-batch 1, bf16"
              if not a.dry_run else f"toy LLaMA, {a.layers} layers, seq {a.seq_len}, bf16", "sections": {}}
    for name in a.sections.split(","):
        section_started = time.monotonic()
        if section_started > check.deadline:
            report["sections"][name] = {"error": f"not run: past --budget-s {a.budget_s:.0f}", "seconds": 0}
            continue
        print(f"[{name}] ({section_started - started:.0f} s in)", flush=True)
        try:
            result = SECTIONS[name](check, cfg, a)
        except (Failed, KeyError, ValueError, FileNotFoundError) as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = time.monotonic() - section_started
        report["sections"][name] = result
        (work / "gpu_check.json").write_text(json.dumps(report, indent=1))
        (work / "gpu_check.md").write_text(markdown(report))
    if fork:
        shared.close()
    errors = [name for name, result in report["sections"].items() if "error" in result]
    print(f"[done] {time.monotonic() - started:.0f} s; report {work / 'gpu_check.md'}"
          + (f"; sections with errors: {', '.join(errors)}" if errors else ""), flush=True)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
