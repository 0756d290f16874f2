"""Defects a user trial found on configs no other test used (docs/published-runs.md §33.usertrial):
each a CliRunner run of what a user types, with the figure or sentence it must give."""

from __future__ import annotations

import json
import re

from fixtures.cli import run, run_ok

# OPT as transformers' OPTConfig builds it (tied embeddings: PretrainedConfig's default), two small layers
OPT = {"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
       "vocab_size": 1000, "max_position_embeddings": 128, "dropout": 0.0}


def test_an_analytic_profile_counts_a_tied_table_once(tmp_path):
    """profile --arch-config printed OPT-1.3B's 1,418,715,136 parameters: its tied embedding and LM head twice
    (transformers builds 1,315,758,080). By hand, the tiny OPT: the token table 1000 x 64 and the positions'
    (128 + 2) x 64; a block's q, k, v, o (64 x 64 + 64 each), fc1 (64 x 256 + 256), fc2 (256 x 64 + 64) and two
    LayerNorms (2 x 64 each); the final LayerNorm; the head is the token table (transformers' meta build: 172,416)."""
    config = tmp_path / "opt.json"
    config.write_text(json.dumps(OPT))
    out = run_ok("profile", "--arch-config", config, "--seq-len", "32", "--gpu", "h100", "--out", tmp_path / "p.json")
    block = 4 * (64 * 64 + 64) + (64 * 256 + 256) + (256 * 64 + 64) + 2 * 2 * 64
    by_hand = 1000 * 64 + 130 * 64 + 2 * block + 2 * 64
    assert by_hand == 172_416
    printed = re.search(r"per device: ([0-9,]+) parameters", " ".join(out.output.split()))
    assert printed and int(printed.group(1).replace(",", "")) == by_hand
