"""Print what a Megatron job's context-parallel exchange holds against its block's own transient: the busiest rank's
buffers forward and backward (planner/cost/contextparallel.py buffer_bytes), the block's transient and output, and
the extra the peak takes (extra_bytes: 0 where the buffers stay under the transient), from one `ckplan evaluate`
of the file (docs/published-runs.md §42.smallfix60).

usage: PYTHONPATH=<checkout> python scripts/cp_buffer_terms.py configs/megatron-bridge/FILE.yaml GPUS GPU
"""
import sys

from click.testing import CliRunner

from planner.cli import cli
from planner.cost import contextparallel

SEEN: dict = {}
_extra = contextparallel.extra_bytes


def _watched(layer, setup, option=0):
    extra = _extra(layer, setup, option)
    if layer.context_parallel is not None and setup.training.context_parallel > 1:
        exchanged = contextparallel.as_exchanged(layer.context_parallel, setup.training)
        forward, backward = contextparallel.buffer_bytes(exchanged, contextparallel.comm_type(setup.training))
        SEEN[(layer.kind, option)] = (exchanged.ranks, exchanged.q_bytes, exchanged.kv_bytes, forward, backward,
                                      layer.transient_bytes, layer.output_bytes, extra)
    return extra


if __name__ == "__main__":
    path, gpus, gpu = sys.argv[1:4]
    contextparallel.extra_bytes = _watched
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", path, "--gpus", gpus, "--gpu", gpu])
    if result.exit_code:
        sys.exit(result.output)
    for (kind, option), (cp, o, kv, forward, backward, transient, output, extra) in SEEN.items():
        print(f"{kind} option {option}: cp {cp}, O {o:,} B, KV {kv:,} B; buffers forward {forward:,} B, backward "
              f"{backward:,} B; the block's transient {transient:,} B, output {output:,} B; extra {extra:,} B")
