"""HiGHS keeps one thread scheduler a process, made by its first run: an LP made with highspy directly (the
chunked schedules' bound, chunkbound.least_makespan_ms) and then a MILP asking other threads handed back its start
as "feasible" in 0.02 s (a search's bounds, then a MILP at threads 1: 40 ms against the optimal 34 in
tests/test_shared_input.py, run after tests/test_search_ep.py in one process). Each case runs in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).parent

_CASE = textwrap.dedent("""
    from planner.cost import schedules
    from planner.solve import chunkbound
    import test_shared_input
    order = schedules.pipeline_schedule("interleaved-1F1B", num_ranks=2, num_microbatches=2, num_chunks=2)
    assert chunkbound.least_makespan_ms(order, [1.0], [2.0], [4]) is not None
    test_shared_input.test_the_solvers_score_the_shared_storage_as_evaluate_does(2, 0.3)
    test_shared_input.test_a_chain_of_one_kind_is_not_one_run_where_its_last_layer_keeps_its_output()
    print("optimal after the LP")
""")


def test_a_milp_after_a_highspy_lp_in_one_process_is_still_solved_to_its_optimum():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)])}
    done = subprocess.run([sys.executable, "-c", _CASE], capture_output=True, text=True, timeout=300, cwd=TESTS,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "optimal after the LP"
