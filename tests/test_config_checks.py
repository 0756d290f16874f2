"""Configs are read, never run, and never completed: `--hf-config` reads a local file only
(no hub, no cache, no code of the config's own, no prompt), a size field that is missing or not
a positive whole number is refused in one sentence naming it, the layer count is bounded up
front, and a field that changes memory is modelled or refused. `export --out` and `--hf-config`
never overwrite a file the user owns."""

import json

import pytest
from click.testing import CliRunner
from export_plans import write
from fixtures.cli import run, run_ok

from planner.cli import cli
from planner.errors import UserError
from planner.models import archconfig, archs

SMALL = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def _config(tmp_path, **changes) -> str:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    config = {key: value for key, value in (SMALL | changes).items() if value is not ...}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


# ---------------------------------------------------------------- --hf-config: read, never run


def test_a_config_with_its_own_code_is_refused_and_nothing_runs_whatever_stdin_says(tmp_path, monkeypatch):
    """A config whose auto_map names a configuration_*.py beside it: transformers asked "run the
    custom code? [y/N]", and "y" ran it. Now: one sentence, no prompt, nothing run. (In this
    process, stdin "y" twice: a prompt read by input() or click would get it and run the code.)"""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "configuration_evil.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('ran')\n")
    config = SMALL | {"auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(cli, ["profile", "--hf-config", str(folder), "--out", str(tmp_path / "p.json")],
                              input="y\ny\n")
    assert isinstance(done.exception, SystemExit), done.exc_info  # a clean exit, not an exception
    assert done.exit_code == 1 and "auto_map" in done.output and "Traceback" not in done.output
    assert "[y/N]" not in done.output
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "hf_model.py").exists()


def test_a_model_id_is_never_looked_up_in_the_hub_or_its_cache(tmp_path, monkeypatch):
    """A model id that is not a local folder: one sentence, and transformers is never asked."""
    from planner.models import hfmodels

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hfmodels, "transformers_offline", lambda: pytest.fail("transformers was asked"))
    result = run("profile", "--hf-config", "meta-llama/Llama-3.1-8B")
    assert result.exit_code == 1 and "never the Hugging Face hub or its cache" in result.output
    assert not (tmp_path / "profiles").exists()


def test_transformers_is_imported_offline():
    from planner.models import hfmodels

    hfmodels.hf_config(SMALL)
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"


# ---------------------------------------------------------------- sizes given, never completed


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                   "intermediate_size"])
def test_hf_config_missing_a_size_is_refused_naming_it(tmp_path, field):
    """Without hidden_size the model was built at transformers' 4096 and profiled for 11 minutes."""
    result = run("profile", "--hf-config", _config(tmp_path, **{field: ...}), "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and f"has no {field}" in result.output and "transformers' defaults" in result.output
    assert not list(tmp_path.glob("model/hf_*.py")) and not (tmp_path / "hf_model.py").exists()


@pytest.mark.parametrize("field, value", [("hidden_size", -64), ("hidden_size", 64.5), ("num_hidden_layers", -1),
                                          ("num_attention_heads", 0), ("vocab_size", "256"), ("num_key_value_heads", 1.5),
                                          ("num_hidden_layers", True)])
def test_hf_config_with_a_size_that_is_not_a_positive_whole_number_is_refused(tmp_path, field, value):
    result = run("profile", "--hf-config", _config(tmp_path, **{field: value}), "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and f"{field} must be a positive whole number" in result.output, result.output


@pytest.mark.parametrize("layers", [10**5, 10**9])
def test_hf_config_layers_are_bounded_up_front(tmp_path, layers):
    result = run("profile", "--hf-config", _config(tmp_path, num_hidden_layers=layers), "--fake")
    assert result.exit_code == 1 and f"past the {archs.MAX_LAYERS} decoder layers" in result.output


def test_gemma_without_head_dim_is_refused(tmp_path):
    result = run("profile", "--hf-config", _config(tmp_path, model_type="gemma"), "--fake")
    assert result.exit_code == 1 and "has no head_dim" in result.output


@pytest.mark.parametrize("layers", [10**5, 10**7, 10**9])
@pytest.mark.parametrize("model_type, key", [("llama", "num_hidden_layers"), ("gpt2", "n_layer")])
def test_arch_config_layers_are_bounded_up_front(tmp_path, layers, model_type, key):
    config = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 128,
              "n_layer": layers} if model_type == "gpt2" else SMALL | {key: layers}
    (tmp_path / "c.json").write_text(json.dumps(config))
    result = run("profile", "--arch-config", str(tmp_path / "c.json"), "--seq-len", "64", "--out",
                 str(tmp_path / "p.json"))
    assert result.exit_code == 1 and f"{key} = {layers} is past the 1024 decoder layers" in result.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("config, fragment", [
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 128,
      "num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256}, "has no n_positions"),
    ({"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 256, "max_position_embeddings": 64, "num_key_value_heads": 0},
     "num_key_value_heads must be a positive integer"),
    (SMALL | {"hidden_size": -64}, "hidden_size must be a positive integer"),
    (SMALL | {"hidden_size": 64.5}, "hidden_size must be a positive integer"),
    (SMALL | {"num_hidden_layers": -1}, "num_hidden_layers must be a positive integer"),
    (SMALL | {"rope_theta": "1e6"}, "rope_theta must be a positive number"),
    (SMALL | {"rms_norm_eps": 2}, "rms_norm_eps must be a number between 0 and 1"),
    (SMALL | {"rope_scaling": {"rope_type": "mystery", "factor": 2}}, "rope_scaling"),
    (SMALL | {"model_type": "gemma"}, "has no head_dim"),
])
def test_arch_config_fields_that_set_size_or_memory_are_read_or_refused(config, fragment):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(")):
        archconfig.from_hf_config(config, where="c.json", name="c")


def test_arch_config_reads_positions_and_norms_in_both_transformers_spellings():
    four = archconfig.from_hf_config(SMALL | {"rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                          "original_max_position_embeddings": 8192}},
                                where="c", name="c")
    five = archconfig.from_hf_config(SMALL | {"rms_norm_eps": 1e-5, "rope_parameters": {
        "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}},
        where="c", name="c")
    assert four.rope_theta == five.rope_theta == 500000.0 and four.rope_scaling == five.rope_scaling == \
        ("llama3", 8.0, 8192) and four.norm_eps == 1e-5
    assert four.canonical_json() == archconfig.from_hf_config(SMALL, where="c", name="c").canonical_json()  # pins no more


def test_an_analytic_profile_says_which_precision_solve_plans(tmp_path):
    result = run_ok("profile", "--arch", "llama3-8b", "--seq-len", "1024", "--out", str(tmp_path / "p.json"))
    said = " ".join(result.output.split())
    assert "`ckplan solve` plans fp32 weights, gradients and Adam state unless told" in said
    assert "pass --precision bf16-mixed" in said


# ---------------------------------------------------------------- a user's file never overwritten


def test_export_out_may_not_be_the_plans_own_profile(tmp_path):
    """`export PLAN --out PROFILE` replaced the plan's profile with shell text and exited 0."""
    _, _, plan = write(tmp_path, [4, 3, 3], set())
    before = (tmp_path / "llm.json").read_bytes()
    for out in (tmp_path / "llm.json", plan):
        result = run("export", str(plan), "--to", "megatron", "--out", str(out))
        assert result.exit_code == 1 and "would overwrite it" in result.output, result.output
    assert (tmp_path / "llm.json").read_bytes() == before
    assert not list(tmp_path.glob("plan.megatron.sh"))


@pytest.mark.parametrize("out", ["/proc/x.json", "{tmp}/model", "{tmp}/model/config.json"])
def test_hf_config_writes_its_model_file_only_after_out_is_checked(tmp_path, monkeypatch, out):
    """--out /proc/x.json made it write /proc/hf_<name>.py; a refused run left hf_<name>.py behind."""
    monkeypatch.chdir(tmp_path)
    folder = _config(tmp_path)
    result = run("profile", "--hf-config", folder, "--out", out.format(tmp=tmp_path))
    assert result.exit_code == 1, result.output
    assert not list(tmp_path.rglob("hf_*.py")) and not (tmp_path / "profiles").exists()
    assert not __import__("pathlib").Path("/proc/hf_model.py").exists()


def test_a_model_file_this_run_wrote_is_removed_when_the_run_fails_after_it(tmp_path, monkeypatch):
    """The model file is written after every check of --out; a run that fails later (here: its
    measurement) leaves no hf_<name>.py it wrote, and keeps one it found."""
    from planner.errors import UserError as Refused

    def fails(*args, **kwargs):
        raise Refused("the measurement failed")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("planner.commands.profile._load", fails)
    folder = _config(tmp_path)
    result = run("profile", "--hf-config", folder, "--out", "p.json")
    assert result.exit_code == 1 and "the measurement failed" in result.output
    assert not (tmp_path / "hf_model.py").exists()
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    # measured at one repeat: 3 CPU seconds where --fake took 15
    run_ok("profile", "--hf-config", folder, "--out", "p.json", "--threads", "1", "--repeats", "1", "--warmup", "0")
    assert (tmp_path / "hf_model.py").exists()  # profiled: kept
    monkeypatch.setattr("planner.commands.profile._load", fails)
    assert run("profile", "--hf-config", folder, "--out", "p.json").exit_code == 1
    assert (tmp_path / "hf_model.py").exists()  # not this run's: kept
