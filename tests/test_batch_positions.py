"""torchtitan's batch on every pipeline stage: each stage moves the whole batch, inputs and labels, to the device
before the schedule takes its share, and b5bcd76c's collator adds an int64 positions tensor, one a token, that every
stage's kwargs carry (rules.batch_bytes; docs/framework-facts.md §707, §708)."""

import pytest

from planner.cost.rules import batch_bytes
from planner.models.synthetic import layer, profile_of
from planner.schema import TrainSetup

TOKENS = 8192  # one microbatch: 1 x 8,192


def _profile():
    blocks = [layer(f"block{i}", "block", fwd_ms=1.0, act_mib=1, input_mib=1, param_count=10) for i in range(3)]
    # int64 token ids and labels: 8 B a token each
    return profile_of(blocks).model_copy(update={"batch_input_bytes": 8 * TOKENS,
                                                          "batch_target_bytes": 8 * TOKENS})


def _setup(runtime: str, version: str | None, stages: int = 3) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**40] * stages,
                      runtime=runtime, runtime_version=version)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_b5bcd76c_holds_inputs_positions_and_labels_on_every_stage(stage):
    # 4 microbatches x (8,192 x 8 B inputs + 8,192 x 8 B positions + 8,192 x 8 B labels) = 786,432 B; the
    # positions alone 64 KiB a microbatch
    assert batch_bytes(_profile(), stage, _setup("torchtitan", "b5bcd76c")) == 4 * 3 * 65536 == 786432


@pytest.mark.parametrize("version", ["9dec370", "bbb1b616", "2c8b5947"])
def test_earlier_versions_hold_inputs_and_labels_on_every_stage_without_positions(version):
    held = [batch_bytes(_profile(), stage, _setup("torchtitan", version)) for stage in range(3)]
    assert held == [4 * 2 * 65536] * 3  # the middle stage too: 524,288 B each


def test_torch_pipelining_alone_still_splits_the_batch_between_the_ends():
    # ckplan's own runtime (torch's pipelining, the whole-batch record): inputs on the first, labels on the last
    held = [batch_bytes(_profile(), stage, _setup("ckplan", None)) for stage in range(3)]
    assert held == [4 * 65536, 0, 4 * 65536]


def test_a_rank_of_several_stages_holds_its_batch_once():
    # interleaved 1F1B, 2 ranks x 2 chunks: the cost model's 4 stages (chunked.stages_view), rank r holding r and r + 2;
    # the trainer moves the batch to the device once a rank, so only each rank's chunk 0 (stages 0 and 1) holds it
    view = TrainSetup(stages=4, microbatches=4, micro_batch_size=1, mem_caps_bytes=[2**40] * 4, runtime="torchtitan",
                      runtime_version="b5bcd76c", schedule="interleaved-1F1B", chunks=2)
    assert [batch_bytes(_profile(), stage, view) for stage in range(4)] == [786432, 786432, 0, 0]


def test_b5bcd76c_accumulating_without_a_pipeline_keeps_every_inputs_and_the_current_labels():
    """One stage, 4 microbatches accumulated (b5bcd76c trainer.py 854-896): every group's input_dict, written back
    with its device tensors, is kept to the step's end; each group's labels are a new list. At the last group's
    forward and backward: 4 x (65,536 B inputs + 65,536 B positions) + 65,536 B labels = 589,824 B, 3 x 65,536 =
    196,608 B fewer than the whole batch."""
    assert batch_bytes(_profile(), 0, _setup("torchtitan", "b5bcd76c", stages=1)) == 4 * 2 * 65536 + 65536 == 589824
    assert 786432 - 589824 == 3 * 65536


def test_2c8b5947_accumulating_without_a_pipeline_keeps_one_microbatch():
    """2c8b5947 train.py 370-399, 471-474: the batch generator moves one microbatch to the device and train_step
    rebinds its input_dict and labels each microbatch: 65,536 B inputs + 65,536 B labels."""
    assert batch_bytes(_profile(), 0, _setup("torchtitan", "2c8b5947", stages=1)) == 2 * 65536


def test_a_pipeline_or_one_microbatch_keeps_the_whole_batch():
    # with a pipeline the trainer's accumulation groups are not told apart from the schedule's microbatches (M is
    # their product): every stage keeps the whole batch as before; one microbatch is the whole batch
    assert batch_bytes(_profile(), 0, _setup("torchtitan", "b5bcd76c", stages=2)) == 786432
    one = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], runtime="torchtitan",
                     runtime_version="b5bcd76c")
    assert batch_bytes(_profile(), 0, one) == 3 * 65536


def test_evaluate_charges_it_as_the_stage_holds_it(monkeypatch):
    """The stage term, so evaluate, the DP and the MILP read the same: b5bcd76c's stage holds 3 x 65,536 B fewer
    than with the record read as keeping the whole batch, in its buffers and at its peak."""
    import dataclasses

    from planner.cost import costmodel, runtimes

    profile, setup = _profile(), _setup("torchtitan", "b5bcd76c", stages=1)
    stages = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    record = runtimes.of(setup.training)
    assert record.accumulated_batch == "inputs"
    kept = costmodel.evaluate(stages, profile, setup).stages[0]
    whole = dataclasses.replace(record, accumulated_batch="whole")
    monkeypatch.setattr(runtimes, "of", lambda training: whole)
    before = costmodel.evaluate(stages, profile, setup).stages[0]
    assert before.buffer_bytes - kept.buffer_bytes == 3 * 65536
    assert before.peak_bytes - kept.peak_bytes == 3 * 65536
