"""The torchtitan pipeline replay's reserve without the last stage's merge of its outputs (a diagnostic, not a
cost term): scripts/stage_terms.py's output for the same `ckplan evaluate` arguments, with every replayed rank's
`merged_bytes` set to 0 (planner/cost/fsdp2_chunks.py), so the merge's share of a rank's reserve reads as the
difference. usage: PYTHONPATH=<checkout> python scripts/merge_sensitivity.py <ckplan evaluate arguments>"""
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import stage_terms  # noqa: E402

from planner.cost import fsdp2_chunks  # noqa: E402

_events = fsdp2_chunks.rank_events


def without_merge(rank, **kwargs):
    return _events(dataclasses.replace(rank, merged_bytes=0), **kwargs)


fsdp2_chunks.rank_events = without_merge

if __name__ == "__main__":
    sys.exit(stage_terms.main(sys.argv[1:]))
