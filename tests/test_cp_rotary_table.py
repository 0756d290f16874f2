"""The rotary table torchtitan 9dec370's model holds, and the copies torch 2.6.0's context_parallel makes of it
(planner/cost/rotarytable.py): counted by hand on a tiny LLaMA (hidden 64, 4 heads of 16: a table of 32 positions
x 8 complex64 = 2,048 B)."""

import pytest

from planner.cost import costmodel
from planner.cost.rotarytable import held_tables, rotary_table_bytes, table_bytes
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
TABLE = 32 * (16 // 2) * 8  # seq_len x head_dim / 2 x complex64


def _profile(cp: int = 1):
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, cp=cp), gpu=H100, model=REF)


def _setup(version: str | None = "9dec370", runtime: str = "torchtitan", **fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime=runtime, runtime_version=version)
    return TrainSetup(**(base | fields))


def test_one_table_by_hand():
    assert table_bytes(32, 16) == TABLE == 2048
    assert table_bytes(262_144, 128) == 128 * 2**20  # C8's: 128 MiB on every 405B stage


@pytest.mark.parametrize("cp, stages, tables", [
    (1, 1, 1.0),    # no context parallelism: the model's own
    (1, 4, 1.0),
    (2, 1, 3.0),    # the storage kept whole by resize_, the whole clone for the restore, two shards of 1/2
    (8, 1, 2.25),   # ... two shards of 1/8
    (8, 4, 1.0),    # under a pipeline the meta model's table is the one handed: each stage's untouched
])
def test_the_tables_a_rank_holds(cp, stages, tables):
    assert held_tables(cp, stages) == tables


@pytest.mark.parametrize("cp, stages, expected", [
    (1, 1, TABLE), (2, 1, 3 * TABLE), (2, 2, TABLE)])
def test_torchtitan_9dec370_charges_it_on_every_stage(cp, stages, expected):
    profile = _profile(cp)
    setup = _setup(context_parallel=cp, cp=cp, stages=stages, microbatches=stages,
                   mem_caps_bytes=[2**50] * stages)
    assert [rotary_table_bytes(profile, stage, setup) for stage in range(stages)] == [expected] * stages


def test_only_where_the_record_has_read_it():
    profile = _profile()
    assert rotary_table_bytes(profile, 0, _setup("b5bcd76c")) == 0  # not read at this version
    assert rotary_table_bytes(profile, 0, _setup(None, runtime="megatron")) == 0
    assert rotary_table_bytes(profile, 0, _setup(None, runtime="ckplan")) == 0


def test_it_enters_the_stages_buffers_and_peak(monkeypatch):
    """The same stage under 9dec370's record and under that record with no table read: exactly the table more
    in buffers and in the allocated peak (CP 2 without a pipeline: three tables)."""
    from dataclasses import replace

    from planner.cost import runtimes

    profile, setup = _profile(2), _setup(context_parallel=2, cp=2)
    plan = costmodel.split_to_stages([0], [False] * len(profile.layers), profile)
    with_table = costmodel.evaluate(plan, profile, setup)
    without = replace(runtimes.of(setup.training), rotary_table="")
    monkeypatch.setattr(runtimes, "of", lambda training: without)
    no_table = costmodel.evaluate(plan, profile, setup)
    assert with_table.stages[0].buffer_bytes - no_table.stages[0].buffer_bytes == 3 * TABLE
    assert with_table.stages[0].peak_bytes - no_table.stages[0].peak_bytes == 3 * TABLE
