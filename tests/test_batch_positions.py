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
