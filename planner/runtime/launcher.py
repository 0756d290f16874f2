"""Run a plan: one process per pipeline stage, measured, summed up in a RunReport.

`run_plan` is what `ckplan launch` and `ckplan compare` call. Locally it starts one
`planner.runtime.worker` process per stage (gloo on CPU, NCCL on CUDA, rendezvous on
127.0.0.1 and a free port), watches them, and the moment one fails it kills the rest
and raises one sentence naming the stage. Under torchrun (RANK, WORLD_SIZE,
MASTER_ADDR, LOCAL_RANK set) this process is one rank and joins that job instead.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

import planner
from planner.errors import UserError
from planner.io import file_ref, plan_to_yaml, write_atomic
from planner.models.timelimit import time_limit
from planner.placement import placement_threads
from planner.runtime.checks import Prepared, check_runnable, prepare, resolve_model_file
from planner.runtime.children import child_env, guarded
from planner.runtime.forkserver import ForkedRank, RankServer
from planner.runtime.heartbeat import Beat, find_stall, read_beat, stage_name, working_rank
from planner.runtime.worker import (
    Failure,
    Job,
    RankResult,
    describe_failure,
    rank_device,
    train_rank,
)
from planner.schema import (
    DeviceInfo,
    FileRef,
    Plan,
    RunReport,
    StageMeasured,
    StagePlan,
    StageReport,
)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")
POLL_S = 0.05
WATCH_S = 0.5  # how often the launcher reads the ranks' heartbeats
CAUSE_GRACE_S = 5.0  # how long a broken connection waits for the failure it echoes to be seen
START_TIMEOUT_S = 120.0  # from launch until every rank trains: imports, build_model, rendezvous
PROGRESS_TIMEOUT_S = 20.0  # a forward, backward, loss or optimizer step longer than this is a hang
# A rank's first act, before importing torch takes seconds: die with the launcher however it
# dies (planner/runtime/children.CHILD_GUARD: PR_SET_PDEATHSIG and a thread watching the
# launcher's pid), and leave if it already has. Then run the worker.
RANK_BOOTSTRAP = guarded("from planner.runtime.worker import main\nmain()\n")


def run_plan(
    plan: Plan,
    *,
    plan_file: str | Path | None = None,
    strategy: str = "ckplan",
    steps: int = 10,
    warmup_steps: int = 2,
    device: str = "cpu",
    backend: str | None = None,
    enforce_cap: bool = False,
    seed: int = 0,
    force: bool = False,
    timeout_s: float = 60.0,
    state_dir: str | Path | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    progress_timeout_s: float | None = None,
    threads: int | None = None,
    on_steps: Callable[[int, int], None] | None = None,
    rank_server: RankServer | None = None,
    spawn: bool = False,
) -> RunReport:
    """Train `steps` measured steps of one strategy of `plan` and report what happened.

    strategy: "ckplan" runs plan.stages; a baseline's name runs that baseline's stages
    and compares with its prediction. plan_file: where the plan was read from (relative
    model paths resolve against it; the report pins its hash). Raises UserError for a
    bad plan before any process starts, and for a failed rank after all are stopped.
    start_timeout_s bounds start-up (until every rank trains); a rank that works on one
    forward, backward, loss or optimizer step for longer than progress_timeout_s (default:
    the larger of PROGRESS_TIMEOUT_S and ten times the slowest predicted stage), or whose
    process stops running that long, has hung: the job ends naming it (local runs only).
    timeout_s: the process group's own timeout. threads: torch threads per rank (default:
    rank_threads, never more than the cores; given, it may oversubscribe them).
    on_steps(done, total): told as the slowest rank finishes each training step (local runs).
    Local ranks are forked from rank_server (forkserver.py: torch imported once, not once per
    rank), from one started for this run where none is given; spawn=True (or a platform without
    fork) starts each as a new Python instead.
    """
    if steps < 1 or warmup_steps < 0:
        raise UserError("--steps must be at least 1 and --warmup-steps at least 0")
    check_runnable(plan)  # before the model file is looked for: what no model file would change
    model_path = resolve_model_file(plan, plan_file)
    with time_limit(start_timeout_s, f"checking the plan against {model_path.name} (importing it, build_model() on "
                    "the meta device)", model_path, option="--start-timeout"):
        prepared = prepare(plan, plan_file=plan_file, strategy=strategy, force=force)
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    threads, threads_source = rank_threads(plan, threads)
    with _terminate_like_interrupt(), tempfile.TemporaryDirectory(prefix="ckplan-run-") as scratch:
        job = Job(
            model_file=str(prepared.model_path),
            plan=plan,
            stages=prepared.strategy.stages,
            steps=steps,
            warmup_steps=warmup_steps,
            device=device,
            backend=backend,
            enforce_cap=enforce_cap,
            seed=seed,
            threads=threads,
            timeout_s=timeout_s,
            out_dir=scratch,
            state_dir=str(state_dir) if state_dir is not None else None,
        )
        _check_devices(device, backend, plan.setup.pipeline.stages * plan.setup.data_parallel.dp, local=not in_torchrun())
        if in_torchrun():
            results = _join_torchrun(job.model_copy(update={"log_progress": False}))
        else:
            watch = _Watch(start_timeout_s, progress_timeout_s or default_progress_timeout_s(job.stages),
                           dp=plan.setup.data_parallel.dp, on_steps=on_steps)
            results = _run_local(job, watch, rank_server=rank_server, spawn=spawn or not RankServer.available())
    return _report(plan, prepared, job, results, plan_file=plan_file, threads_source=threads_source)


def rank_server(start_timeout_s: float = START_TIMEOUT_S) -> AbstractContextManager[RankServer | None]:
    """A fork server several runs share (compare's rounds: run_plan(rank_server=...)), or None
    where ranks cannot be forked (each run then spawns its own)."""
    return RankServer(start_timeout_s=start_timeout_s) if RankServer.available() else nullcontext()


def in_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_ENV)


def rank_threads(plan: Plan, threads: int | None = None) -> tuple[int, str]:
    """Torch threads per rank and where the number came from: `threads` when given (it may
    oversubscribe the cores); else placement.placement_threads: the profile's threads when
    every rank (stages x dp) can have them, else the cores shared evenly among the ranks."""
    if threads:
        return threads, "option"
    return placement_threads(plan.device.threads, plan.setup.pipeline.stages * plan.setup.data_parallel.dp, os.cpu_count() or 1)


def _check_devices(device: str, backend: str, num_stages: int, *, local: bool) -> None:
    if backend == "nccl" and device != "cuda":
        raise UserError("the nccl backend needs --device cuda; use --backend gloo on cpu")
    if device != "cuda":
        return
    if not torch.cuda.is_available():
        raise UserError("--device cuda but this torch sees no CUDA device; use --device cpu")
    if local and torch.cuda.device_count() < num_stages:
        raise UserError(f"the plan has {num_stages} ranks (stages x dp) but this machine has "
                        f"{torch.cuda.device_count()} GPUs; one rank runs per GPU (or use torchrun across machines)")


# ---------------------------------------------------------------- local processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class _Watch:
    """How long a local run may take to start, and to make progress once it trains."""

    start_timeout_s: float
    progress_timeout_s: float
    dp: int = 1  # ranks per stage: rank r runs stage r // dp
    on_steps: Callable[[int, int], None] | None = None  # (steps every rank has done, of all), as they advance


def default_progress_timeout_s(stages: list[StagePlan]) -> float:
    """PROGRESS_TIMEOUT_S, or ten times the slowest predicted stage (one microbatch's
    forward + backward, or its optimizer step) where that is longer: slow is not hung."""
    slowest_ms = max((max(stage.predicted.time_ms, stage.predicted.step_ms) for stage in stages if stage.predicted),
                     default=0.0)
    return max(PROGRESS_TIMEOUT_S, 10 * slowest_ms / 1000)


def _run_local(job: Job, watch: _Watch, *, rank_server: RankServer | None = None,
               spawn: bool = False) -> list[RankResult]:
    out_dir = Path(job.out_dir)
    job_path = out_dir / "job.json"
    write_atomic(job_path, job.model_dump_json())
    num_ranks = len(job.stages) * job.plan.setup.data_parallel.dp
    env = {
        **child_env(dict(os.environ)),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(num_ranks),
        "OMP_NUM_THREADS": str(job.threads),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(planner.__file__).parent.parent),
                                                    os.environ.get("PYTHONPATH")])),
    }
    procs: list[subprocess.Popen | ForkedRank] = []
    server = None if spawn or rank_server is not None else RankServer(env=env, start_timeout_s=watch.start_timeout_s)
    try:
        for rank in range(num_ranks):
            procs.append(_start_rank(job_path, {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                     out_dir / f"rank{rank}.log", server=None if spawn else rank_server or server))
        _supervise(procs, out_dir, watch)
    finally:
        for proc in procs:
            _end(proc)
        for proc in procs:
            proc.wait()
        if server is not None:
            server.close()
    return [RankResult.model_validate_json((out_dir / f"rank{rank}.json").read_text()) for rank in range(num_ranks)]


def _start_rank(job_path: Path, env: dict[str, str], log_path: Path, *,
                server: RankServer | None) -> subprocess.Popen | ForkedRank:
    """One rank, in its own session (what it starts ends with it: _end), its output in log_path:
    forked from `server`, or a new Python where there is none."""
    if server is not None:
        return server.start(job_path, env=env, log_path=log_path)
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-c", RANK_BOOTSTRAP, str(job_path)], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _end(proc: subprocess.Popen | ForkedRank) -> None:
    """Kill a rank and whatever it started (its process group: a model file's own processes,
    data loader workers), whether or not the rank itself already ended."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.kill()


def _supervise(procs: list[subprocess.Popen | ForkedRank], out_dir: Path, watch: _Watch) -> None:
    """Wait for all ranks; as soon as one fails, or one stops making progress (its
    heartbeat), raise (the caller kills the rest). A rank that exits 0 without its
    result has failed too."""
    launched = time.time()
    shown = (0, 0)
    next_watch = time.monotonic() + WATCH_S
    beats: dict[int, Beat | None] = dict.fromkeys(range(len(procs)))  # the last beat read well
    while True:
        codes = [proc.poll() for proc in procs]
        if any(code not in (None, 0) or (code == 0 and not _finished(rank, out_dir))
               for rank, code in enumerate(codes)):
            raise UserError(_failure_message(_await_cause(procs, codes, out_dir, watch.dp), out_dir, watch.dp))
        finished = all(code == 0 for code in codes)
        look = finished or time.monotonic() >= next_watch  # a short run may end before the first look
        if look:
            next_watch = time.monotonic() + WATCH_S
            for rank in beats:
                beats[rank] = read_beat(out_dir / f"rank{rank}.beat") or beats[rank]
        if finished:
            _tell_steps(watch, beats, codes, shown)
            return
        if look:
            running = {rank: beats[rank] for rank, code in enumerate(codes) if code is None}
            shown = _tell_steps(watch, beats, codes, shown)
            stall = find_stall(running, now=time.time(), launched=launched, start_timeout_s=watch.start_timeout_s,
                               progress_timeout_s=watch.progress_timeout_s, dp=watch.dp)
            if stall is not None:
                rank, message = stall
                raise UserError(f"{message}; all stages were stopped "
                                f"(log of {stage_name(rank, watch.dp)}: {_keep_log(rank, out_dir)})")
        time.sleep(POLL_S)


def _tell_steps(watch: _Watch, beats: dict[int, Beat | None], codes: list[int | None],
                shown: tuple[int, int]) -> tuple[int, int]:
    """Tell watch.on_steps the steps every rank has done (a rank that finished has done
    them all), when that changed; returns what was told."""
    totals = [beat.steps[1] for beat in beats.values() if beat is not None and beat.steps[1]]
    if watch.on_steps is None or not totals:
        return shown
    done = min(max(totals) if code == 0 else (beats[rank].steps[0] if beats[rank] is not None else 0)
               for rank, code in enumerate(codes))
    if (done, max(totals)) != shown:
        watch.on_steps(done, max(totals))
    return done, max(totals)


def _finished(rank: int, out_dir: Path) -> bool:
    return (out_dir / f"rank{rank}.json").is_file()


def _failures(codes: list[int | None], out_dir: Path, dp: int = 1) -> list[Failure]:
    """Each failed rank's failure: the one it reported, or its death (exit code, signal)."""
    failures = []
    for rank, code in enumerate(codes):
        error_file = out_dir / f"rank{rank}.error.json"
        if error_file.is_file():
            failures.append(Failure.model_validate_json(error_file.read_text()))
        elif code not in (None, 0) or (code == 0 and not _finished(rank, out_dir)):
            failures.append(Failure(rank=rank, message=_death(rank, code, out_dir, dp), peer=False, time=time.time()))
    return failures


def _await_cause(procs: list[subprocess.Popen | ForkedRank], codes: list[int | None], out_dir: Path,
                 dp: int = 1) -> list[int | None]:
    """The ranks' exit codes once a failure of a rank's own is among them, or CAUSE_GRACE_S on: a rank that sees
    its peer's connection close can report it before the peer's death is reaped (a killed rank's exit is seen
    later than its neighbour's error), and the message names the cause, not the echo."""
    deadline = time.monotonic() + CAUSE_GRACE_S
    while not any(not failure.peer for failure in _failures(codes, out_dir, dp)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        codes = [proc.poll() for proc in procs]
    return codes


def _failure_message(codes: list[int | None], out_dir: Path, dp: int = 1) -> str:
    """The cause, not the echoes: a rank whose error is not a broken connection to a
    failed peer, earliest first."""
    cause = min(_failures(codes, out_dir, dp), key=lambda failure: (failure.peer, failure.time))
    running = {rank: read_beat(out_dir / f"rank{rank}.beat") for rank, code in enumerate(codes) if code is None}
    busy = working_rank(running, now=time.time()) if cause.peer else None
    if busy is not None:
        rank, doing = busy
        return (f"{stage_name(rank, dp)} stopped making progress (in {doing}) and its neighbours timed out waiting "
                f"for it; all stages were stopped (log of {stage_name(rank, dp)}: {_keep_log(rank, out_dir)})")
    hint = " (no stage reported an error of its own: one may have hung or lost its connection)" if cause.peer else ""
    return (f"{cause.message}{hint}; all stages were stopped "
            f"(log of {stage_name(cause.rank, dp)}: {_keep_log(cause.rank, out_dir)})")


def _keep_log(rank: int, out_dir: Path) -> Path:
    """Copy a rank's log out of the scratch folder (which is removed) for the user."""
    keep = Path(tempfile.mkdtemp(prefix="ckplan-failed-"))
    shutil.copy(out_dir / f"rank{rank}.log", keep / f"rank{rank}.log")
    return keep / f"rank{rank}.log"


def _death(rank: int, code: int, out_dir: Path, dp: int = 1) -> str:
    stage = stage_name(rank, dp)
    if code < 0:
        return f"{stage} died ({signal.Signals(-code).name})"
    lines = [line for line in (out_dir / f"rank{rank}.log").read_text(errors="replace").splitlines() if line.strip()]
    last = f": {lines[-1].strip()[:300]}" if lines else ""
    if code == 0:
        return (f"{stage} exited with code 0 before finishing its steps (something in the model file ended "
                f"the process, e.g. os._exit(0)); the last line of its log{last or ' is empty'}")
    return f"{stage} exited with code {code} before reporting{last}"


@contextmanager
def _terminate_like_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler or `kill` stopping the launcher) ends the run as Ctrl-C does:
    the ranks are killed, the scratch folder removed, one sentence, a non-zero exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: let the clean-up finish
        raise UserError("terminated (SIGTERM): all stages were stopped and no output was written")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------- torchrun


def _join_torchrun(job: Job) -> list[RankResult]:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    wanted = len(job.stages) * job.plan.setup.data_parallel.dp
    if world_size != wanted:
        raise UserError(f"torchrun started {world_size} processes for a plan of {len(job.stages)} stages x dp "
                        f"{job.plan.setup.data_parallel.dp}; use --nproc-per-node/--nnodes so that WORLD_SIZE is {wanted}")
    try:
        result = train_rank(job, rank, world_size, rank_device(job.device, int(os.environ["LOCAL_RANK"])),
                            keep_group=True)
        gathered: list[object] = [None] * world_size
        dist.all_gather_object(gathered, result.model_dump())
        dist.destroy_process_group()
    except Exception as exc:
        raise UserError(describe_failure(exc, rank=rank, job=job).message) from exc
    return [RankResult.model_validate(item) for item in gathered]


# ---------------------------------------------------------------- report


def _report(plan: Plan, prepared: Prepared, job: Job, results: list[RankResult], *,
            plan_file: str | Path | None, threads_source: str) -> RunReport:
    per_step = [max(steps) for steps in zip(*(result.step_ms for result in results), strict=True)]
    stages = [_stage_report(plan, prepared, [result for result in results if result.stage == index])
              for index in range(len(prepared.strategy.stages))]
    return RunReport(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        plan=file_ref(plan_file) if plan_file is not None else _in_memory_ref(plan),
        strategy=prepared.strategy.name,
        device=DeviceInfo(type=job.device, name=results[0].device_name, threads=job.threads),
        threads_source=threads_source,
        backend=job.backend,
        steps=job.steps,
        warmup_steps=job.warmup_steps,
        microbatches=plan.setup.pipeline.microbatches,
        iteration_ms=statistics.median(per_step),
        iteration_ms_all=per_step,
        predicted_iteration_ms=prepared.strategy.predicted_iteration_ms,
        losses=_replica_mean_losses(results),
        stages=stages,
    )


def _stage_report(plan: Plan, prepared: Prepared, results: list[RankResult]) -> StageReport:
    """One stage over its data-parallel ranks: the largest memory of any of them, the
    times of the first (they run the same work)."""
    first = min(results, key=lambda result: result.dp_index)
    return StageReport(
        index=first.stage,
        cap_bytes=plan.setup.pipeline.mem_caps_bytes[first.stage],
        predicted=prepared.strategy.stages[first.stage].predicted,
        measured=StageMeasured(peak_bytes=max(result.peak_bytes for result in results), fwd_ms=first.fwd_ms,
                               bwd_ms=first.bwd_ms, time_ms=first.fwd_ms + first.bwd_ms, step_ms=first.optimizer_ms,
                               chunks=first.chunks,
                               static_bytes=max(result.static_bytes for result in results),
                               host_bytes=max(result.host_bytes for result in results),
                               reserved_bytes=max((r.reserved_bytes for r in results if r.reserved_bytes is not None),
                                                  default=None)),
    )


def _replica_mean_losses(results: list[RankResult]) -> list[float]:
    """Every step's loss over the whole batch: the mean of the replicas' last stages (each the
    mean of its microbatches, the same count on each), the ranks that report losses (a V
    schedule's last stage is on rank 0)."""
    per_replica = [result.losses for result in results if result.losses]
    return [sum(step) / len(step) for step in zip(*per_replica, strict=True)]


def _in_memory_ref(plan: Plan) -> FileRef:
    return FileRef(file="(in memory)", sha256=hashlib.sha256(plan_to_yaml(plan).encode()).hexdigest())

