"""Defects a user's pass over models and configs no test used found (docs/published-runs.md §39.usertrial3):
each test fails on the commit before its fix."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest
from export_plans import write
from fixtures.cli import run_ok
from test_search import MINI, profile_for
from test_search_bounds import random_stages

from planner.console import console
from planner.cost import costmodel
from planner.models.configs.megatron_flags import ENV_VARS, yaml_extras
from planner.schema import TrainSetup
from planner.solve.bounds import setup_bounds

GIB = 2**30

TINY_GPT_YAML = """ENV_VARS:
  CUDA_DEVICE_MAX_CONNECTIONS: 1
MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 256
  --num-attention-heads: 4
  --ffn-hidden-size: 1024
  --seq-length: 512
  --max-position-embeddings: 512
  --micro-batch-size: 1
  --global-batch-size: 8
  --vocab-size: 1024
  --bf16: true
"""


def test_a_not_modelled_flags_sentence_is_printed_whole(tmp_path):
    """The not-modelled table's "what" column was laid out as a number (right_from's default 1): never
    wrapped, so a sentence longer than the console went into a second table and was cut at its edge
    (Megatron-LM's functional-test YAMLs set CUDA_DEVICE_MAX_CONNECTIONS, whose reason is 390 characters)."""
    path = tmp_path / "model_config.yaml"
    path.write_text(TINY_GPT_YAML)
    out = run_ok("evaluate", "--from-megatron", path, "--gpus", "1").output
    table = out[out.index("not modelled:"):out.index("modelled (")]
    assert max(len(line) for line in table.splitlines()) <= console.width
    words = " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘━─╇┳┻┼┬┴]", " ", table).split())
    assert " ".join(ENV_VARS["CUDA_DEVICE_MAX_CONNECTIONS"][2].split()) in words


@pytest.mark.parametrize("ranks, chunks", [(2, 3), (4, 2)])
def test_search_bounds_a_tied_model_under_interleaved_1f1b_as_evaluate_scores_it(ranks, chunks):
    """`ckplan search --hf-config llama-3.2-3b.json` (tied embeddings) stopped with "interleaved-1F1B needs at least
    one rank, chunk and microbatch, not P=0, V=7": the bounds read a layer's terms on the setup of P ranks, where
    evaluate gives them its P·V stages (costmodel.stages_view), and the tied sum took P // V ranks."""
    arch = dataclasses.replace(MINI, tie_word_embeddings=True)
    profile = profile_for(arch)(1, False, 1)
    assert profile.tied
    setup = TrainSetup(stages=ranks, microbatches=2 * ranks, micro_batch_size=1, schedule="interleaved-1F1B",
                       chunks=chunks, mem_caps_bytes=[80 * GIB] * ranks, precision="bf16-mixed")
    bound = setup_bounds(profile, setup)
    rng = random.Random(3)
    for _ in range(10):
        plan = costmodel.ranks_of(random_stages(profile, ranks * chunks, rng, setup), setup)
        cost = costmodel.evaluate(plan, profile, setup)
        assert bound.time_ms <= cost.iteration_ms * (1 + 1e-9)
        assert bound.static_bytes <= max(c.peak_bytes for c in cost.stages) * (1 + 1e-9)


def test_export_says_when_a_plans_micro_batch_size_is_not_its_profiles(tmp_path):
    """A plan.yaml edited by hand to micro_batch_size 2 (its profile made at 1) was exported with
    --micro-batch-size 2 and --global-batch-size halved, scored with the profile's figures for 1, without a word."""
    _, plan, path = write(tmp_path, [4, 3, 3], set())
    edited = tmp_path / "edited.yaml"
    edited.write_text(path.read_text().replace("    micro_batch_size: 1\n", "    micro_batch_size: 2\n", 1))
    said = " ".join(run_ok("export", edited, "--to", "megatron", "--out", tmp_path / "e.sh").output.split())
    assert (f"warning: {edited} gives micro_batch_size 2, and its profile was made at 1: the file written says 2, "
            "while its stages and the figures beside it are for 1; re-profile with --micro-batch-size 2 and re-run "
            "`ckplan solve` to plan for 2") in said
    assert "micro_batch_size" not in run_ok("export", path, "--to", "megatron", "--out", tmp_path / "p.sh").output


@pytest.mark.parametrize("value, status", [("1", "modelled"), ("0", "not modelled")])
def test_transformer_engines_default_nondeterministic_attention_is_not_listed_as_the_deterministic_one(value, status):
    """Megatron-LM's nondeterministic functional tests set NVTE_ALLOW_NONDETERMINISTIC_ALGO: 1, Transformer Engine's
    default (its attention reads os.getenv(..., "1")): it was listed "not modelled" with the sentence for 0, its
    deterministic backward, though the prediction times the default kernels."""
    (name, said, got, what), = yaml_extras({"MODEL_ARGS": {}, "ENV_VARS": {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": int(value)}})
    assert (name, said, got) == ("ENV_VARS.NVTE_ALLOW_NONDETERMINISTIC_ALGO", value, status)
    assert what.startswith(f"{value}, Transformer Engine's default" if value == "1" else "0: Transformer Engine's deterministic")


@pytest.mark.parametrize("name", ["Interleaved1F1B", "interleaved1f1b", "INTERLEAVED1F1B"])
def test_a_torchtitan_schedule_name_is_read_in_any_case_as_torch_reads_it(tmp_path, name):
    """torch's get_schedule_class maps the name case-insensitively (pipelining/schedules.py 3620-3644 at 2.13.0),
    so torchtitan runs `pipeline_parallel_schedule = "Interleaved1F1b"`; ckplan refused it as not one it scores."""
    from planner.models.configs import torchtitan

    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nseq_len = 8192\nlocal_batch_size = 4\n'
                    f'[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "{name}"\n')
    job = torchtitan.read(path)
    assert (job.pp, job.schedule) == (2, "interleaved-1F1B")
