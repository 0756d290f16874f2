"""FSDP2 beside a pipeline reduces the stage's root unit first (torch 2.6.0 pipelining/stage.py 636-652: the
groups' post_backward in `all_states` order, the root's first); the root holds the model's ends, tok_embeddings
or norm and output (torchtitan 9dec370 parallelize_llama.py 324-339; docs/framework-facts.md §660-§662). Which
unit is the root was the stage's most common layer kind, a tie on a stage of one block and the head broken by
the order of a set of strings: the replay's bytes changed with PYTHONHASHSEED."""

import json
import os
import subprocess
import sys
from pathlib import Path

from planner.cost import costmodel, reserve_fsdp2
from planner.models.synthetic import heterogeneous, layer, profile_of, uniform_blocks
from planner.schema import TrainSetup

GIB = 2**30
ROOT = Path(__file__).resolve().parent.parent


def _cuda(profile):
    return profile.model_copy(update={"device": profile.device.model_copy(update={"type": "cuda"})})


def _setup(version: str = "9dec370") -> TrainSetup:
    return TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2,
                      precision="bf16-mixed", runtime="torchtitan", runtime_version=version, dp=4, zero=3,
                      zero_gather="per-iteration")


def _root_units(profile, cut: int, version: str = "9dec370") -> list[list[int]]:
    """Each stage's chunks' root units, the stages cut at layer `cut`."""
    plans = costmodel.split_to_stages([0, cut], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(plans, profile, _setup(version))
    ranks = [reserve_fsdp2.stage_of(plan, c, stage=i, profile=profile, setup=_setup(version))
             for i, (c, plan) in enumerate(zip(cost.stages, plans))]
    return [sorted(u for chunk in rank.chunks for u in chunk.root_units) for rank in ranks]


def test_the_root_is_the_unit_of_the_models_ends_whatever_the_stages_kinds():
    # a stage of one block and the head: the head's unit (1), not whichever kind a set gave first
    assert _root_units(_cuda(uniform_blocks(4)), 4) == [[0], [1]]
    # every layer its own kind: the first layer's unit on stage 0, the last layer's on stage 1, no other
    assert _root_units(_cuda(heterogeneous(5)), 3) == [[0], [1]]
    # dense and MoE blocks (DeepSeek's first blocks dense): every one of model.layers is a block, none the root's
    blocks = [layer("embed", "embedding", fwd_ms=1, act_mib=1, input_mib=1, param_count=1_000_000),
              layer("layers.0", "decoder_block", fwd_ms=1, act_mib=8, input_mib=1, param_count=2_000_000),
              *(layer(f"layers.{i}", "moe_block", fwd_ms=1, act_mib=8, input_mib=1, param_count=3_000_000)
                for i in (1, 2)),
              layer("output", "norm+lm_head", fwd_ms=1, act_mib=4, input_mib=1, param_count=1_000_000)]
    assert _root_units(_cuda(profile_of(blocks)), 1) == [[0], [3]]
    # torchtitan 2c8b5947 on: tok_embeddings and [norm, output] units of their own, the root holding nothing, so
    # every unit is reduced in module order (the head's last)
    assert _root_units(_cuda(uniform_blocks(4)), 4, "b5bcd76c") == [[], []]


# Stage 1 of uniform_blocks(4) cut at 4 (blocks.3 and the head) and both stages of heterogeneous(5) cut at 3,
# each replayed: before the fix, seeds 0 and 4 ordered these stages' reduce-scatters differently (the allocated peak
# of uniform4's stage 1: 1,474,526,208 B at seed 0, 1,623,863,296 B at seed 4; /tmp/hashseed/probe.py).
SCRIPT = """
import json, sys
from planner.cost import costmodel, reserve_fsdp2 as r
from planner.cost.fsdp2_chunks import rank_events
from planner.models.synthetic import heterogeneous, uniform_blocks
sys.path.insert(0, "tests")
from test_fsdp2_root_units import _cuda, _setup
out = []
for profile, cut in ((uniform_blocks(4), 4), (heterogeneous(5), 3)):
    profile = _cuda(profile)
    plans = costmodel.split_to_stages([0, cut], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(plans, profile, _setup())
    for i, (c, plan) in enumerate(zip(cost.stages, plans)):
        rank = r.stage_of(plan, c, stage=i, profile=profile, setup=_setup())
        out.append([repr(rank_events(rank, steps=2)), [(x.allocated_peak_bytes, x.reserved_peak_bytes, x.segments) for x in [r.replay(rank)]]])
print(json.dumps(out))
"""


def test_the_replay_is_the_same_under_every_hash_seed():
    runs = []
    for seed in ("0", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=True)
        runs.append(json.loads(done.stdout))
    assert len(runs[0]) == 4
    assert runs[1] == runs[0] and runs[2] == runs[0]
