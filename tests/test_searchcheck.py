"""`ckplan search` held against the configurations the published rows run (docs/published-runs.md
§35.searchcheck): a hand configuration scored beside the search is scored as `evaluate` scores the
same plan, with every setting the search was given."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run_ok
from test_launchers import _tiny_config
from test_searchfix import clock  # noqa: F401 (the fixture: 1 s a profile, 1000 s a solve)

SHAPE = ("--gpus", "8", "--global-batch", "8", "--seq-len", "512")
JOB = (*SHAPE, "--runtime", "torchtitan")
HAND = ("--tp", "1", "--micro-batch-size", "1", "--hand-recompute", "full")


def _hand_ms(tmp_path, *flags) -> float:
    result = run_ok(
        "search",
        "--arch-config",
        _tiny_config(tmp_path),
        *JOB,
        "--top",
        "1",
        "--json",
        "--out",
        tmp_path / "p.yaml",
        *HAND,
        *flags,
    )
    return json.loads(result.stdout)["compared"][0]["iteration_ms"]


def _evaluated_ms(tmp_path, *, op_level_sac: bool) -> float:
    """The hand configuration (TP 1, one stage, dp 8, every layer checkpointed) as `evaluate` scores
    it: its stages, under --op-level-sac op_sac_stages of them (evaluate.py), on the search's profile
    and setup for those degrees."""
    from planner.commands.handplan import hand_stages
    from planner.commands.search import _model
    from planner.commands.training_settings import op_sac_stages
    from planner.cost import costmodel
    from planner.models import archs
    from planner.solve import jobsearch
    from planner.solve.degrees import Degrees

    profile = _model(None, _tiny_config(tmp_path), None, both=False).profile_for(
        archs.gpu("h100"), 512
    )(1, False, 1)
    options = jobsearch.JobOptions(
        mem_cap_bytes=archs.gpu("h100").usable_bytes,
        gpus_per_node=8,
        nvlink_domain=8,
        runtime="torchtitan",
        training={"op_level_sac": op_level_sac},
    )
    degrees = Degrees(tp=1, sp=False, pp=1, dp=8, micro_batch_size=1, microbatches=1)
    setup = jobsearch.job_setup(profile, degrees, options)
    stages = hand_stages(profile, [4], [4], "first")
    if op_level_sac:
        stages = op_sac_stages(stages, profile)
    return costmodel.evaluate(stages, profile, setup).iteration_ms


def test_a_hand_configuration_runs_op_level_sac_where_the_search_is_given_it(tmp_path):
    """--op-level-sac with a hand configuration: its checkpointed blocks run torchtitan's op-level
    policy, as `evaluate --checkpoint ... --op-level-sac` runs them (M11 at main: the search's hand
    1.325 s with every block recomputed whole, evaluate's row 1.205 s)."""
    full, sac = (
        _evaluated_ms(tmp_path, op_level_sac=False),
        _evaluated_ms(tmp_path, op_level_sac=True),
    )
    assert sac < full
    assert _hand_ms(tmp_path) == pytest.approx(full, rel=1e-12)
    assert _hand_ms(tmp_path, "--op-level-sac") == pytest.approx(sac, rel=1e-12)


SETTINGS = [
    ("megatron", {"float8": True}),
    ("megatron", {}),
    ("torchtitan", {"float8": True, "fp8_all_gather": True}),
    ("torchtitan", {"chunked_cross_entropy": 8}),
]


@pytest.mark.parametrize("runtime, training", SETTINGS, ids=[f"{r} {t}" for r, t in SETTINGS])
def test_every_candidate_is_charged_the_profile_evaluate_charges(tmp_path, runtime, training):
    """Brute force over every configuration the search keeps: the profile it scores is float8.
    float8_profile of the profile its plan file holds under its own setup, as `evaluate` applies it
    (Transformer Engine's once-a-step weight cast is charged times the shard group's size, so a
    profile applied for one shard group is not another's; the chunked loss and the fused kernels
    apply without --float8 too)."""
    from planner.commands.search import _job, _model
    from planner.cost.float8 import float8_profile
    from planner.models import archs
    from planner.solve import jobsearch

    model = _model(None, _tiny_config(tmp_path), None, both=False)
    job = _job(
        model,
        gpus=8,
        per_node=8,
        global_batch=8,
        seq_len=512,
        schedules=("1F1B",),
        chunks=(2,),
        micro_batch_sizes=(1,),
        runtime=runtime,
    )
    options = jobsearch.JobOptions(
        mem_cap_bytes=2**36, gpus_per_node=8, runtime=runtime, training=training
    )
    profiles = jobsearch.Profiles(model.profile_for(archs.gpu("h100"), 512))
    found = jobsearch.candidates(job, options, profiles, jobsearch.Outcome())
    assert (
        len(
            {
                c.setup.data_parallel.shard_group or c.setup.data_parallel.dp
                for c in found
                if c.degrees.zero
            }
        )
        > 1
    )
    wrong = [
        c.degrees.label()
        for c in found
        if c.profile != float8_profile(c.plan_profile or c.profile, c.setup)
    ]
    assert wrong == []


def test_compare_on_a_model_with_no_published_configuration_says_so(tmp_path):
    """--compare on a config ckplan holds no published configuration of: one sentence, exit 1, before
    the search runs (it compared nothing, silently, at main)."""
    from fixtures.cli import run

    result = run(
        "search",
        "--arch-config",
        _tiny_config(tmp_path),
        *JOB,
        "--top",
        "1",
        "--compare",
        "--out",
        tmp_path / "p.yaml",
    )
    said = " ".join(result.output.split())
    assert (
        result.exit_code == 1
        and "--compare: ckplan holds no published configuration of --arch" in said
    )
    assert "llama3-8b" in said and not (tmp_path / "p.yaml").exists()


@pytest.mark.usefixtures("clock")
def test_a_search_out_of_time_says_the_limit_given(tmp_path):
    """--time-limit 2 on a clock of 1 s a profile (test_searchfix's): the sentence names the 2 s given,
    not the search's own part of it (main said "before --time-limit (0.0 s)" where the settings'
    sample profile had used the whole limit). At 3 s half of it passes with a configuration kept, which
    is solved and answers (§35.searchtime): 2 s leaves none kept before the limit."""
    from fixtures.cli import run

    result = run(
        "search",
        "--arch-config",
        _tiny_config(tmp_path),
        *JOB,
        "--top",
        "3",
        "--out",
        tmp_path / "p.yaml",
        "--time-limit",
        "2",
    )
    said = " ".join(result.output.split())
    assert (
        result.exit_code == 1
        and "a plan that fits before --time-limit 2 s ran out (the search itself" in said
    )


MEGATRON_ARGS = """MODEL_ARGS:
  --num-layers: 4
  --hidden-size: 512
  --ffn-hidden-size: 1408
  --num-attention-heads: 8
  --group-query-attention: true
  --num-query-groups: 4
  --kv-channels: 64
  --swiglu: true
  --normalization: RMSNorm
  --position-embedding-type: rope
  --untie-embeddings-and-output-weights: true
  --disable-bias-linear: true
  --hidden-dropout: 0.0
  --attention-dropout: 0.0
  --seq-length: 512
  --max-position-embeddings: 4096
  --vocab-size: 8000
  --make-vocab-size-divisible-by: 8
  --tensor-model-parallel-size: 1
  --micro-batch-size: 1
  --global-batch-size: 8
  --bf16: true
  --transformer-impl: transformer_engine
"""


def test_a_megatron_file_naming_the_head_size_compares_with_the_model_that_derives_it(tmp_path):
    """--kv-channels 64 with 512 wide over 8 heads is the config's derived head size (its head_dim unset):
    the same model, compared (main refused it: "describes another model ... head_dim 64 against None",
    as Megatron-Bridge's 8B file against --arch llama3-8b)."""
    args = tmp_path / "megatron.yaml"
    args.write_text(MEGATRON_ARGS)
    result = run_ok(
        "search",
        "--arch-config",
        _tiny_config(tmp_path),
        *SHAPE,
        "--runtime",
        "megatron",
        "--top",
        "1",
        "--json",
        "--out",
        tmp_path / "p.yaml",
        "--from-megatron",
        args,
    )
    compared = json.loads(result.stdout)["compared"]
    assert [row["degrees"]["dp"] for row in compared] == [8] and compared[0]["iteration_ms"] > 0


TORCHTITAN_OP_SAC = """[model]
name = "llama3"
flavor = "debugmodel"

[training]
local_batch_size = 1
seq_len = 512

[parallelism]
data_parallel_shard_degree = 8

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


@pytest.mark.parametrize("op_level_sac", [True, False])
def test_a_torchtitan_file_with_op_level_ac_is_scored_as_the_hand_plan_of_its_degrees(
    tmp_path, op_level_sac
):
    """torchtitan's selective_ac_option op beside the same degrees by hand (FSDP 8, every block
    checkpointed): under --op-level-sac both run the op-level policy (main scored the file as whole-layer
    recompute, 1.630 ms against the hand's 1.489 ms on this model); without it both recompute whole
    layers and the file says so."""
    toml = tmp_path / "job.toml"
    toml.write_text(TORCHTITAN_OP_SAC)
    flags = ("--op-level-sac",) if op_level_sac else ()
    result = run_ok(
        "search",
        "--arch",
        "titan-llama3-debugmodel",
        *SHAPE,
        "--runtime",
        "torchtitan",
        "--top",
        "1",
        "--json",
        "--out",
        tmp_path / "p.yaml",
        "--tp",
        "1",
        "--zero",
        "3",
        "--micro-batch-size",
        "1",
        "--hand-recompute",
        "full",
        "--from-torchtitan",
        toml,
        *flags,
    )
    hand, file = json.loads(result.stdout)["compared"]
    assert file["iteration_ms"] == pytest.approx(hand["iteration_ms"], rel=1e-12)
    assert file["degrees"] == hand["degrees"]
    assert (
        "scored as full recompute: search with --op-level-sac" in file["note"]
    ) is not op_level_sac
