"""Recompute options against whole layers: what the options buy (predicted iteration) and what
they cost the solver (solve time), on the same profile and cap, in one run.

Cases:
  uniform:LxP   synthetic.uniform_blocks with L layers over P stages, every block given the
                selective options a LLaMA block has (attn, mlp-act, both: tests/test_options_solver.py's
                numbers); the cap 25% of the way from full checkpointing's need to none's
  llama3-70b:CAP  the analytic LLaMA 3 70B (8192 tokens, TP 8 + SP, H100), 4 stages, 16
                microbatches, bf16 mixed, at --mem CAP (decimal GB); --dp/--zero shard it over
                data-parallel ranks, and --host-mem-gb caps a node's host memory (its 8 ranks
                share it), which the offload option's activations count against

For each case and each plan space (options, whole-layer) and solver (dp, milp): the median
solve time over the repeats (search.plan, the baselines not included) and the plan's predicted
iteration, beside the options' plan without offload (a host too small for it). The machine may be
busy: read the ratios within a row.

    .venv/bin/python scripts/bench_options.py [--cases uniform:32x4,uniform:128x16,llama3-70b:60]
        [--repeats 3] [--solvers dp,milp] [--dp N --zero Z] [--host-mem-gb G]

With a host cap the DP refuses (it cannot weigh host bytes); its row says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cost import costmodel  # noqa: E402
from planner.errors import UserError  # noqa: E402
from planner.models import archs, synthetic  # noqa: E402
from planner.profiler import analytic  # noqa: E402
from planner.schema import FileRef, RecomputeOption, TrainSetup  # noqa: E402
from planner.solve import search  # noqa: E402

MIB = 2**20
DEFAULT_CASES = "uniform:32x4,uniform:128x16,llama3-70b:56,llama3-70b:60,llama3-70b:64"
BLOCK_OPTIONS = [("attn", 96, 1.0, 40), ("mlp-act", 106, 0.3, 30), ("attn,mlp-act", 66, 1.3, 40)]


def uniform_case(layers: int, stages: int) -> tuple:
    profile = synthetic.uniform_blocks(layers - 2, noise=0.0)
    with_options = []
    for item in profile.layers:
        if item.kind != "Block":
            with_options.append(item)
            continue
        listed = [RecomputeOption(name="none", kept_bytes=item.act_bytes),
                  RecomputeOption(name="full", kept_bytes=item.input_bytes, recompute_ms=item.fwd_ms,
                                  recompute_peak_bytes=item.act_bytes - item.input_bytes),
                  *(RecomputeOption(name=name, kept_bytes=kept * MIB, recompute_ms=ms, recompute_peak_bytes=peak * MIB)
                    for name, kept, ms, peak in BLOCK_OPTIONS)]
        with_options.append(item.model_copy(update={"recompute_options": listed, "recompute_ms": item.fwd_ms}))
    profile = profile.model_copy(update={"layers": with_options})
    roomy = TrainSetup(stages=stages, microbatches=2 * stages, micro_batch_size=1, mem_caps_bytes=[2**50] * stages)
    n = len(profile.layers)
    bounds = [round(s * n / stages) for s in range(stages)]
    full = costmodel.evaluate(costmodel.split_to_stages(bounds, [0] + [1] * (n - 2) + [0], profile), profile, roomy)
    none = costmodel.evaluate(costmodel.split_to_stages(bounds, [0] * n, profile), profile, roomy)
    cap = int(max(full.peak_bytes_per_stage) + 0.25 * (max(none.peak_bytes_per_stage) - max(full.peak_bytes_per_stage)))
    return profile, roomy.model_copy(update={"mem_caps_bytes": [cap] * stages})


def llama_case(cap_gb: float, *, dp: int = 1, zero: int = 0, host_gb: float | None = None) -> tuple:
    shape = analytic.Shape(seq_len=8192, micro_batch_size=1, tp=8, sp=True)
    arch = archs.arch("llama3-70b")
    profile = analytic.analytic_profile(arch, shape, gpu=archs.gpu("h100"),
                                        model=FileRef(file=arch.name, sha256=arch.sha256()))
    host = {} if host_gb is None else {"host_mem_bytes": int(host_gb * 1e9), "devices_per_node": 8}
    setup = TrainSetup(stages=4, microbatches=16, micro_batch_size=1, precision="bf16-mixed",
                       mem_caps_bytes=[int(cap_gb * 1e9)] * 4, dp=dp, zero=zero, **host)
    return profile, setup


def run(case: str, solvers: list[str], repeats: int, **llama) -> list[list[str]]:
    name, size = case.split(":")
    if name == "uniform":
        layers, stages = (int(part) for part in size.split("x"))
        profile, setup = uniform_case(layers, stages)
    else:
        profile, setup = llama_case(float(size), **llama)
    rows = []
    for solver in solvers:
        found = {}
        try:
            for space in ("options", "whole-layer"):
                this = setup.model_copy(update={"recompute": space})
                times, result = [], None
                for _ in range(repeats):
                    started = time.perf_counter()
                    result = search.plan(profile, this, solver=solver, time_limit_s=600)
                    times.append(time.perf_counter() - started)
                found[space] = (statistics.median(times), max(times) - min(times), result)
        except UserError as refused:
            rows.append([case, solver, "refused", "-", "-", "-", "-", "-", "-", str(refused)[:60]])
            continue
        (t_o, spread_o, r_o), (t_w, spread_w, r_w) = found["options"], found["whole-layer"]
        ok = isinstance(r_o, search.PlanResult) and isinstance(r_w, search.PlanResult)
        # the options without offload: a host too small for any (the MILP then)
        no_host = setup.model_copy(update={"host_mem_bytes": costmodel.FIT_MARGIN_BYTES, "devices_per_node": 1})
        kept_on_device = search.plan(profile, no_host, solver="milp", time_limit_s=600) if ok else None
        options = {o for stage in r_o.stages for o in stage.recompute.values()} if ok else set()
        rows.append([case, solver, f"{t_o:.3f} ± {spread_o:.3f}", f"{t_w:.3f} ± {spread_w:.3f}", f"{t_o / t_w:.1f}x",
                     f"{r_o.cost.iteration_ms / 1e3:.3f} s" if ok else r_o.status,
                     f"{r_w.cost.iteration_ms / 1e3:.3f} s" if ok else r_w.status,
                     f"{kept_on_device.cost.iteration_ms / 1e3:.3f} s" if ok else "-",
                     f"{(r_o.cost.iteration_ms / r_w.cost.iteration_ms - 1) * 100:+.1f}%" if ok else "-",
                     ", ".join(sorted(options)) or "-"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--solvers", default="dp,milp")
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--host-mem-gb", type=float, default=None)
    args = parser.parse_args()
    llama = {"dp": args.dp, "zero": args.zero, "host_gb": args.host_mem_gb}
    header = ["case", "solver", "solve s, options", "solve s, whole-layer", "ratio", "iteration, options",
              "iteration, whole-layer", "iteration, no offload", "options vs whole", "options chosen"]
    rows = [row for case in args.cases.split(",") for row in run(case, args.solvers.split(","), args.repeats, **llama)]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    for line in (header, ["-" * w for w in widths], *rows):
        print(" | ".join(str(cell).ljust(w) for cell, w in zip(line, widths)))


if __name__ == "__main__":
    main()
