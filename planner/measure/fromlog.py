"""What a training log already says about memory and step time, read from the lines Megatron-LM
and torchtitan print, and set against a prediction term by term (pure functions: text in,
numbers out; no I/O).

Formats, read in their code:
- Megatron-LM (NVIDIA/Megatron-LM d98e8a64ddf3, 2026-08-22). megatron/training/utils/common_utils.py
  report_memory prints, on data-parallel rank 0 of each (TP, PP) position,
  `[Rank N] (after K iterations) memory (MB) | allocated: A | max allocated: B | reserved: C |
  max reserved: D` (torch.cuda.memory_allocated and friends / 2^20); training.py training_log calls
  it after the first iterations ("after optimizer state has been initialized"): A, the bytes still
  allocated after a step, is what the step keeps between steps: weights, gradient buffers and
  optimizer state, the static memory. training_log prints ` iteration I/ T | ... | elapsed time per
  iteration (ms): E |` (and ` throughput per GPU (TFLOP/s/GPU): F |` with --log-throughput,
  FLOPs by its own num_floating_point_operations).
- torchtitan (pytorch/torchtitan 238fa9953e4a). torchtitan/components/metrics.py
  MetricsProcessor.log prints `step: S  loss: L  grad_norm: G  memory: M GiB(P%)  tps: T  tflops: F
  mfu: U%`, colour codes around the fields; M is reserved_bytes.all.peak since the last log / 2^30
  (DeviceMemoryMonitor.get_peak_stats; the allocated peak goes to TensorBoard only); T is tokens
  of this rank / (seconds x non-data-parallel size), i.e. tokens/s per GPU. Since f113706c4
  (2026-02-28; b5bcd76c metrics.py 488-493, 526) U is `N/A` when a Float8 or MX converter is on (its
  MFU would be of the BF16 peak): the line is read, its MFU left to the tokens/s.
Global rank -> pipeline rank: both frameworks place the pipeline outermost (Megatron-LM's default
order tp-cp-ep-dp-pp, torchtitan's mesh pp, dp_replicate, dp_shard, cp, tp), so pipeline rank =
rank // (world / pp).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from planner.errors import UserError

MIB = 1 << 20
GIB = 1 << 30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_MEGATRON_MEMORY = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+) "
    r"\| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
_MEGATRON_ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([\d.]+)")
_TITAN_STEP = re.compile(
    r"(?:\[rank(\d+)\]:)?.*?step:\s*(\d+)\s+loss:\s*[-\d.naif]+\s+(?:grad_norm:\s*[-\d.naif]+\s+)?"
    r"memory:\s*([\d.]+)\s*GiB\(([\d.]+)%\)\s+tps:\s*([\d,]+)\s+tflops:\s*([\d,.]+)\s+mfu:\s*(?:([\d.]+)%|N/A)")


@dataclass
class RankLog:
    """What the log says of one global rank (None: it does not print that)."""

    rank: int
    static_bytes: int | None = None  # allocated after a step (Megatron)
    peak_bytes: int | None = None  # max allocated (Megatron)
    reserved_bytes: int | None = None  # max reserved
    after_iterations: int | None = None


@dataclass
class Log:
    framework: str
    ranks: dict[int, RankLog] = field(default_factory=dict)
    iteration_ms: float | None = None  # median over the steps after the first logged
    tokens_per_s_per_gpu: float | None = None  # torchtitan prints it
    mfu: float | None = None  # torchtitan prints it (Megatron-LM does not: derived from tokens/s)
    tflops_per_gpu: float | None = None  # as the framework counts FLOPs (Megatron-LM's set against its own count)
    steps: int = 0


def parse(text: str) -> Log | None:
    """The log's memory and step lines, in whichever of the two formats it has; None: neither."""
    text = _ANSI.sub("", text)
    if _MEGATRON_MEMORY.search(text) or _MEGATRON_ITERATION.search(text):
        return _megatron(text)
    if _TITAN_STEP.search(text):
        return _torchtitan(text)
    return None


def _megatron(text: str) -> Log:
    log = Log(framework="megatron")
    for match in _MEGATRON_MEMORY.finditer(text):
        rank, after = int(match.group(1)), int(match.group(2))
        allocated, peak, _, reserved = (_number(text, match, k) for k in (3, 4, 5, 6))
        known = log.ranks.get(rank)
        if known is None or after >= (known.after_iterations or 0):  # the latest: optimizer state in
            log.ranks[rank] = RankLog(rank=rank, static_bytes=round(allocated * MIB), peak_bytes=round(peak * MIB),
                                      reserved_bytes=round(reserved * MIB), after_iterations=after)
    times, tflops = [], []
    for line in text.splitlines():
        match = _MEGATRON_ITERATION.search(line)
        if match:
            times.append(_number(line, match, 2))
            found = _MEGATRON_TFLOPS.search(line)
            if found:
                tflops.append(_number(line, found, 1))
    log.steps = len(times)
    steady = times[1:] or times  # the first logged iteration carries the start-up
    log.iteration_ms = statistics.median(steady) if steady else None
    if tflops:
        log.tflops_per_gpu = statistics.median(tflops[1:] or tflops)
    return log


def _number(text: str, match: re.Match, group: int) -> float:
    """The figure in `match`'s group (thousands separated by commas read whole); a field the patterns take that is
    no number ('30.0.1', '.': two ranks' lines run together) refused in one sentence with its line, never a
    traceback."""
    written = match.group(group)
    try:
        return float(written.replace(",", ""))
    except ValueError:
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        line = text[start:end if end >= 0 else len(text)].strip()
        raise UserError(f"the log's line {line[:160]!r} gives {written!r} where a number is printed; give the log as "
                        "the framework wrote it") from None


def _torchtitan(text: str) -> Log:
    log = Log(framework="torchtitan")
    tps, mfu, tflops, reserved = [], [], [], {}
    for line in text.splitlines():
        match = _TITAN_STEP.search(line)
        if not match:
            continue
        rank = int(match.group(1) or 0)
        reserved.setdefault(rank, []).append(_number(line, match, 3))
        tps.append(_number(line, match, 5))
        tflops.append(_number(line, match, 6))
        if match.group(7) is not None:  # N/A: a quantized run's (f113706c4)
            mfu.append(_number(line, match, 7) / 100)
    for rank, values in reserved.items():  # the peak since the last log line: the highest of the run
        log.ranks[rank] = RankLog(rank=rank, reserved_bytes=round(max(values) * GIB))
    log.steps = len(tps)
    if tps:
        log.tokens_per_s_per_gpu = statistics.median(tps[1:] or tps)
        log.mfu = statistics.median(mfu[1:] or mfu) if mfu else None
        log.tflops_per_gpu = statistics.median(tflops[1:] or tflops)
    return log


@dataclass(frozen=True)
class Residual:
    """One term on one pipeline rank: predicted, as logged, and how far apart."""

    rank: int | None  # pipeline rank; None: the whole job
    term: str
    predicted: float
    logged: float | None  # None: the log does not print it

    @property
    def error(self) -> float | None:
        """(logged - predicted) / predicted."""
        return None if self.logged is None or not self.predicted else (self.logged - self.predicted) / self.predicted


@dataclass(frozen=True)
class Prediction:
    """What a plan or config predicts, per pipeline rank and for the job."""

    static_bytes: list[int]
    peak_bytes: list[int]
    reserved_bytes: list[int | None]
    iteration_ms: float
    tokens_per_s_per_gpu: float
    mfu: float | None  # None: not known (a plan whose profile records no architecture)
    world: int  # GPUs of the job
    tokens_per_gpu_step: float  # tokens one GPU's data-parallel rank takes per step / the non-dp size
    # Megatron-LM's "throughput per GPU" by its own FLOPs count (planner/profiler/throughput.py); None: not known
    megatron_tflops_per_gpu: float | None = None


def pipeline_rank(rank: int, *, world: int, pp: int) -> int:
    return rank // (world // pp)


def residuals(log: Log, prediction: Prediction) -> list[Residual]:
    """Per pipeline rank the memory terms the log prints (the largest over the ranks of that
    stage), then the job's step time, tokens/s and MFU."""
    pp = len(prediction.static_bytes)
    logged: dict[int, list[RankLog]] = {}
    for rank in log.ranks.values():
        if rank.rank < prediction.world:
            logged.setdefault(pipeline_rank(rank.rank, world=prediction.world, pp=pp), []).append(rank)
    out = []
    for stage in range(pp):
        ranks = logged.get(stage, [])
        out += [Residual(stage, "static", prediction.static_bytes[stage], _most(ranks, "static_bytes")),
                Residual(stage, "allocated peak", prediction.peak_bytes[stage], _most(ranks, "peak_bytes")),
                Residual(stage, "reserved peak", prediction.reserved_bytes[stage] or 0, _most(ranks, "reserved_bytes"))]
    step = log.iteration_ms
    if step is None and log.tokens_per_s_per_gpu:
        step = prediction.tokens_per_gpu_step / log.tokens_per_s_per_gpu * 1e3
    tokens = log.tokens_per_s_per_gpu
    if tokens is None and log.iteration_ms:
        tokens = prediction.tokens_per_s_per_gpu * prediction.iteration_ms / log.iteration_ms
    out += [Residual(None, "step time ms", prediction.iteration_ms, step),
            Residual(None, "tokens/s per GPU", prediction.tokens_per_s_per_gpu, tokens),
            Residual(None, "MFU", prediction.mfu or 0.0, log.mfu if log.mfu is not None else
                     tokens / prediction.tokens_per_s_per_gpu * prediction.mfu if tokens and prediction.mfu else None)]
    if log.framework == "megatron" and log.tflops_per_gpu is not None and prediction.megatron_tflops_per_gpu:
        # the figure a Megatron-LM log prints, by Megatron-LM's count on both sides (§650)
        out.append(Residual(None, "TFLOP/s/GPU", prediction.megatron_tflops_per_gpu, log.tflops_per_gpu))
    return out


def _most(ranks: list[RankLog], attribute: str) -> int | None:
    """The largest of the ranks' values (the ranks of one pipeline stage), None where none prints it."""
    values = [getattr(r, attribute) for r in ranks if getattr(r, attribute) is not None]
    return max(values) if values else None


@dataclass(frozen=True)
class Fit:
    """What the log identifies (name, value, how), and what it cannot."""

    fitted: list[tuple[str, float, str]]
    unidentified: list[str]


def fit(log: Log, found: list[Residual]) -> Fit:
    """The compute scale from the step time (measured / predicted: one factor on every stage's
    compute, the bubble and communication included, which one step time cannot tell apart), and
    per stage the fragmentation share 1 - max allocated / max reserved where the log prints both."""
    fitted, unidentified = [], []
    step = next(r for r in found if r.term == "step time ms")
    if step.logged:
        fitted.append(("compute scale", step.logged / step.predicted,
                       "measured step / predicted step: one factor on the whole step (compute, bubble and "
                       "communication are not told apart by one time)"))
    else:
        unidentified.append("the compute scale: the log prints no step time")
    by_rank: dict[int, dict[str, Residual]] = {}
    for r in found:
        if r.rank is not None:
            by_rank.setdefault(r.rank, {})[r.term] = r
    for rank, terms in sorted(by_rank.items()):
        peak, reserved = terms["allocated peak"].logged, terms["reserved peak"].logged
        if peak and reserved:
            fitted.append((f"fragmentation, rank {rank}", 1 - peak / reserved,
                           "1 - max allocated / max reserved (--fragmentation)"))
    if log.framework == "torchtitan":
        unidentified += ["static memory and the allocated peak: torchtitan prints the reserved peak only "
                         "(its max_active goes to TensorBoard)", "the fragmentation share: no allocated peak to set "
                         "against the reserved one"]
    unidentified += ["activations against the transient and the loss region: the log gives one peak, not its parts",
                     "communication and the pipeline bubble apart from compute"]
    if not any(terms["static"].logged for terms in by_rank.values()) and log.framework == "megatron":
        unidentified.append("static memory: no `(after K iterations) memory` line (pass --log-interval, and keep "
                            "the first iterations' lines)")
    return Fit(fitted=fitted, unidentified=unidentified)
