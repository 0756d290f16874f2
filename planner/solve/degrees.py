"""The whole job's degrees as one small record (torchtitan's ParallelDims, as data), and the
complete enumeration of them for N GPUs, a global batch and a model: every tensor-parallel
degree (with and without sequence parallelism) that divides a node and the model's heads,
every pipeline degree that divides what is left and the layers can fill, every micro-batch
size that divides a replica's share of the batch, every ZeRO stage over every shard group
(HSDP), for a mixture of experts every expert-parallel degree and, where the runtime runs
it, every context-parallel degree whose 2·cp load-balanced chunks divide the sequence, each schedule asked
at each chunk count the layers admit, and where asked optimizer offload. Nothing here scores;
planner/solve/jobsearch.py bounds and solves what this lists."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.schema import CHUNKED_SCHEDULES, MAX_MICROBATCHES

ONE_CHUNK_SCHEDULES = ("1F1B", "GPipe")
# the schedules a JobShape tries unless told; `ckplan search` adds interleaved-1F1B where the runtime's
# record runs it (default_schedules)
DEFAULT_SCHEDULES = ("1F1B",)
# the chunked schedule real jobs run at PP > 1 (Megatron-LM's virtual pipeline, torchtitan's Interleaved1F1B;
# published: B2 at VP 5, T15-T17 at VP 8)
INTERLEAVED = "interleaved-1F1B"


def default_schedules(runs: tuple[str, ...]) -> tuple[str, ...]:
    """The schedules searched unless --schedules names them: 1F1B, and interleaved-1F1B where the runtime
    runs it (`runs`: its record's pipeline_schedules). ZB, ZBV, DualPipeV and GPipe by name only."""
    return ("1F1B",) + ((INTERLEAVED,) if INTERLEAVED in runs else ())


@dataclass(frozen=True)
class Degrees:
    """One configuration of the whole job: the parallel degrees, the batch's split, the schedule.
    gpus = tp x cp x pp x dp; ep splits the dp ranks (expert parallelism lives inside them, as
    Megatron-LM and torchtitan place it); the global batch = dp x micro_batch_size x microbatches."""

    tp: int  # tensor parallel, inside a node
    sp: bool  # sequence parallelism over the tensor-parallel group
    pp: int  # pipeline stages (ranks); each holds `chunks` stages
    dp: int  # data-parallel replicas
    micro_batch_size: int
    microbatches: int  # per replica per iteration
    schedule: str = "1F1B"
    chunks: int = 1
    zero: int = 0
    # ZeRO's shard group, ranks of the dp x cp holding the same weights (HSDP: dp x cp / shard_group
    # replicas); None: all of them
    shard_group: int | None = None
    ep: int = 1
    cp: int = 1  # context parallel: each replica's sequences split over cp ranks (placed after tp)
    # the optimizer's state, master weights and step on the host (DeepSpeed's offload_optimizer, ZeRO 1-3)
    offload: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def as_dict(self) -> dict:
        return asdict(self)

    def key(self) -> tuple:
        """A total order among configurations (ties in time broken by it): the fields in order,
        an unset shard group (all dp ranks) as the dp degree."""
        return tuple(self.dp if v is None else v for v in asdict(self).values())

    def label(self) -> str:
        """A short name: tp8sp pp8 dp16 z1/16 mbs2x16 1F1B."""
        tp = f"tp{self.tp}{'sp' if self.sp else ''}"
        zero = f"z{self.zero}" + (f"/{self.shard_group}" if self.zero and self.shard_group not in (None, self.dp) else "")
        sched = self.schedule + (f"x{self.chunks}" if self.chunks > 1 else "")
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        off = " offload" if self.offload else ""
        return f"{tp}{cp} pp{self.pp} dp{self.dp} {zero}{off}{ep} mbs{self.micro_batch_size}x{self.microbatches} {sched}"


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass(frozen=True)
class JobShape:
    """What the enumeration needs to know of the job and the model."""

    gpus: int
    gpus_per_node: int
    global_batch: int  # sequences per iteration
    seq_len: int
    num_layers: int  # the profile's pipeline layers (decoder blocks, embedding, head)
    tp_ok: tuple[int, ...]  # tensor-parallel degrees the model's heads and widths allow
    num_experts: int = 0  # routed experts (0: dense)
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    # for the chunked schedules (ZBV and DualPipeV: 2 always); None: every count the layers admit (chunk_counts)
    chunks: tuple[int, ...] | None = (2,)
    # the decoder blocks among the layers (None: not known, a profile's layers of other kinds)
    num_blocks: int | None = None
    micro_batch_sizes: tuple[int, ...] | None = None  # None: every divisor of a replica's batch
    fixed_tp: tuple[int, bool] | None = None  # a given profile: its (tp, sp)
    fixed_micro_batch_size: int | None = None  # a given profile: its micro-batch size
    # context-parallel degrees to try ((1,): none, where the runtime runs no context parallelism);
    # each is kept where it divides the GPUs left by tp and its 2·cp chunks divide the sequence
    cp_ok: tuple[int, ...] = (1,)
    # expert-parallel degrees to try (None: every one dividing the dp ranks and the experts); a given
    # analytic profile's times hold at the ep it was made at only (formulas.Shape.ep)
    ep_ok: tuple[int, ...] | None = None
    # optimizer offload to try (False, True): DeepSpeed's offload_optimizer where the runtime is DeepSpeed's and
    # the profile times the host's step; offload goes with ZeRO 1-3 only (its ZeRO-Offload needs a stage > 0)
    offload_ok: tuple[bool, ...] = (False,)


def tensor_choices(job: JobShape) -> list[tuple[int, bool]]:
    """(tp, sp): every degree inside a node that divides the GPUs and the model allows; SP with
    it from 2 on (where the sequence divides)."""
    if job.fixed_tp is not None:
        return [job.fixed_tp]
    found = []
    for tp in divisors(job.gpus_per_node):
        if job.gpus % tp or tp not in job.tp_ok:
            continue
        found.append((tp, False))
        if tp > 1 and job.seq_len % tp == 0:
            found.append((tp, True))
    return found


def context_choices(job: JobShape, tp: int, sp: bool) -> list[int]:
    """Context-parallel degrees for (tp, sp): dividing the GPUs left by tp, the sequence into 2·cp
    load-balanced chunks (Megatron-LM and torch's context_parallel both need it), and under SP each
    rank's seq / cp tokens over tp."""
    return [cp for cp in job.cp_ok
            if job.gpus % (tp * cp) == 0 and (cp == 1 or job.seq_len % (2 * cp) == 0)
            and (not sp or (job.seq_len // cp) % tp == 0)]


def schedule_choices(job: JobShape, pp: int) -> list[tuple[str, int]]:
    """(schedule, chunks) for `pp` ranks: the one-chunk schedules as they are; a chunked one
    with each chunk count whose pp x chunks stages the layers can fill (ZBV, DualPipeV: 2)."""
    found = []
    for schedule in job.schedules:
        if schedule in ONE_CHUNK_SCHEDULES:
            found.append((schedule, 1))
            continue
        if pp == 1:
            continue
        counts = (2,) if schedule in ("ZBV", "DualPipeV") else chunk_counts(job, pp)
        found += [(schedule, c) for c in counts if c >= 2 and pp * c <= job.num_layers]
    return found


def chunk_counts(job: JobShape, pp: int) -> tuple[int, ...]:
    """The chunk counts tried at `pp` ranks: those given, else every count from 2 whose pp x chunks virtual
    stages take the decoder blocks evenly, the same number each (Megatron-LM's rule without a layout:
    transformer_block.py 156-181 asserts num_layers % pp == 0 and the rank's layers % vp == 0 at d98e8a64;
    torchtitan splits such a count evenly too, and any other within one layer: framework-facts §252), where the
    blocks are known; else every count whose stages the profile's layers fill, one layer at least each."""
    if job.chunks is not None:
        return job.chunks
    if job.num_blocks:
        return tuple(v for v in range(2, job.num_blocks // pp + 1) if job.num_blocks % (pp * v) == 0)
    return tuple(range(2, job.num_layers // pp + 1))


def zero_choices(dp: int, ep: int, cp: int = 1) -> list[tuple[int, int | None]]:
    """ZeRO 0 unsharded; ZeRO 1-3 over every shard group of 2 or more of the dp x cp ranks that hold
    the same weights, dividing them (that ep divides: the experts shard over group / ep; that cp
    divides: a group takes whole context-parallel groups, as torchtitan's dp_shard x cp mesh and
    Megatron-LM's distributed optimizer over DP x CP do), None for the group of all of them."""
    ranks = dp * cp
    if ranks == 1:
        return [(0, None)]
    groups = [k for k in divisors(ranks) if k >= 2 and k % ep == 0 and k % cp == 0]
    return [(0, None)] + [(zero, None if k == ranks else k) for zero in (1, 2, 3) for k in groups]


def enumerate_degrees(job: JobShape) -> list[Degrees]:
    """Every configuration of the job, complete over the degrees that divide the GPUs, the
    layers (a pipeline of at most as many stages as layers: the exact solver splits them
    unevenly where they do not divide) and the batch."""
    found = []
    for tp, sp in tensor_choices(job):
        for cp in context_choices(job, tp, sp):
            found += _with_tp_cp(job, tp, sp, cp)
    return found


def _with_tp_cp(job: JobShape, tp: int, sp: bool, cp: int) -> list[Degrees]:
    found = []
    for pp in divisors(job.gpus // (tp * cp)):
        if pp > job.num_layers:
            continue
        dp = job.gpus // (tp * cp * pp)
        if job.global_batch % dp:
            continue
        per_replica = job.global_batch // dp
        for mbs in _micro_batch_sizes(job, per_replica):
            microbatches = per_replica // mbs
            if microbatches > MAX_MICROBATCHES:
                continue
            for schedule, chunks in schedule_choices(job, pp):
                if not _schedule_takes(schedule, pp, microbatches):
                    continue
                for ep in _expert_choices(job, dp):
                    for zero, group in zero_choices(dp, ep, cp):
                        found += [Degrees(tp=tp, sp=sp, pp=pp, dp=dp, micro_batch_size=mbs,
                                          microbatches=microbatches, schedule=schedule, chunks=chunks,
                                          zero=zero, shard_group=group, ep=ep, cp=cp, offload=offload)
                                  for offload in job.offload_ok if zero or not offload]
    return found


def _micro_batch_sizes(job: JobShape, per_replica: int) -> list[int]:
    if job.fixed_micro_batch_size is not None:
        return [job.fixed_micro_batch_size] if per_replica % job.fixed_micro_batch_size == 0 else []
    sizes = divisors(per_replica)
    return [m for m in sizes if job.micro_batch_sizes is None or m in job.micro_batch_sizes]


def _expert_choices(job: JobShape, dp: int) -> list[int]:
    if not job.num_experts:
        return [1]
    return [e for e in divisors(dp) if job.num_experts % e == 0 and (job.ep_ok is None or e in job.ep_ok)]


def _schedule_takes(schedule: str, pp: int, microbatches: int) -> bool:
    """The schedules' own rules on the microbatches: 1F1B at least one per stage (torch's
    Schedule1F1B and ckplan's setup refuse fewer); the chunked ones a multiple of the ranks
    (torch's interleaved schedules require microbatches % pp == 0)."""
    if schedule == "1F1B":
        return microbatches >= pp
    if schedule in CHUNKED_SCHEDULES:
        return microbatches >= pp and microbatches % pp == 0
    return True


def differences(a: Degrees, b: Degrees) -> list[str]:
    """What makes `a` differ from `b`, field by field: ["tp 8→4", "mbs 1→2"]."""
    short = {"micro_batch_size": "mbs", "microbatches": "M", "shard_group": "group"}
    out = []
    for field, value in a.as_dict().items():
        other = getattr(b, field)
        if value != other:
            name = short.get(field, field)
            out.append(f"{name} {_word(value)}→{_word(other)}")
    return out


def _word(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "all" if value is None else str(value)
