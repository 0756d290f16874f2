"""The published-runs scoring harness: docs/published-runs.md's rows made, run and tabled from the repository.

    python scripts/published_rows.py profiles [--remake] [--only M17,C5] [-j N]   # the profiles the rows read
    python scripts/published_rows.py run --out out [--only M17,M18] [-j N]        # each row's terms, OUT/<row>.json
    python scripts/published_rows.py table out [out2]                             # §18's table (before -> after)
    python scripts/published_rows.py split --only M17                             # the iteration, split by term
    python scripts/published_rows.py split --only E4 --terms                      # one microbatch of its slowest stage

The rows, their published figures and sources, the profiles and the `ckplan evaluate` arguments are
scripts/published_rows.toml. Profiles go to --work (default .published-rows/profiles); one made by the same
tree (planner/'s sources) from the same arguments is kept unless --remake. `run` calls `ckplan evaluate` in a
process of its own per row and keeps the hand configuration's cost (the first the cost model returns; ckplan's
own plan, which evaluate searches next, is not run), per stage: static, activations, buffers, transient, step
scratch, workspace, the allocated and reserved peaks, the replayed reserve, after the step, and the iteration.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).with_suffix(".toml")
WORK = ROOT / ".published-rows" / "profiles"
GIB = 2**30
MEMORY_KINDS = ("reserved", "allocated")
ROW_KEYS = {"id", "label", "group", "source", "time_s", "tokens_per_s_per_gpu", "tokens", "gpus", "memory_gib",
            "memory_bytes", "memory_kind", "static_bytes", "profile", "args"}
GROUPS = ("main", "bridge", "deepspeed")  # deepspeed: DeepSpeed's own runs (§25.dsrows), their own table


class HarnessError(Exception):
    """A problem stated in one sentence for the user (bad table, missing profile, a row that failed)."""


@dataclass(frozen=True)
class Row:
    id: str
    label: str
    group: str
    source: str
    time_s: float  # published iteration
    memory_bytes: int | None  # published peak (memory_kind), None: not published
    memory_kind: str | None
    static_bytes: int | None  # published allocated bytes after the optimizer step (Megatron-LM's logs)
    profile: str | None
    args: list[str]  # ckplan evaluate's arguments, --profile left out
    tokens_per_s_per_gpu: float | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Table:
    profiles: dict[str, list[str]]  # name -> ckplan profile's arguments, --out left out
    rows: list[Row]

    def select(self, only: str | None) -> list[Row]:
        if not only:
            return self.rows
        chosen: set[str] = set()
        for name in (w.strip() for w in only.split(",") if w.strip()):
            # an id first (T22 is the hand row, BT22 the Bridge recipe's), else a label's part (M1 of M1/T15)
            ids = [row.id for row in self.rows if row.id == name] or \
                [row.id for row in self.rows if name in row.label.split("/")]
            if not ids:
                raise HarnessError(f"--only names {name}, not a row of {TABLE.name}; rows: "
                                   f"{', '.join(r.id for r in self.rows)}")
            chosen.update(ids)
        return [row for row in self.rows if row.id in chosen]


def expand(text: str, macros: dict[str, str], where: str, depth: int = 0) -> str:
    """`text` with each {NAME} replaced by its macro (macros may use macros) and {blocks:N} by
    layers.0,...,layers.N-1."""
    if depth > 10:
        raise HarnessError(f"{where}: the macros refer to each other in a loop")

    def one(match: re.Match) -> str:
        name, count = match.group(1), match.group(2)
        if name == "blocks" and count is not None:
            return ",".join(f"layers.{i}" for i in range(int(count)))
        if name not in macros or count is not None:
            raise HarnessError(f"{where} uses {{{match.group(0)[1:-1]}}}, which [macros] does not define")
        return expand(macros[name], macros, where, depth + 1)

    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::(\d+))?\}", one, text)


def _row(raw: dict, macros: dict[str, str], profiles: dict) -> Row:
    where = f"{TABLE.name} row {raw.get('id', '?')}"
    unknown = sorted(set(raw) - ROW_KEYS)
    if unknown:
        raise HarnessError(f"{where} has {', '.join(unknown)}, which the harness does not read")
    for key in ("id", "source", "args"):
        if not raw.get(key):
            raise HarnessError(f"{where} gives no {key}")
    if "time_s" in raw:
        time_s, tps, gpus = float(raw["time_s"]), None, None
    elif {"tokens_per_s_per_gpu", "tokens", "gpus"} <= set(raw):
        tps, gpus = float(raw["tokens_per_s_per_gpu"]), int(raw["gpus"])
        time_s = raw["tokens"] / (gpus * tps)
    else:
        raise HarnessError(f"{where} names no published time: give time_s, or tokens_per_s_per_gpu, tokens and gpus")
    memory = raw.get("memory_bytes", round(raw["memory_gib"] * GIB) if "memory_gib" in raw else None)
    kind = raw.get("memory_kind")
    if (memory is None) != (kind is None) or (kind is not None and kind not in MEMORY_KINDS):
        raise HarnessError(f"{where}: a published memory figure needs memory_kind, one of {', '.join(MEMORY_KINDS)}")
    group = raw.get("group", "main")
    if group not in GROUPS:
        raise HarnessError(f"{where}: group {group!r} is not one of {', '.join(GROUPS)}")
    if raw.get("profile") is not None and raw["profile"] not in profiles:
        raise HarnessError(f"{where} reads profile {raw['profile']!r}, which no [profile.NAME] table makes")
    return Row(id=raw["id"], label=raw.get("label", raw["id"]), group=group, source=expand(raw["source"], macros, where),
               time_s=time_s, memory_bytes=memory, memory_kind=kind, static_bytes=raw.get("static_bytes"),
               profile=raw.get("profile"), args=shlex.split(expand(raw["args"], macros, where)),
               tokens_per_s_per_gpu=tps, gpus=gpus)


def load_table(path: Path = TABLE) -> Table:
    """The rows and profiles of `path`, macros expanded; a malformed entry is one HarnessError."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"{path.name} is not valid TOML: {exc}") from None
    macros = {name: str(value) for name, value in data.get("macros", {}).items()}
    profiles = {name: shlex.split(expand(entry["args"], macros, f"profile {name}"))
                for name, entry in data.get("profile", {}).items()}
    rows = [_row(raw, macros, profiles) for raw in data.get("row", [])]
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise HarnessError(f"{path.name} lists row {row.id} twice")
        seen.add(row.id)
    return Table(profiles=profiles, rows=rows)


@functools.cache
def tree_id() -> str:
    """What a profile is made by: planner/'s sources and the data files a profile reads there (the compiled blocks'
    records, planner/profiler/compiled_blocks/*.json), hashed (once a process: the harness never edits them)."""
    digest = hashlib.sha256()
    for path in sorted([*(ROOT / "planner").rglob("*.py"), *(ROOT / "planner").rglob("*.json")]):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _stamp(args: list[str], tree: str) -> dict:
    """A profile's making: the tree, its arguments, and the files they name."""
    files = {a: hashlib.sha256((ROOT / a).read_bytes()).hexdigest()[:16] for a in args if (ROOT / a).is_file()}
    return {"tree": tree, "args": args, "files": files}


def _ckplan(*args: str) -> list[str]:
    return [sys.executable, "-m", "planner.cli", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def make_profiles(table: Table, rows: list[Row], work: Path, *, remake: bool, jobs: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    names = sorted({row.profile for row in rows if row.profile})
    tree = tree_id()

    def make(name: str) -> str:
        out, stamp_path = work / f"{name}.json", work / f"{name}.stamp.json"
        stamp = _stamp(table.profiles[name], tree)
        if not remake and out.exists() and stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
            return f"{name}: kept (made by this tree)"
        start = time.monotonic()
        stamp_path.unlink(missing_ok=True)  # a making that fails leaves no profile to keep
        with open(work / f"{name}.log", "w") as log:
            done = subprocess.run(_ckplan("profile", *table.profiles[name], "--out", str(out)), cwd=ROOT, env=_env(),
                                  stdout=log, stderr=subprocess.STDOUT)
        if done.returncode:
            return f"{name}: FAILED ({work / (name + '.log')})"
        stamp_path.write_text(json.dumps(stamp, indent=1))
        return f"{name}: made in {time.monotonic() - start:.0f} s"

    _each(make, names, jobs, f"profiles ({work})", "(above; each its .log)")


def _each(work_on, items: list, jobs: int, what: str, where: str) -> None:
    """`work_on` each item, `jobs` at a time, printing the line each returns and a count; one error for them
    all where any line says FAILED."""
    start, failed = time.monotonic(), 0
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for line in pool.map(work_on, items):
            failed += "FAILED" in line
            print(line, flush=True)
    print(f"{len(items)} {what} in {time.monotonic() - start:.0f} s{f'; {failed} failed' if failed else ''}")
    if failed:
        raise HarnessError(f"{failed} of {len(items)} {what.split()[0]} failed {where}")


def evaluate_args(row: Row, work: Path) -> list[str]:
    """The row's `ckplan evaluate` arguments with its profile's path."""
    if row.profile is None:
        return list(row.args)
    path = work / f"{row.profile}.json"
    if not path.exists():
        again = "" if work == WORK else f" --work {work}"
        raise HarnessError(f"row {row.id} reads profile {row.profile}, not made in {work}: run "
                           f"`python scripts/published_rows.py profiles{again}` first")
    stamp = work / f"{row.profile}.stamp.json"
    if not stamp.exists() or json.loads(stamp.read_text()).get("tree") != tree_id():
        again = "" if work == WORK else f" --work {work}"
        raise HarnessError(f"row {row.id} reads profile {row.profile}, made by another planner/ than this tree's (or "
                           f"not by the harness): run `python scripts/published_rows.py profiles{again}` first")
    return ["--profile", str(path), *row.args]


class _Captured(Exception):
    """Raised by the spy once the hand configuration is costed: nothing after it is needed."""


def capture_row(row_id: str, work: Path, also: str = ""):
    """capture() of a row of the table by its id, with `also` (ckplan evaluate arguments) after the row's; an
    unknown id is a HarnessError."""
    rows = {row.id: row for row in load_table().rows}
    if row_id not in rows:
        raise HarnessError(f"no row {row_id} in scripts/published_rows.toml")
    return capture(evaluate_args(rows[row_id], work) + shlex.split(also))


def capture(argv: list[str]):
    """`ckplan evaluate ARGV`'s hand configuration: (stages, profile, setup, cost) as the cost model
    was given and returned them (the first `costmodel.evaluate` call, §5's terms.py)."""
    from click.testing import CliRunner

    from planner.cli import cli
    from planner.cost import costmodel

    seen, original = [], costmodel.evaluate

    def spy(stages, profile, setup, *rest, **named):
        seen.append((stages, profile, setup, original(stages, profile, setup, *rest, **named)))
        raise _Captured

    costmodel.evaluate = spy
    try:
        result = CliRunner().invoke(cli, ["evaluate", *argv, "--json"])
    finally:
        costmodel.evaluate = original
    if not seen:
        said = (result.output or "").strip().splitlines() or [repr(result.exception)]
        raise HarnessError(f"ckplan evaluate {shlex.join(argv)} failed: {said[-1]}")
    return seen[0]


def stage_terms(index: int, s) -> dict:
    """One stage's (a rank's, for chunked schedules) terms, in bytes and ms as the cost model holds them."""
    return {"index": index, "static_bytes": s.static_bytes, "activation_bytes": s.activation_bytes,
            "in_flight": s.in_flight, "buffer_bytes": s.buffer_bytes, "transient_bytes": s.transient_bytes,
            "step_scratch_bytes": s.step_scratch_bytes, "workspace_bytes": s.workspace_bytes,
            "nccl_buffers": dict(s.nccl_buffers or {}),
            "peak_bytes": s.peak_bytes, "reserved_bytes": s.reserved_bytes or s.peak_bytes,
            "reserved_by": s.reserved_by, "replayed_reserved_bytes": s.replayed_reserved_bytes,
            "cap_replay": s.cap_replay, "uncapped_reserved_bytes": s.uncapped_reserved_bytes,
            "after_step_bytes": s.after_step_bytes, "step_end_bytes": s.step_end_bytes, "cap_bytes": s.cap_bytes,
            "fits": s.fits, "time_ms": s.time_ms, "step_ms": s.step_ms, "comm_ms": s.comm_ms}


def run_row(row: Row, work: Path) -> dict:
    argv = evaluate_args(row, work)
    _, _, _, cost = capture(argv)
    return {"id": row.id, "tree": tree_id(), "args": argv, "iteration_s": cost.iteration_ms / 1e3,
            "feasible": cost.feasible, "stages": [stage_terms(i, s) for i, s in enumerate(cost.stages)]}


def split(row: Row, work: Path, *, terms: bool = False) -> dict:
    """The row's iteration split by term (split_terms) as `ckplan evaluate` costs its hand configuration; with
    `terms`, one microbatch of its slowest stage (microbatch_terms)."""
    return (microbatch_terms if terms else split_terms)(row.id, *capture(evaluate_args(row, work)))


def split_terms(row_id: str, stages, profile, setup, cost) -> dict:
    """§5's decompose.py: the bottleneck rank's terms x microbatches, and the rest of the iteration
    as the bubble (the reductions after a stage's last backward with it). Communication on the critical path is
    the tensor-parallel collectives, the pipeline's sends that hold the rank, and context parallelism's K/V exchange
    beyond the attention it overlaps (contextparallel.exchange_ms); torch's ring's own memory-bound kernels (the fp32
    merge, dQ/dK/dV, ring_membound_ms) are their own term; compute is the rest of the stage's time, of which the
    attention core's flash calls under CP (the record's forward, again under a full recompute, and backward) are
    `attention_core_s`. The sends a runtime runs beside the compute (Megatron-core's overlap_p2p_comm:
    chunked.rank_sends_ms) hold no pass of the rank: not in its busy time but `sends_beside_s`, the part of
    `sends_s` the receivers may wait for inside the bubble; its warm-up forwards' sends, which it waits for at
    once, are busy. `fill_drain_s`: the interleaved schedule's fill and drain for equal stages, (P - 1) x the
    bottleneck rank's F + B per microbatch / V (Narayanan et al. 2021), of which the bubble is the rest plus the
    sends' waits and the stages' inequality."""
    from planner.cost import chunked, comm, contextparallel, costmodel

    layers, microbatches = {layer.name: layer for layer in costmodel.layer_costs(profile)}, setup.pipeline.microbatches
    sends = chunked.rank_sends_ms(stages, profile, setup)
    parts = []
    for stage, stage_cost, (beside, warm) in zip(stages, cost.stages, sends):
        options = {name: 1 if stage.recompute.get(name, "none") == "full" else 0 for name in stage.layers}
        tp = sum(comm.layer_comm_ms(layers[name], option, setup) for name, option in options.items())
        cp = sum(contextparallel.exchange_ms(layers[name], option, setup) for name, option in options.items())
        ring = sum(contextparallel.ring_membound_ms(layers[name], option, profile, setup)
                   for name, option in options.items())
        core = sum(_attention_core_ms(layers[name].context_parallel, option) for name, option in options.items())
        parts.append((stage_cost.time_ms - tp - cp - ring, tp, cp, ring, stage_cost.comm_ms - beside, warm,
                      stage_cost.step_ms, core, beside))
    compute, tp, cp, ring, held, warm, step, core, beside = max(
        parts, key=lambda p: microbatches * sum(p[:5]) + p[5] + p[6])
    busy = microbatches * (compute + tp + cp + ring + held) + warm + step
    fill = (setup.pipeline.stages - 1) * (compute + tp + cp + ring + held) / setup.pipeline.chunks
    return {"id": row_id, "iteration_s": cost.iteration_ms / 1e3, "compute_s": microbatches * compute / 1e3,
            "attention_core_s": microbatches * core / 1e3, "tp_comm_s": microbatches * tp / 1e3,
            "cp_exchange_s": microbatches * cp / 1e3, "cp_ring_membound_s": microbatches * ring / 1e3,
            "sends_s": (microbatches * held + warm) / 1e3, "step_and_exposed_dp_s": step / 1e3,
            "bubble_s": (cost.iteration_ms - busy) / 1e3, "sends_beside_s": (microbatches * beside - warm) / 1e3,
            "fill_drain_s": fill / 1e3}


def microbatch_terms(row_id: str, stages, profile, setup, cost) -> dict:
    """One microbatch of the slowest stage (the most time_ms + comm_ms: what a pipeline's steady state repeats) by
    the cost model's own time rows (planner/cost/terms.py): each layer row summed over the stage's layers at their
    recompute options, keyed by the layer's kind (its name without indices) and the term's name, then the rows
    that read the stage's first or last layer or its position; `comm_ms` is the stage's busy time beside them (the
    pipeline's sends). The terms add up to the stage's time_ms: `unsplit_ms` is what they leave (0 while the
    accumulator adds nothing beyond its rows)."""
    from planner.cost import assembly, costmodel, terms

    layers = {layer.name: layer for layer in costmodel.layer_costs(profile)}
    ctx = terms.Context(profile=profile, setup=setup)
    index = max(range(len(cost.stages)), key=lambda s: cost.stages[s].time_ms + cost.stages[s].comm_ms)
    stage, stage_cost = stages[index], cost.stages[index]
    costs = [layers[name] for name in stage.layers]
    split: dict[str, float] = {}
    for layer, option in zip(costs, assembly.option_indices(stage, costs)):
        kind = ".".join(part for part in layer.name.split(".") if not part.isdigit())
        for term in terms._rows("time", "layer"):
            if value := term.value(layer, option, ctx):
                split[f"{kind}: {term.name}"] = split.get(f"{kind}: {term.name}", 0.0) + value
    for where, args in (("open", (costs[0], index)), ("close", (costs[-1], index)), ("stage", (index,))):
        for term in terms._rows("time", where):
            if value := term.value(*args, ctx):
                split[f"{where}: {term.name}"] = split.get(f"{where}: {term.name}", 0.0) + value
    return {"id": row_id, "stage": index, "layers": len(costs), "microbatch_ms": stage_cost.time_ms + stage_cost.comm_ms,
            "time_ms": stage_cost.time_ms, "comm_ms": stage_cost.comm_ms, "terms_ms": split,
            "unsplit_ms": stage_cost.time_ms - sum(split.values())}


def _attention_core_ms(record, option: int) -> float:
    """A block's flash calls under context parallelism (its LayerContextParallel): the forward's, again where the
    block is fully recomputed (option 1), and the backward's; 0 without a record (cp 1, or a layer with none)."""
    if record is None:
        return 0.0
    return record.attention_fwd_ms * (2 if option == 1 else 1) + record.attention_bwd_ms


def run_rows(rows: list[Row], work: Path, out: Path, jobs: int) -> None:
    """Each row in a process of its own (`one`), `jobs` at a time, into OUT/<row>.json."""
    out.mkdir(parents=True, exist_ok=True)
    for row in rows:
        evaluate_args(row, work)  # every profile there before any row starts

    def one(row: Row) -> str:
        start = time.monotonic()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "one", row.id, "--work", str(work),
                               "--out", str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True)
        took = time.monotonic() - start
        if done.returncode:
            said = (done.stderr or done.stdout).strip().splitlines() or ["(nothing said)"]
            return f"{row.id}: FAILED in {took:.0f} s: {said[-1]}"
        return f"{row.id}: {took:.0f} s"

    _each(one, rows, jobs, f"rows ({out})", "(above)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("profiles", "run", "split", "one"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, default=WORK, help=f"the profiles' folder [default: {WORK}]")
        if name != "one":
            p.add_argument("--only", help="rows by id or label, comma-separated (default: every row)",
                           required=name == "split")
        if name in ("profiles", "run"):
            p.add_argument("-j", "--jobs", type=int, default=1, help="processes at once [default: 1]")
    sub.choices["profiles"].add_argument("--remake", action="store_true", help="make every profile again")
    sub.choices["split"].add_argument("--terms", action="store_true",
                                      help="one microbatch of the slowest stage by the cost model's time rows")
    sub.choices["run"].add_argument("--out", type=Path, required=True, help="folder for each row's JSON")
    sub.choices["one"].add_argument("row")
    sub.choices["one"].add_argument("--out", type=Path, required=True)
    table_parser = sub.add_parser("table")
    table_parser.add_argument("folders", type=Path, nargs="+", metavar="DIR", help="OUT, or BEFORE AFTER")
    args = parser.parse_args(argv)
    for name in ("work", "out"):  # the rows run from the repository's root: paths as the user gave them
        if getattr(args, name, None) is not None:
            setattr(args, name, getattr(args, name).resolve())
    try:
        table = load_table()
        if args.command == "profiles":
            make_profiles(table, table.select(args.only), args.work, remake=args.remake, jobs=max(1, args.jobs))
        elif args.command == "run":
            run_rows(table.select(args.only), args.work, args.out, max(1, args.jobs))
        elif args.command == "one":
            (row,) = table.select(args.row)
            (args.out / f"{row.id}.json").write_text(json.dumps(run_row(row, args.work), indent=1) + "\n")
        elif args.command == "split":
            for row in table.select(args.only):
                print(json.dumps(split(row, args.work, terms=args.terms)))
        else:
            if len(args.folders) > 2:
                raise HarnessError("give one results folder, or two (before, after)")
            from published_rows_table import tables  # beside this file

            try:
                print(tables(table.rows, args.folders), end="")
            except ValueError as exc:  # a folder that is not one of results
                raise HarnessError(str(exc)) from None
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
