"""Defects a user's pass over models and configs no test used found (docs/published-runs.md §39.usertrial3):
each test fails on the commit before its fix."""

from __future__ import annotations

import re

from fixtures.cli import run_ok

from planner.console import console
from planner.models.configs.megatron_flags import ENV_VARS

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
