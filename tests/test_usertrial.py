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


def test_a_memory_without_a_unit_is_refused_before_anything_runs(tmp_path):
    """`solve --mem 24` (24 GB meant) ran the solver against a 24-byte cap and answered "no plan fits ... its cap
    of 24 B, 69118651633% over"; `search --mem 24` pruned 108 configurations first. A unitless memory under a MiB is
    refused in one sentence naming the units; with a unit, or as many bytes as a memory can hold, it still reads."""
    config = tmp_path / "opt.json"
    config.write_text(json.dumps(OPT))
    profile = tmp_path / "p.json"
    run_ok("profile", "--arch-config", config, "--seq-len", "32", "--gpu", "h100", "--out", profile)
    plan = tmp_path / "plan.yaml"
    tries = [("solve", "--profile", profile, "--stages", "2", "--out", plan, "--mem", "24"),
             ("solve", "--profile", profile, "--stages", "2", "--out", plan, "--mem", "80GB,24"),
             ("evaluate", "--profile", profile, "--layers-per-stage", "2,2", "--ckpt-per-stage", "0,0", "--mem", "24"),
             ("search", "--arch-config", config, "--gpus", "2", "--global-batch", "4", "--seq-len", "32", "--mem", "24")]
    for args in tries:
        result = run(*args)
        assert result.exit_code != 0, result.output
        assert "size '24' has no unit, so it reads as 24 bytes" in result.output, result.output
        assert "e.g. 24GB or 24GiB" in result.output
    assert not plan.exists()
    result = run("solve", "--profile", profile, "--stages", "1", "--mem", "1GB", "--dp", "2", "--offload-optimizer",
                 "--host-mem", "64", "--out", plan)
    assert result.exit_code != 0 and "--host-mem: size '64' has no unit" in result.output, result.output
    run_ok("solve", "--profile", profile, "--stages", "2", "--mem", str(80 * 10**9), "--out", plan)
    run_ok("solve", "--profile", profile, "--stages", "2", "--mem", "24GB", "--out", plan)


def test_a_torchtitan_float8_section_before_quantize_is_read_as_its_later_keys(tmp_path):
    """torchtitan's deepseek_v3_16b.toml as it shipped at 881f0ca (fixture) has a [float8] section with the
    converter commented out. Its filter_fqns and moe_fqns were listed "unknown: the prediction leaves it out" though
    no float8 converter runs (the 5b5d4685 rename to quantize.linear.float8 was read for two keys of six). Off, they
    have no effect; with model.converters = ["float8"] they say which matmuls Float8 takes, not modelled as given."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "configs" / "torchtitan_deepseek_v3_16b_881f0ca.toml"
    summary = json.loads(run_ok("evaluate", "--from-torchtitan", fixture, "--gpus", "8", "--json").stdout)
    said = {s["name"]: s["status"] for s in summary["settings"]}
    assert summary["model"] == "deepseek-v2-lite" and "unknown" not in said.values(), said
    assert said["float8.filter_fqns"] == said["float8.moe_fqns"] == "no effect"
    converted = tmp_path / "f8.toml"
    converted.write_text(fixture.read_text().replace('# converters = ["float8"]', 'converters = ["float8"]'))
    summary = json.loads(run_ok("evaluate", "--from-torchtitan", converted, "--gpus", "8", "--json").stdout)
    said = {s["name"]: s["status"] for s in summary["settings"]}
    assert said["model.converters"] == said["float8.filter_fqns"] == said["float8.moe_fqns"] == "not modelled"
    assert "unknown" not in said.values(), said


def test_the_experts_float8_fqns_without_their_converter_convert_nothing(tmp_path):
    """quantize.grouped_mm.float8.fqns = ["experts"] (torchtitan's deepseek_v3_16b.toml at 238fa9953e4a, whose
    converters line is commented out) was listed "not modelled" and calibrate said the residuals included its
    effect; torchtitan builds only the converters model.converters names, so it converts nothing."""
    from pathlib import Path

    fixture = Path(__file__).parent / "fixtures" / "configs" / "torchtitan_deepseek_v3_16b.toml"
    summary = json.loads(run_ok("evaluate", "--from-torchtitan", fixture, "--gpus", "8", "--json").stdout)
    said = {s["name"]: s["status"] for s in summary["settings"]}
    assert said["quantize.grouped_mm.float8.fqns"] == "no effect"
    converted = tmp_path / "converted.toml"
    converted.write_text(fixture.read_text().replace('# converters = ["float8"]',
                                                     'converters = ["quantize.grouped_mm.float8"]'))
    summary = json.loads(run_ok("evaluate", "--from-torchtitan", converted, "--gpus", "8", "--json").stdout)
    said = {s["name"]: s["status"] for s in summary["settings"]}
    assert said["quantize.grouped_mm.float8.fqns"] == said["model.converters"] == "not modelled"


def test_calibrates_step_time_row_is_named_without_a_unit_its_values_carry():
    """calibrate --from-log printed a row "step time ms" whose values read "10.40 s" and "11.01 s"."""
    from pathlib import Path

    fixtures = Path(__file__).parent / "fixtures"
    out = run_ok("calibrate", "--from-log", fixtures / "logs" / "torchtitan_405b.log", "--from-torchtitan",
                 fixtures / "configs" / "torchtitan_llama3_405b.toml", "--gpus", "128").output
    row = next(line for line in out.splitlines() if "step time" in line)
    assert "step time ms" not in row and re.search(r"step time\s.*\d s ", row), row


def test_an_opt_config_given_to_hf_config_is_pointed_to_the_reader_that_takes_it(tmp_path):
    """profile --hf-config configs/hf/opt-1.3b.json said only "write a model file for it", where --arch-config
    reads OPT (its analytic profile, search): the refusal names it, as --arch-config's names --hf-config."""
    config = tmp_path / "opt.json"
    config.write_text(json.dumps(OPT))
    result = run("profile", "--hf-config", config, "--seq-len", "32", "--out", tmp_path / "p.json")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "model_type 'opt' is not one ckplan builds from a config" in said
    assert "`ckplan profile --arch-config CONFIG` reads it" in said and not (tmp_path / "p.json").exists()
    falcon = tmp_path / "falcon.json"
    falcon.write_text(json.dumps({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "vocab_size": 100}))
    said = " ".join(run("profile", "--hf-config", falcon, "--seq-len", "32", "--out", tmp_path / "f.json").output.split())
    assert "write a model file for it" in said and "--arch-config" not in said  # neither reader takes Falcon


def test_a_misspelled_hf_set_key_is_refused_not_kept_and_ignored(tmp_path):
    """`profile --hf-config configs/hf/qwen3-0.6b.json --hf-set num_hiden_layers=2 --fake` profiled all 28 layers:
    transformers keeps an unknown key as an attribute and builds the model without it."""
    from pathlib import Path

    config = Path(__file__).parents[1] / "configs" / "hf" / "qwen3-0.6b.json"
    out = tmp_path / "p.json"
    result = run("profile", "--hf-config", config, "--hf-set", "num_hiden_layers=2", "--fake", "--seq-len", "32",
                 "--out", out)
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and not out.exists(), said
    assert "--hf-set num_hiden_layers: neither the config nor transformers' Qwen3Config has num_hiden_layers" in said
    assert "did you mean num_hidden_layers?" in said
