"""DeepSpeed ZeRO 3's coordinator simulated over a step's trace (planner/cost/deepspeed_zero3.py simulate), the
stage3 knobs as options (planner/commands/deepspeed_options.py) and the two terms they set
(planner/cost/deepspeed_terms.py): the working set in a block's backward and a checkpointed block's third gather."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.cost import deepspeed_terms
from planner.cost import deepspeed_zero3 as z3
from planner.cost.deepspeed_zero3 import Submodule
from planner.cost.layers import layer_costs

ABC = [Submodule("a", (4,)), Submodule("b", (3,)), Submodule("c", (2,))]


def _moments(block, **kwargs):
    return [(m.phase, m.name, m.gathered, m.grads, m.fetched)
            for m in z3.simulate(block, persistence_threshold=0, **kwargs)]


def test_the_coordinator_by_hand_release_prefetch_and_the_prefetch_kept_rule():
    # forward a: a gathered (4), the queue's next entry b prefetched (3); a released (distance 0)
    # forward b: b already fetched, c prefetched; forward c: c's backward use popped (available: marked, so c is
    # not released, edaa7221's rule), b's backward use prefetched; backward c prefetches a; gradients: own + previous
    assert _moments(ABC, layers=1, checkpointed=False, max_reuse_numel=0, prefetch_bucket=1, max_live=100) == [
        ("forward", "a", 7, 0, 4), ("forward", "b", 5, 0, 3), ("forward", "c", 5, 0, 2),
        ("backward", "c", 9, 2, 0), ("backward", "b", 7, 5, 3), ("backward", "a", 4, 7, 4)]


def test_max_live_parameters_stops_the_prefetch_and_a_zero_bucket_prefetches_nothing():
    # max_live 4: with a's 4 elements gathered min(4 - 4, 1) = 0 to prefetch, so b is gathered at its own run;
    # with b's 3, min(4 - 3, 1) = 1: c prefetched (5), and at c (2) b's backward use (5)
    live = _moments(ABC, layers=1, checkpointed=False, max_reuse_numel=0, prefetch_bucket=1, max_live=4)
    assert [(name, held, fetched) for _, name, held, _, fetched in live[:3]] == [("a", 4, 4), ("b", 5, 3), ("c", 5, 2)]
    none = _moments(ABC, layers=1, checkpointed=False, max_reuse_numel=0, prefetch_bucket=0, max_live=100)
    assert [fetched for *_, fetched in none] == [4, 3, 2, 2, 3, 4]  # each gathered again, at its own run


@pytest.mark.parametrize("max_reuse", [0, 1, 4, 5, 6, 9, 10, 11, 100])
def test_without_prefetch_a_checkpointed_block_keeps_what_the_walk_keeps(max_reuse):
    """No prefetch (bucket 0): the backward gathers exactly the submodules kept_to_backward (edaa7221's `>=`)
    releases after their recompute, in every layer of three."""
    block = [Submodule("a", (1,)), Submodule("b", (4,)), Submodule("c", (3,)), Submodule("d", (2,))]
    kept = z3.kept_to_backward(block, max_reuse_numel=max_reuse, stop_at_equal=True)
    moments = z3.simulate(block, layers=3, checkpointed=True, max_reuse_numel=max_reuse, prefetch_bucket=0,
                          persistence_threshold=0)
    for layer in range(3):
        backward = {m.name: m.fetched for m in moments if m.layer == layer and m.phase == "backward"}
        assert [backward[m.name] == 0 for m in block] == kept


def test_the_azure_blocks_at_the_recipes_knobs():
    """At 3e9 (run-175b.sh, run-1t.sh) the 530B block gathers dense_4h_to_h twice and the rest three times:
    the third gather is the other submodules' partitioned elements (kept_to_backward's, §25.dsrows)."""
    h = 20480
    block = z3.gpt_block(h, 4 * h)
    moments = z3.simulate(block, layers=4, checkpointed=True, max_reuse_numel=3_000_000_000, max_live=3_000_000_000)
    runs = [m for m in moments if m.layer == 1 and m.phase != "forward"]
    partitioned = 12 * h * h  # the weights: every bias and norm (at most 4h = 81,920 <= 1e5) persistent
    third = 3 * h * h + h * h + 4 * h * h  # QKV, dense, dense_h_to_4h gathered again
    assert sum(m.fetched for m in runs) == partitioned + third


@pytest.fixture(scope="module")
def gpt_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dsz3")
    config = folder / "gpt.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 1024, "n_layer": 4, "n_head": 8,
                                  "vocab_size": 1024, "n_positions": 256,
                                  "activation_function": "gelu_pytorch_tanh"}))
    run_ok("profile", "--arch-config", config, "--seq-len", 256, "--micro-batch-size", 2, "--gpu", "a100-80g",
           "--attention", "eager", "--out", folder / "p.json")
    return folder / "p.json"


BASE = ("--layers-per-stage", 6, "--ckpt-per-stage", 4, "--dp", 8, "--zero", 3, "--microbatches", 1,
        "--precision", "bf16-mixed", "--json")


def _evaluate(profile, *extra):
    return json.loads(run_ok("evaluate", "--profile", profile, *BASE, *extra).stdout)["hand"]


def _setup(profile_path, link=None, **knobs):
    from planner.commands.setup_options import DataParallelOptions, build_setup

    profile = io.load_profile(profile_path)
    options = DataParallelOptions(dp=8, zero=3, deepspeed=knobs, shard_bandwidth=link)
    return profile, build_setup(profile, stages=1, mem="80GB", microbatches=1, schedule="1F1B", optimizer="adam",
                                precision="bf16-mixed", parallel_stages=None, runtime="deepspeed",
                                data_parallel=options)


def test_the_working_set_is_the_coordinators_peak_in_the_weights_and_gradients_dtypes(gpt_profile):
    profile, setup = _setup(gpt_profile, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    blocks = [layer for layer in layer_costs(profile) if layer.kind == "decoder_block"]
    assert deepspeed_terms.charged(profile, setup)
    # distance 0, no prefetch: one submodule gathered at a time; the peak is dense_h_to_4h's backward: its
    # weight (4h x h; the biases, at most 1e5 elements, persistent) beside its gradient (4h x h + 4h) and
    # dense_4h_to_h's (4h x h + h), all in 2 B
    h = 1024
    expected = 2 * 4 * h * h + 2 * ((4 * h * h + 4 * h) + (4 * h * h + h))
    assert deepspeed_terms.working_set_bytes(blocks[1], 1, profile, setup) == expected
    assert deepspeed_terms.working_set_bytes(blocks[1], 0, profile, setup) == expected
    # every 12h^2 + 13h of the block released after the recompute: gathered a third time
    assert deepspeed_terms.third_gather_share(profile, blocks[1], setup) == pytest.approx(1.0)


def test_the_third_gather_on_a_slow_link_is_one_more_gather_of_the_block(gpt_profile):
    """At 1 GB/s one gather of the block (12h^2 + 13h in 2 B, 7/8 of it crossing among 8 ranks) far outlasts
    the backward's window: the third adds all of it, under full recompute only."""
    profile, setup = _setup(gpt_profile, link=1.0, stage3_max_reuse_distance=0, stage3_prefetch_bucket_size=0)
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    h = 1024
    one_gather_ms = (12 * h * h + 13 * h) * 2 * 7 / 8 / 1e9 * 1e3
    assert deepspeed_terms.third_gather_ms(block, 1, profile, setup) == pytest.approx(one_gather_ms)
    assert deepspeed_terms.third_gather_ms(block, 0, profile, setup) == 0.0


def test_the_default_distance_keeps_a_small_model_gathered_and_charges_no_third_gather(gpt_profile):
    profile, setup = _setup(gpt_profile)  # 1e9 against four blocks of 12.6e6: nothing released between uses
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    assert deepspeed_terms.third_gather_share(profile, block, setup) == 0.0
    assert deepspeed_terms.third_gather_ms(block, 1, profile, setup) == 0.0


def test_a_shorter_distance_slows_the_checkpointed_plan_on_a_slow_link(gpt_profile):
    slow = ("--runtime", "deepspeed", "--shard-bandwidth", 1)
    default = _evaluate(gpt_profile, *slow)
    # distance 0 and no prefetch (a prefetch that passes a parameter's later use marks it kept): every
    # checkpointed block's weights gathered a third time
    released = _evaluate(gpt_profile, *slow, "--stage3-max-reuse-distance", 0, "--stage3-prefetch-bucket-size", 0)
    assert _evaluate(gpt_profile, *slow, "--stage3-max-reuse-distance", 0) == default
    assert released["iteration_ms"] > default["iteration_ms"]  # the checkpointed blocks' third gather


@pytest.mark.parametrize(("extra", "says"), [
    (("--runtime", "megatron", "--zero", 1, "--stage3-max-reuse-distance", "3e9"), "scored for megatron's runtime"),
    (("--runtime", "deepspeed", "--zero", 2, "--stage3-max-live-parameters", "3e9"), "runs ZeRO 2"),
    (("--runtime", "deepspeed", "--zero-gather", "per-iteration", "--stage3-prefetch-bucket-size", "5e7"),
     "keeps weights whole"),
    (("--runtime", "deepspeed", "--stage3-max-reuse-distance", "3.5"), "whole number"),
    (("--runtime", "deepspeed", "--stage3-max-reuse-distance", "many"), "not a number"),
])
def test_a_knob_where_it_changes_nothing_is_refused_in_one_sentence(gpt_profile, extra, says):
    result = run("evaluate", "--profile", gpt_profile, *BASE, *extra)
    assert result.exit_code != 0 and says in result.output


def test_the_export_carries_the_knobs_given():
    from planner.emit.deepspeed import _zero_block
    from planner.schema import TrainSetup

    setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[1 << 30],
                       dp=8, zero=3, runtime="deepspeed", stage3_max_reuse_distance=3_000_000_000)
    assert _zero_block(setup) == ', "zero_optimization": {"stage": 3, "stage3_max_reuse_distance": 3000000000}'


def test_megatron_deepspeeds_engine_flags_without_deepspeed_are_said_not_modelled_not_unknown():
    """Megatron-DeepSpeed's DeepSpeed flags (examples/azure/run-175b.sh at 62bc4562) without --deepspeed: the reader
    scores Megatron-LM's runtime and says so for each, pointing at --runtime deepspeed and the stage3 options (with
    --deepspeed the ds_config is read: tests/test_deepspeed_megatron.py)."""
    from planner.models.configs import megatron

    base = [("--num-layers", ["2"]), ("--hidden-size", ["64"]), ("--num-attention-heads", ["4"]),
            ("--seq-length", ["128"]), ("--max-position-embeddings", ["128"]), ("--vocab-size", ["1000"]),
            ("--micro-batch-size", ["1"])]
    flags = [("--deepspeed_config", ["ds_config.json"]), ("--zero-stage", ["3"]),
             ("--deepspeed-activation-checkpointing", []), ("--no-pipeline-parallel", [])]
    said = {s.name: (s.status, s.what) for s in megatron.from_pairs(base + flags, "t.sh").settings}
    assert all(said[name][0] == "not modelled" for name, _ in flags)
    assert "--runtime deepspeed" in said["--deepspeed_config"][1] and "--stage3-max-reuse-distance" in said["--zero-stage"][1]
