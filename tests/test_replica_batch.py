"""A replica holds its own slice of the global batch, not a view that keeps the whole of it (planner/runtime/worker.py
replica_batch): rules.batch_bytes charges the slice, and a view kept dp x that alive (1,024 B over on the tied GPT
fixture at dp 2, 196,608 B on dp_wide's dp 4: docs/published-runs.md §39.zero0tied)."""

import runpy
from types import SimpleNamespace

import torch
from conftest import ROOT

from planner.runtime.stagemodule import training_batch
from planner.runtime.worker import replica_batch

FIXTURE = runpy.run_path(str(ROOT / "tests" / "fixtures" / "tied_gpt.py"))


def test_each_replica_owns_only_its_slice():
    model_file = SimpleNamespace(example_batch=FIXTURE["example_batch"])
    setup = SimpleNamespace(pipeline=SimpleNamespace(micro_batch_size=2, microbatches=2),
                            data_parallel=SimpleNamespace(dp=2))
    whole_inputs, whole_targets = training_batch(model_file, 8, seed=7)  # dp x microbatches x micro_batch_size
    for index in range(2):
        inputs, targets = replica_batch(model_file, setup, index, seed=7)
        assert torch.equal(inputs, whole_inputs[4 * index:4 * index + 4])
        assert torch.equal(targets, whole_targets[4 * index:4 * index + 4])
        # 4 samples x 16 tokens x 8 B (int64): the slice's own storage, 512 B, not the global batch's 1,024
        assert inputs.untyped_storage().nbytes() == targets.untyped_storage().nbytes() == 4 * 16 * 8
