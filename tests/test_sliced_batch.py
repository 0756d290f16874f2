"""A batch sliced from one tensor of seq + 1 tokens a row (inputs tokens[:, :-1], targets tokens[:, 1:], as the
Hugging Face model files' example_batch makes it) is profiled as the runtime holds it, each in storage of its own
(runtime/worker.py replica_batch clones its slice): Gemma 3's last stage was charged 4 x 32 B of the shared
storage's extra column and 3 x 1,024 B of a targets copy its loss never makes there (docs/published-runs.md
§44.smallfix)."""

from __future__ import annotations

import pathlib

from click.testing import CliRunner

from planner import io
from planner.cli import cli

VOCAB, WIDTH, SEQ, MICRO = 16, 8, 5, 3
MODEL = f'''
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Embedding({VOCAB}, {WIDTH}), nn.Linear({WIDTH}, {VOCAB}))


def example_batch(micro_batch_size):
    tokens = torch.randint(0, {VOCAB}, (micro_batch_size, {SEQ} + 1))
    return tokens[:, :-1], tokens[:, 1:]
'''


def _profiled(tmp_path: pathlib.Path, *how: str):
    model = tmp_path / "sliced.py"
    model.write_text(MODEL)
    out = tmp_path / "sliced.json"
    result = CliRunner().invoke(cli, ["profile", str(model), "--micro-batch-size", str(MICRO), *how, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return io.load_profile(out)


def test_the_batch_and_the_loss_are_the_runtimes_bytes(tmp_path):
    profile = _profiled(tmp_path, "--threads", "1", "--repeats", "1", "--warmup", "0")
    tokens = MICRO * SEQ * 8  # int64 ids, not the MICRO x (SEQ + 1) storage they were sliced from
    assert profile.batch_input_bytes == profile.batch_target_bytes == tokens
    # cross-entropy keeps its fp32 log-softmax, the loss value and nll_loss's total weight (4 B each); the
    # targets it saves are the batch's own, flattened as a view: no copy of them
    assert profile.loss_bytes == MICRO * SEQ * VOCAB * 4 + 4 + 4


def test_the_fake_profile_takes_them_alike(tmp_path):
    """A fake profile for a GPU counts each storage in the caching allocator's 512 B blocks."""
    profile = _profiled(tmp_path, "--fake", "--gpu", "h100")

    def block(nbytes: int) -> int:
        return -(-nbytes // 512) * 512

    assert profile.batch_input_bytes == profile.batch_target_bytes == block(MICRO * SEQ * 8)
    assert profile.loss_bytes == block(MICRO * SEQ * VOCAB * 4) + block(4) + block(4)  # no 512 B of targets
