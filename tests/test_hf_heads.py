"""`profile --hf-config` refuses an attention transformers cannot build, in one sentence before any layer runs
(planner/models/hfmodels.py _check_heads): before, the first decoder layer failed on a tensor size mismatch, named as
a broken layer contract (§67.usertrial67)."""

import json

import pytest

pytest.importorskip("transformers")

from fixtures.cli import run  # noqa: E402

OLMO2 = dict(model_type="olmo2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, pad_token_id=None)


@pytest.mark.parametrize(("change", "sentence"), [
    (dict(num_attention_heads=3, num_key_value_heads=3),
     "the olmo2 config's hidden_size 64 is not a multiple of its num_attention_heads 3, and it gives no head_dim"),
    (dict(num_key_value_heads=3), "the olmo2 config's num_key_value_heads 3 does not divide its num_attention_heads 4"),
    (dict(hidden_size=60), "the olmo2 config's heads of 15 rotate 15 dimensions, an odd number"),
    (dict(model_type="phi3", hidden_size=64, partial_rotary_factor=0.75),  # 16 x 0.75 = 12: builds
     None),
    (dict(model_type="phi3", hidden_size=80, num_attention_heads=4, partial_rotary_factor=0.25),  # 20 x 0.25 = 5
     "the phi3 config's heads of 20 rotate 5 dimensions, an odd number"),
])
def test_an_attention_transformers_cannot_build_is_refused_before_it_runs(tmp_path, change, sentence):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**OLMO2, **change}))
    out = tmp_path / "profile.json"
    result = run("profile", "--hf-config", config, "--fake", "--device", "cpu", "--seq-len", "16", "--out", out)
    if sentence is None:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1 and sentence in " ".join(result.output.split()), result.output
    assert "must accept the previous layer's output" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no model file, no profile left
