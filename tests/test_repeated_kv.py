"""K and V repeated to the query heads before attention (planner/cost/repeatedkv.py): torchtitan's
repeat_kv copies them to every query head and SDPA saves the copies; counted by hand on a tiny GQA
model (hidden 64, 4 heads of 16, 2 K/V heads; 2 sequences of 32 tokens)."""

import pytest

from planner.cost import costmodel, repeatedkv, runtimes
from planner.cost.layers import layer_costs
from planner.cost.repeatedkv import (
    repeated_kv_bytes,
    repeated_kv_extra_bytes,
    repeated_kv_kept_bytes,
)
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

TINY = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)


def _profile(tp: int = 1, cp: int = 1):
    return analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2, tp=tp, sp=tp > 1, cp=cp),
                                     gpu=H100, model=REF)


def _setup(runtime: str = "torchtitan", version: str | None = "9dec370", **fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=2, mem_caps_bytes=[2**50], precision="bf16-mixed",
                runtime=runtime, runtime_version=version)
    return TrainSetup(**(base | fields))


@pytest.mark.parametrize("tp, cp, beyond", [
    (1, 1, 2 * 64 * (4 - 2) * 16 * 2),  # 64 tokens, K and V at 4 heads against 2: 8,192 B
    (2, 1, 2 * 64 * (2 - 1) * 16 * 2),  # TP 2: 2 query heads, 1 K/V head a rank: 4,096 B
    (4, 1, 0),                          # TP 4: 1 query head, the K/V head replicated: nothing repeated
    (1, 2, 2 * 32 * (4 - 2) * 16 * 2),  # CP 2: the rank's 32 tokens: 4,096 B
])
def test_the_repeated_bytes_beyond_the_grouped_ones_by_hand(tp, cp, beyond):
    embedding, block, _, head = layer_costs(_profile(tp, cp))
    profile, titan = _profile(tp, cp), _setup()
    assert repeated_kv_bytes(block, profile, titan) == beyond
    assert repeated_kv_bytes(embedding, profile, titan) == repeated_kv_bytes(head, profile, titan) == 0


def test_only_where_the_record_repeats():
    profile = _profile()
    block = layer_costs(profile)[1]
    assert runtimes.facts("torchtitan", "9dec370").cp_repeats_kv
    assert not runtimes.facts("torchtitan", "b5bcd76c").cp_repeats_kv  # SDPA's enable_gqa instead
    assert repeated_kv_bytes(block, profile, _setup(version="b5bcd76c")) == 0
    assert repeated_kv_bytes(block, profile, _setup("megatron", None)) == 0  # TE takes K/V at their heads


def test_kept_or_rerun_by_the_option():
    profile, eager = _profile(), _setup()
    block = layer_costs(profile)[1]
    assert (repeated_kv_kept_bytes(block, 0, profile, eager), repeated_kv_extra_bytes(block, 0, profile, eager)) \
        == (8192, 0)
    assert (repeated_kv_kept_bytes(block, 1, profile, eager), repeated_kv_extra_bytes(block, 1, profile, eager)) \
        == (0, 8192)  # full: the rerun forward makes them again
    names = [option.name for option in block.options]
    if "op-sac" in names:  # torchtitan's op-level SAC saves SDPA's outputs, not repeat_kv's
        option = names.index("op-sac")
        assert repeated_kv_extra_bytes(block, option, profile, eager) == 8192


def test_under_compile_the_partitions_figures_hold_them_already():
    """The compiled partition of torchtitan's block saves sdpa's repeated K and V (tests/test_compiled.py):
    a profile made with its compiled figures adds nothing; one without them is charged as eager."""
    compiled = _setup(compile=True)
    recorded = analytic.analytic_profile(TINY, Shape(seq_len=32, micro_batch_size=2), gpu=H100, model=REF,
                                         compiled=True)
    block = layer_costs(recorded)[1]
    assert block_has_figures(recorded)
    for option in (0, 1):
        assert repeated_kv_kept_bytes(block, option, recorded, compiled) == 0
        assert repeated_kv_extra_bytes(block, option, recorded, compiled) == 0
    bare = _profile()
    assert not block_has_figures(bare)
    assert repeated_kv_kept_bytes(layer_costs(bare)[1], 0, bare, compiled) == 8192


def block_has_figures(profile) -> bool:
    return any(layer.compiled_kept_bytes for layer in profile.layers if layer.kind == "decoder_block")


@pytest.mark.parametrize("checkpointed, more", [(False, 2 * 8192), (True, 8192)])
def test_the_stage_peak_moves_by_the_hand_count(checkpointed, more, monkeypatch):
    """One stage of both blocks, at its activations' moment (kept + transient; on so tiny a model the
    optimizer step's moment sets the peak): kept by each (2 x 8,192 B) when neither recomputes; one
    block's rerun (8,192 B) at a time when both do."""
    profile, setup = _profile(), _setup()
    flags = [False, checkpointed, checkpointed, False]
    stages = costmodel.split_to_stages([0], flags, profile)
    with_term = costmodel.evaluate(stages, profile, setup).stages[0]
    monkeypatch.setattr(repeatedkv, "repeated_kv_bytes", lambda layer, profile, setup: 0)
    without = costmodel.evaluate(stages, profile, setup).stages[0]
    def moment(stage):
        return stage.kept_bytes + stage.transient_bytes

    assert moment(with_term) - moment(without) == more
