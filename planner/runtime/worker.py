"""One rank of a pipelined training run: build its stage, train, measure.

Started by the launcher (one process per stage and data-parallel rank, see launcher.RANK_BOOTSTRAP) or called in-process by `run_plan` when torchrun started us. A rank writes
`rank<r>.json` (its measurements) or `rank<r>.error.json` (one sentence) into the
job's folder; the launcher reads them.

Steps: `warmup_steps` untimed, then `steps` timed without the memory tracker, then
`memory_steps` under the tracker (it slows every op, so it never overlaps timing).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleMulti

from planner.cost.schedules import TORCH_CLASSES, build_schedule
from planner.cost.tied import tied_params
from planner.errors import UserError
from planner.io import write_atomic
from planner.models.modelfile import _user_traceback, load_model_file
from planner.runtime.experts import expert_parallel
from planner.runtime.heartbeat import NO_HEARTBEAT, Heartbeat
from planner.runtime.memtrack import PeakMemory
from planner.runtime.mesh import Layout, data_parallel, device_mesh, dp_optimizer, state_tensors
from planner.runtime.offload import OffloadOptimizer, local
from planner.runtime.stagemodule import (
    allocate_grads,
    build_layers,
    stage_module,
    stage_options,
    to_device,
    torch_dtype,
    training_batch,
)
from planner.runtime.tie import Tie, relink, sum_tied_grads, tie_groups
from planner.runtime.timedstage import TimedStage, _sync
from planner.schema import ChunkMeasured, Plan, StagePlan
from planner.units import format_bytes


class Job(BaseModel):
    """What every rank of one run needs; written once by the launcher."""

    model_config = ConfigDict(extra="forbid")

    model_file: str
    plan: Plan
    stages: list[StagePlan]
    steps: int
    warmup_steps: int
    memory_steps: int = 1
    device: Literal["cpu", "cuda"]
    backend: str
    enforce_cap: bool
    seed: int
    threads: int
    timeout_s: float
    out_dir: str  # rank results and errors
    state_dir: str | None = None  # if set: each rank saves its parameters and gradients at the end
    log_progress: bool = True  # a line per phase on stdout (the rank's log file when the launcher started it)


class RankResult(BaseModel):
    rank: int
    stage: int = 0
    dp_index: int = 0
    static_bytes: int = 0  # weights + gradients + optimizer state on the device: the most at once in a step
    host_bytes: int = 0  # the offloaded optimizer's host memory (0 without offload)
    device_name: str
    peak_bytes: int
    reserved_bytes: int | None = None  # cuda: the caching allocator's reserved peak
    fwd_ms: float  # median per microbatch; the last stage's includes the loss forward
    bwd_ms: float  # median per microbatch, recompute included
    chunks: list[ChunkMeasured] = []  # the same per chunk, a split backward's passes apart
    step_ms: list[float]  # wall time of schedule.step + optimizer step, between barriers
    optimizer_ms: float  # median optimizer step
    losses: list[float]  # the last stage only: mean microbatch loss of every step, in order


class Failure(BaseModel):
    rank: int
    message: str
    peer: bool  # a symptom of another rank's failure (connection closed, timeout), not a cause
    time: float


class CapExceeded(Exception):
    pass


def forget_module_stats(mem: PeakMemory) -> None:
    """The CPU tracker (MemTracker) takes a module run twice in one region for a second
    iteration and refuses it; a stage runs once per microbatch. Its per-module
    statistics are not used here, so clear them before each microbatch (the peak stays)."""
    tracker = getattr(mem, "_tracker", None)
    if tracker is not None:
        tracker.reset_mod_stats()


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _quiet(message: str) -> None:
    pass


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def rank_device(device_type: str, local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")


def train_rank(job: Job, rank: int, world_size: int, device: torch.device, *, keep_group: bool = False,
               heartbeat: Heartbeat = NO_HEARTBEAT) -> RankResult:
    """Join the process group, train this rank's stage, measure. keep_group: leave the
    group up for the caller (torchrun gathers results over it). heartbeat: where the rank
    says what it does (the launcher watches it)."""
    torch.set_num_threads(job.threads)
    stage = Layout.of(job.plan.setup).stage_of(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if job.enforce_cap:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, job.plan.setup.pipeline.mem_caps_bytes[stage] / total), device)
    with heartbeat.phase("joining the process group", working=False):
        dist.init_process_group(
            job.backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=job.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    result = _train(job, rank, world_size, device, heartbeat)
    if not keep_group:
        dist.destroy_process_group()
    return result


@dataclass
class _Rank:
    """One rank's stages, ready to train: `step()` runs one schedule step + optimizer step.
    1F1B and GPipe give a rank one stage; the chunked schedules several (its chunks, chunk 0
    first), all run by one schedule and stepped by one optimizer."""

    module: torch.nn.Module  # all the rank's layers (its chunks' modules share them)
    optimizer: torch.optim.Optimizer | None  # None: the stage has no parameters
    stages: list[TimedStage]
    schedule: Schedule1F1B | ScheduleGPipe | PipelineScheduleMulti
    ties: list[Tie]  # parameters shared with other stages
    host_bytes: Callable[[], int]  # the offloaded optimizer's host memory
    reduce_grads: Callable[[], None]  # the data-parallel gradient average after the schedule (ZeRO 0/1)
    sharded: bool  # FSDP2 (ZeRO 2/3): gradients set to None between steps, as FSDP2 holds them
    inputs: torch.Tensor | None  # the whole batch, first stage only
    targets: torch.Tensor | None  # last stage only

    @property
    def stage(self) -> TimedStage:
        """The rank's first chunk: it times the optimizer and says what the rank does."""
        return self.stages[0]

    @property
    def has_first(self) -> bool:
        return any(stage.is_first for stage in self.stages)

    @property
    def has_last(self) -> bool:
        return any(stage.is_last for stage in self.stages)

    def set(self, **values) -> None:
        """Set the same attributes on every chunk's stage."""
        for stage in self.stages:
            for name, value in values.items():
                setattr(stage, name, value)

    def step(self) -> list[float]:
        """The mean microbatch loss on the last stage, nothing elsewhere."""
        self.module.zero_grad(set_to_none=self.sharded)
        losses: list[torch.Tensor] = []
        args = (self.inputs,) if self.has_first else ()
        kwargs = {"target": self.targets, "losses": losses} if self.has_last else {}
        self.schedule.step(*args, return_outputs=False, **kwargs)
        if len(self.stages) > 1:  # the mean over microbatches, as one stage's schedule scales it
            for param in self.module.parameters():
                if param.grad is not None:
                    param.grad.div_(self.schedule._n_microbatches)
        with self.stage.timed(self.stage.optimizer_ms):
            # collectives: a rank here waits for its replicas and tied peers, it does not compute
            with self.stage.heartbeat.phase("the gradient reduction (a wait for the other replicas or stages)",
                                            working=False):
                self.reduce_grads()
                sum_tied_grads(self.ties)  # part of the step: it lets every copy of a tied weight take the same one
            if self.optimizer is not None:
                with self.stage.heartbeat.phase("the optimizer step", working=True):
                    self.optimizer.step()
        for stage in self.stages:
            stage.step_index += 1
        return [torch.stack(losses).mean().item()] if losses else []

    def held_before_step(self) -> list:
        """What exists before a step and lives through it: the tracker must be told. ZeroRedundancyOptimizer keeps its
        partition's state in its local optimizer (`optim`), its own `state` empty, which is all MemTracker's
        track_external reads (torch 2.13 mem_tracker.py 743-752): that one told too, as static_bytes counts it
        (§898; an offloaded one's host copies are not on the device)."""
        inner = getattr(self.optimizer, "optim", None)
        local_state = [inner] if isinstance(inner, torch.optim.Optimizer) and not isinstance(inner, OffloadOptimizer) \
            else []
        return [self.module, self.optimizer, *local_state, self.inputs, self.targets,
                *(buffer for stage in self.stages for buffer in stage.recv_buffers())]

    def fwd_ms(self) -> float:
        """Median per microbatch of each chunk's forward, summed over the chunks, with the loss."""
        return sum(_median(stage.fwd_ms) + _median(stage.loss_ms) for stage in self.stages)

    def bwd_ms(self) -> float:
        """Median per microbatch of each chunk's backward (both halves where split), summed."""
        return sum(_median(stage.bwd_ms) + _median(stage.weight_grad_ms) for stage in self.stages)

    def chunk_times(self) -> list[ChunkMeasured]:
        """Each chunk's medians apart: the schedule's actions F, B or I, and W."""
        return [ChunkMeasured(stage=stage.stage_index, fwd_ms=_median(stage.fwd_ms) + _median(stage.loss_ms),
                              bwd_ms=_median(stage.bwd_ms), weight_grad_ms=_median(stage.weight_grad_ms))
                for stage in self.stages]


def rank_chunks(stage_plan: StagePlan) -> list[list[str]]:
    """The rank's layer ranges, chunk 0 first (one, its layers, under 1F1B and GPipe)."""
    return [list(chunk) for chunk in stage_plan.chunks] or [list(stage_plan.layers)]


def _build(job: Job, rank: int, world_size: int, device: torch.device, heartbeat: Heartbeat) -> _Rank:
    setup = job.plan.setup
    layout = Layout.of(setup)
    index, dp_index = layout.stage_of(rank), layout.dp_index_of(rank)
    mesh = device_mesh(layout, device.type) if layout.dp > 1 else None
    with heartbeat.phase(f"importing {Path(job.model_file).name}", working=True):
        model_file = load_model_file(job.model_file)
    dtype = torch_dtype(job.plan.dtype)
    stage_plan = job.stages[index]
    with heartbeat.phase(f"build_model() of {Path(job.model_file).name}", working=True):
        layers = build_layers(model_file, seed=job.seed, keep=stage_plan.layers)
    by_name = dict(layers)
    options = stage_options(stage_plan)
    module = stage_module([(fqn, by_name[fqn]) for fqn in stage_plan.layers], options=options)
    module.to(device=device, dtype=dtype)
    expert_parallel(module, setup, device_type=device.type)  # every rank: it creates the expert groups
    chunks = rank_chunks(stage_plan)
    # a chunk's module shares the rank module's layers: one set of weights, gradients, optimizer
    chunk_modules = [module] if len(chunks) == 1 else [
        stage_module([(fqn, by_name[fqn]) for fqn in chunk], options={n: options[n] for n in chunk if n in options})
        for chunk in chunks]
    ties = tie_groups(module, tied_params(layers), [stage.layers for stage in job.stages], index,
                      pipelines=layout.pipelines(), dp_index=dp_index)
    del layers, by_name  # the other stages' layers are freed
    wrapped, reduce_grads = module, _no_reduction
    if mesh is not None:
        wrapped, reduce_grads = data_parallel(module, zero=setup.data_parallel.zero, mesh=mesh)
        ties = relink(ties, module)
    sharded = isinstance(wrapped, FSDPModule)  # FSDP2 reduces into gradient shards: kept none between steps
    if not sharded:
        allocate_grads(module)
    optimizer = dp_optimizer(setup.training.optimizer, module, zero=setup.data_parallel.zero, offload=setup.data_parallel.offload, mesh=mesh,
                             overlap=setup.data_parallel.offload_overlap)
    pp_group = mesh["pp"].get_group() if mesh else None
    if len(chunks) == 1:
        stages = [TimedStage(wrapped, index, layout.stages, device, group=pp_group)]
    else:
        order = build_schedule(setup.pipeline.schedule, num_ranks=layout.stages,
                               num_microbatches=setup.pipeline.microbatches, num_chunks=len(chunks))
        stages = [TimedStage(chunk_module, stage_index, order.num_stages, device, group=pp_group)
                  for chunk_module, stage_index in zip(chunk_modules, order.stages_of(index), strict=True)]
    for stage, chunk_module in zip(stages, chunk_modules):
        stage.stage_module = chunk_module
        stage.microbatch_offset = dp_index * setup.pipeline.microbatches
        stage.reduce_every_microbatch = setup.data_parallel.zero_gather == "per-microbatch"
        stage.seed = job.seed
    last = next((stage for stage in stages if stage.is_last), stages[0])
    loss_fn = last.timed_loss(model_file.loss_fn)
    schedule_class = TORCH_CLASSES[setup.pipeline.schedule]
    if len(stages) == 1:
        schedule = schedule_class(stages[0], n_microbatches=setup.pipeline.microbatches, loss_fn=loss_fn)
    else:
        # scaled once below, not per stage: a parameter two chunks share (a V's tied embedding
        # and head on rank 0) would be divided by the microbatches twice
        schedule = schedule_class(stages, n_microbatches=setup.pipeline.microbatches, loss_fn=loss_fn,
                                  scale_grads=False)
    inputs, targets = replica_batch(model_file, setup, dp_index, seed=job.seed)
    torch.manual_seed(job.seed)
    run = _Rank(module, optimizer, stages, schedule, ties, partial(_host_bytes, optimizer), reduce_grads, sharded,
                inputs=None, targets=None)
    run.inputs = to_device(inputs, device, dtype) if run.has_first else None
    run.targets = to_device(targets, device, dtype) if run.has_last else None
    return run


def _no_reduction() -> None:
    pass


def replica_batch(model_file, setup, dp_index: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This replica's contiguous slice of the global batch (dp x microbatches x micro_batch_size
    samples, as one process draws it), copied out: a view would keep the whole global batch
    alive on every replica, dp x the slice the cost model charges (rules.batch_bytes)."""
    inputs, targets = training_batch(model_file, setup.pipeline.micro_batch_size * setup.pipeline.microbatches * setup.data_parallel.dp, seed=seed)
    dp = setup.data_parallel.dp
    return inputs.tensor_split(dp)[dp_index].clone(), targets.tensor_split(dp)[dp_index].clone()


def _host_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    return inner.host_bytes() if isinstance(inner, OffloadOptimizer) else 0


def static_bytes(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Weights + gradients + optimizer state on this rank's device now: every storage they
    use, once (FSDP2's shards and what it holds gathered, ZeroRedundancyOptimizer's own
    partition); an offloaded optimizer's host copies are not on the device."""
    tensors = state_tensors(module)
    inner = getattr(optimizer, "optim", optimizer)
    if inner is not None and not isinstance(inner, OffloadOptimizer):
        tensors += [local(value) for state in inner.state.values() for value in state.values()
                    if isinstance(value, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.device.type != "meta"}
    return sum(storages.values())


def _train(job: Job, rank: int, world_size: int, device: torch.device, heartbeat: Heartbeat) -> RankResult:
    run = _build(job, rank, world_size, device, heartbeat)
    index = Layout.of(job.plan.setup).stage_of(rank)
    run.set(heartbeat=heartbeat)
    heartbeat.training()
    log = _log if job.log_progress else _quiet
    log(f"stage {index} (rank {rank}): built {len(job.stages[index].layers)} layers; training")
    losses: list[float] = []
    total_steps = job.warmup_steps + job.steps + job.memory_steps
    for done in range(1, job.warmup_steps + 1):
        losses += run.step()
        heartbeat.stepped(done, total_steps)
    step_ms = []
    run.set(recording=True)
    for done in range(job.warmup_steps + 1, job.warmup_steps + job.steps + 1):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        losses += run.step()
        _sync(device)
        dist.barrier()
        step_ms.append((time.perf_counter() - start) * 1000)
        heartbeat.stepped(done, total_steps)
    run.set(recording=False)
    log(f"stage {index} (rank {rank}): timed {job.steps} steps, median {_median(step_ms):.1f} ms; measuring memory")
    peak_bytes, reserved = 0, None
    static = [static_bytes(run.module, run.optimizer)]  # between steps, and after every microbatch below
    run.set(after_chunk=lambda: static.append(static_bytes(run.module, run.optimizer)))
    for done in range(total_steps - job.memory_steps + 1, total_steps + 1):  # apart from timing: the tracker slows every op
        # several chunks: tensors only (a split backward's autograd.grad refuses the module hooks)
        with PeakMemory(device, external=run.held_before_step(), module_hooks=len(run.stages) == 1) as mem:
            run.set(before_forward=partial(forget_module_stats, mem))
            losses += run.step()
            run.set(before_forward=None)
        peak_bytes = max(peak_bytes, mem.peak_bytes)
        if mem.reserved_bytes is not None:
            reserved = max(reserved or 0, mem.reserved_bytes)
        heartbeat.stepped(done, total_steps)
    run.set(after_chunk=None)
    log(f"stage {index} (rank {rank}): peak {format_bytes(peak_bytes)}")
    cap = job.plan.setup.pipeline.mem_caps_bytes[index]
    if job.enforce_cap and peak_bytes > cap:
        raise CapExceeded(f"stage {index} exceeded its cap of {format_bytes(cap)} (peak {format_bytes(peak_bytes)})")
    if job.state_dir:
        _save_state(run.module, Path(job.state_dir) / f"stage{rank}.pt")
    return RankResult(
        rank=rank,
        stage=index,
        dp_index=run.stage.microbatch_offset // job.plan.setup.pipeline.microbatches,
        static_bytes=max(static),
        host_bytes=run.host_bytes(),
        device_name=device_name(device),
        peak_bytes=peak_bytes,
        reserved_bytes=reserved,
        fwd_ms=run.fwd_ms(),
        bwd_ms=run.bwd_ms(),
        chunks=run.chunk_times(),
        step_ms=step_ms,
        optimizer_ms=_median(run.stage.optimizer_ms),
        losses=losses,
    )


def _save_state(module: torch.nn.Module, path: Path) -> None:
    params = {name: p.detach().cpu() for name, p in module.named_parameters()}
    grads = {name: p.grad.detach().cpu() for name, p in module.named_parameters() if p.grad is not None}
    torch.save({"params": params, "grads": grads}, path)


# ---------------------------------------------------------------- failures


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: pipelining wraps a layer's error in its own RuntimeError."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner


_PEER_SIGNS = ("connection closed", "connection reset", "broken pipe", "timed out", "timeout", "socket")


def _is_peer_failure(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, dist.DistError) or any(sign in text for sign in _PEER_SIGNS)


def describe_failure(exc: BaseException, *, rank: int, job: Job) -> Failure:
    """One sentence naming the stage and the error, no traceback."""
    root = _root_cause(exc)
    layout = Layout.of(job.plan.setup)
    cap = format_bytes(job.plan.setup.pipeline.mem_caps_bytes[layout.stage_of(rank)])
    who = f"stage {layout.stage_of(rank)}" + (f" (rank {rank})" if layout.dp > 1 else "")
    peer = False
    if isinstance(root, CapExceeded):
        message = str(root)
    elif isinstance(root, torch.OutOfMemoryError) and job.enforce_cap:
        message = f"{who} exceeded its cap of {cap} (out of memory)"
    elif isinstance(root, UserError):
        message = f"{who} failed: {root}"
    elif isinstance(root, KeyboardInterrupt):
        message = f"{who} was interrupted"
    else:
        peer = _is_peer_failure(root)
        detail = _user_traceback(root, Path(job.model_file)).strip().splitlines()[0]
        message = f"{who} failed: {detail[:300]}"
    return Failure(rank=rank, message=message, peer=peer, time=time.time())


def main() -> None:
    job = Job.model_validate_json(Path(sys.argv[-1]).read_text())
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out_dir = Path(job.out_dir)
    code = 0
    try:
        with Heartbeat(out_dir / f"rank{rank}.beat") as heartbeat:
            result = train_rank(job, rank, world_size, rank_device(job.device, int(os.environ["LOCAL_RANK"])),
                                heartbeat=heartbeat)
        write_atomic(out_dir / f"rank{rank}.json", result.model_dump_json())
    except BaseException as exc:  # a rank reports every failure as one sentence, then dies
        traceback.print_exc()  # the full story stays in the rank's log
        failure = describe_failure(exc, rank=rank, job=job)
        write_atomic(out_dir / f"rank{rank}.error.json", failure.model_dump_json())
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a half-dead process group must not hang it


if __name__ == "__main__":
    main()
