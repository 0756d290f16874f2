"""Each export reproduces the model and the sequence length, or refuses in one sentence:
Megatron-LM's flags carry the rotary base, the norm epsilon, Llama 3.1's rope scaling, the biases
and the widths (its defaults would train another model); torchtitan refuses a base config that
builds another model, and sets seq_len."""

import re

import pytest
from fixtures.cli import run, run_ok

from planner import io


def _plan(tmp_path, arch: str, *extra: str, seq_len: int = 4096, mem: str = "1TB"):
    profile, plan = tmp_path / "a.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", arch, "--seq-len", str(seq_len), *extra, "--out", str(profile))
    run_ok("solve", "--profile", str(profile), "--stages", "4", "--microbatches", "8", "--precision", "bf16-mixed",
           "--mem", mem, "--out", str(plan))
    return profile, plan


def _megatron_flags(tmp_path, arch: str, *extra: str) -> tuple[dict[str, str], str]:
    _, plan = _plan(tmp_path, arch, *extra)
    run_ok("export", str(plan), "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    return dict(re.findall(r"^\s+(--[\w-]+) ?(.*)$", text, flags=re.M)), text


def test_megatron_export_of_qwen2_5_72b_is_qwen2_5_72b(tmp_path):
    flags, text = _megatron_flags(tmp_path, "qwen2.5-72b", "--tp", "8")
    assert {key: flags[key] for key in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                                        "--num-query-groups", "--rotary-base", "--norm-epsilon", "--seq-length",
                                        "--normalization")} == {
        "--num-layers": "80", "--hidden-size": "8192", "--ffn-hidden-size": "29568", "--num-attention-heads": "64",
        "--num-query-groups": "8", "--rotary-base": "1000000", "--norm-epsilon": "1e-06", "--seq-length": "4096",
        "--normalization": "RMSNorm"}
    assert {"--add-qkv-bias", "--untie-embeddings-and-output-weights", "--group-query-attention", "--swiglu",
            "--disable-bias-linear"} <= set(flags)
    assert "--use-rope-scaling" not in flags and "# vocabulary 152064" in text
    assert flags["--make-vocab-size-divisible-by"] == "64"  # 64 x TP 8 divides 152064; Megatron's 128 would pad it


def test_megatron_keeps_the_vocabulary_unpadded_where_it_can():
    from planner.emit.megatron import vocab_arguments

    assert vocab_arguments(128256, 4)[-1] == "--make-vocab-size-divisible-by 64"  # 128 x 4 would make 128512
    assert vocab_arguments(32000, 1)[-1] == "--make-vocab-size-divisible-by 128"
    assert vocab_arguments(50257, 2)[0].startswith("# vocabulary 50257") and len(vocab_arguments(50257, 2)) == 1


def test_megatron_export_of_llama_models(tmp_path):
    flags, _ = _megatron_flags(tmp_path, "llama3-8b")
    assert (flags["--rotary-base"], flags["--norm-epsilon"]) == ("500000", "1e-05")
    assert "--add-qkv-bias" not in flags and "--use-rope-scaling" not in flags
    (tmp_path / "l2").mkdir()
    flags, _ = _megatron_flags(tmp_path / "l2", "llama2-7b")
    assert (flags["--rotary-base"], flags["--norm-epsilon"]) == ("10000", "1e-05")
    assert "--group-query-attention" not in flags


def test_megatron_export_of_llama_3_1_scales_its_rope(tmp_path):
    _, plan = _plan(tmp_path, "llama3.1-405b", "--tp", "8", seq_len=2048)
    run_ok("export", str(plan), "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    assert "--use-rope-scaling" in text and "--rope-scaling-factor 8" in text and "--rotary-base 500000" in text


def test_megatron_export_of_an_arch_config_carries_what_the_config_says(tmp_path):
    import json

    config = {"model_type": "qwen2", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
              "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "rope_theta": 250000.0,
              "rms_norm_eps": 1e-06, "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(config))
    profile, plan = tmp_path / "a.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch-config", str(tmp_path / "config.json"), "--seq-len", "1024", "--out", str(profile))
    run_ok("solve", "--profile", str(profile), "--stages", "2", "--precision", "bf16-mixed", "--out", str(plan))
    run_ok("export", str(plan), "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    assert "--rotary-base 250000" in text and "--norm-epsilon 1e-06" in text and "--add-qkv-bias" in text


def test_megatron_export_refuses_a_profile_that_does_not_know_the_rotary_base(tmp_path):
    """A profile written before ckplan recorded rope_theta: Megatron-LM's default 10000 would train
    another model than LLaMA 3's 500000."""
    profile, plan = _plan(tmp_path, "llama3-8b")
    data = io.load_profile(profile)
    model = {k: v for k, v in data.assumptions["model"].items() if k not in ("rope_theta", "norm_eps")}
    io.save_profile(data.model_copy(update={"assumptions": data.assumptions | {"model": model}}), profile)
    # the plan pins the profile's sha: solved again on the edited profile
    run_ok("solve", "--profile", str(profile), "--stages", "4", "--precision", "bf16-mixed", "--mem", "1TB",
           "--out", str(plan))
    result = run("export", str(plan), "--to", "megatron")
    assert result.exit_code == 1 and "does not record the model's rope_theta" in result.output
    assert not (tmp_path / "plan.megatron.sh").exists()


def test_torchtitan_refuses_a_base_that_builds_another_model(tmp_path):
    """llama3_70b for Qwen2.5-72B: the same depth and width, another MLP, vocabulary, biases and
    rotary base. It was accepted."""
    _, plan = _plan(tmp_path, "qwen2.5-72b", "--tp", "8")
    result = run("export", str(plan), "--to", "torchtitan", "--torchtitan-base",
                 "torchtitan.models.llama3.config_registry:llama3_70b")
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    for fragment in ("builds llama3-70b, not this plan's model", "intermediate_size 29568 (the base: 28672)",
                     "vocab_size 152064 (the base: 128256)", "qkv_bias True (the base: False)",
                     "rope_theta 1000000.0 (the base: 500000.0)"):
        assert fragment in said, said
    assert not (tmp_path / "plan_torchtitan.py").exists()


@pytest.mark.parametrize("version, line", [("0.3.0", "config.training.seq_len = 4096"), ("0.2.0", "seq_len = 4096")])
def test_torchtitan_export_sets_the_sequence_length(tmp_path, version, line):
    _, plan = _plan(tmp_path, "llama3-8b")
    run_ok("export", str(plan), "--to", "torchtitan", "--torchtitan-version", version)
    text = (tmp_path / ("plan_torchtitan.py" if version == "0.3.0" else "plan.torchtitan.toml")).read_text()
    assert re.search(rf"^\s*{re.escape(line)}$", text, flags=re.M), text


@pytest.mark.parametrize("target", ["colossalai", "deepspeed"])
def test_exports_without_a_sequence_setting_say_the_length_the_plan_is_for(tmp_path, target):
    _, plan = _plan(tmp_path, "llama3-8b")
    run_ok("export", str(plan), "--to", target)
    text = (tmp_path / f"plan.{target}.py").read_text()
    assert "# The plan's memory and times are for sequences of 4096 tokens" in text


def test_megatron_export_of_a_config_without_rope_theta_says_to_write_it_into_the_config(tmp_path):
    """A config that names no rope_theta, profiled today: the refusal said to re-create the profile
    with this ckplan, which gave the same profile and the same refusal."""
    import json

    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024, "rms_norm_eps": 1e-05,
              "max_position_embeddings": 1024}
    (tmp_path / "config.json").write_text(json.dumps(config))
    profile, plan = tmp_path / "a.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch-config", str(tmp_path / "config.json"), "--seq-len", "256", "--out", str(profile))
    run_ok("solve", "--profile", str(profile), "--stages", "2", "--precision", "bf16-mixed", "--out", str(plan))
    result = run("export", str(plan), "--to", "megatron")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "(the --arch-config it was made from names none, or an older ckplan made it)" in said
    assert "write the model's rope_theta into the config and profile it again" in said
    assert not (tmp_path / "plan.megatron.sh").exists()
