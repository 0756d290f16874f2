"""Print a hand configuration's per-stage cost terms as JSON (docs/published-runs.md §5's terms.py).

usage: PYTHONPATH=<checkout> python scripts/stage_terms.py <ckplan evaluate arguments>

Calls `ckplan evaluate` with exactly the given arguments and prints each stage's StageCost terms
(GiB) and the iteration (s); the scoring rows of docs/published-runs.md read these figures.
"""
import json
import sys

from click.testing import CliRunner

from planner.cli import cli
from planner.cost import costmodel

GIB = 2**30


def main(argv: list[str]) -> int:
    captured, evaluate = [], costmodel.evaluate

    def spy(stages, profile, setup, *args, **kwargs):
        cost = evaluate(stages, profile, setup, *args, **kwargs)
        captured.append(cost)
        return cost

    costmodel.evaluate = spy
    from_config = any(arg in ("--from-megatron", "--from-torchtitan") for arg in argv)  # they read their own limit
    limit = [] if from_config else ["--time-limit", "20"]
    result = CliRunner().invoke(cli, ["evaluate", *argv, "--json", *limit])
    if result.exit_code:
        sys.stderr.write(result.output)
        if result.exc_info and not isinstance(result.exception, SystemExit):  # a fault, not a refusal: its trace
            import traceback

            traceback.print_exception(*result.exc_info, file=sys.stderr)
        return 1
    cost = captured[0]
    print(json.dumps({"iteration_s": cost.iteration_ms / 1000, "stages": [
        {"static": s.static_bytes / GIB, "activations": s.activation_bytes / GIB,
         "in_flight": s.in_flight, "buffers": s.buffer_bytes / GIB,
         "transient": s.transient_bytes / GIB, "step_scratch": s.step_scratch_bytes / GIB,
         "workspace": s.workspace_bytes / GIB,
         "nccl_by_communicator": {name: n / GIB for name, n in (s.nccl_buffers or {}).items()}, "peak": s.peak_bytes / GIB,
         "reserved": (s.reserved_bytes or s.peak_bytes) / GIB}
        for s in cost.stages]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
