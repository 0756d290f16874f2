"""`ckplan search` held against the jobs people published at their scale (docs/published-runs.md
§42.searchscale): a framework's file compared beside the search is scored as `evaluate --from-*`
scores the same file, to the millisecond and the byte."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_searchcheck import MEGATRON_ARGS

SHAPE = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512")


def _compared_and_evaluated(tmp_path, args: str) -> tuple[dict, dict]:
    """The file's row in `search --from-megatron` and `evaluate --from-megatron` of the same file."""
    path = tmp_path / "megatron.yaml"
    path.write_text(args)
    searched = run_ok("search", "--arch-config", _tiny_config(tmp_path), *SHAPE, "--runtime", "megatron", "--top",
                      "1", "--json", "--out", tmp_path / "p.yaml", "--from-megatron", path)
    evaluated = run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--json")
    return json.loads(searched.stdout)["compared"][0], json.loads(evaluated.stdout)


def _device_bytes(evaluated: dict) -> int:
    """What search's table calls a rank's device bytes: its reserved peak and its workspaces (NCCL's buffers)."""
    return max(rank["reserved_bytes"] + rank["workspace_bytes"] for rank in evaluated["ranks"])


def test_a_file_with_context_parallelism_is_compared_at_its_cp(tmp_path):
    """--context-parallel-size 2 on 8 GPUs: dp 4 x cp 2, each rank half of each sequence. main scored it at
    CP 1 (dp 4 x 1: 4 of its 8 GPUs) and said so; the comparison now holds the file's CP."""
    args = MEGATRON_ARGS.replace("--tensor-model-parallel-size: 1", "--tensor-model-parallel-size: 1\n"
                                 "  --context-parallel-size: 2") + "  --overlap-grad-reduce: true\n"
    compared, evaluated = _compared_and_evaluated(tmp_path, args)
    assert (compared["degrees"]["cp"], compared["degrees"]["dp"]) == (evaluated["cp"], evaluated["dp"]) == (2, 4)
    assert compared["iteration_ms"] == pytest.approx(evaluated["iteration_ms"], rel=1e-12)
    assert compared["device_bytes_max"] == _device_bytes(evaluated)
    assert "context parallelism" not in (compared["note"] or "")
