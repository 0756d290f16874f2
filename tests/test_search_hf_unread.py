"""`ckplan search --hf-config` on a family ckplan builds from transformers' code but does not read from its formulas
(OLMo 2): one sentence that covers the flag the user typed and gives the route (profile --hf-config --fake, then
search --profile); it named --arch-config alone (§67.usertrial67)."""

import json

from fixtures.cli import run


def test_search_hf_config_of_a_family_read_only_from_code_says_the_route(tmp_path):
    config = tmp_path / "olmo2.json"
    config.write_text(json.dumps({"model_type": "olmo2", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256}))
    result = run("search", "--hf-config", config, "--gpus", "2", "--global-batch", "4", "--seq-len", "32",
                 "--out", tmp_path / "plan.yaml")
    said = " ".join(result.output.split())
    assert result.exit_code == 1
    assert "model_type 'olmo2' is not read; --arch-config reads" in said
    assert "`search --hf-config` reads the same" in said
    assert "`ckplan profile --hf-config CONFIG --fake` runs transformers' own olmo2 code" in said
    assert not (tmp_path / "plan.yaml").exists()
