"""`profile --hf-config`: Hugging Face causal LMs from a config alone (random weights,
nothing downloaded), cut into pipeline layers that compute what the model's own forward()
does, and trained through the pipeline like one process."""

import json

import pytest

transformers = pytest.importorskip("transformers")

from fixtures.cli import run, run_ok  # noqa: E402

from planner import io  # noqa: E402
from planner.errors import UserError  # noqa: E402
from planner.models import hfmodels, modelfile  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256, max_position_embeddings=128)
CONFIGS = {
    "llama": dict(model_type="llama", **SMALL),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, **SMALL),
    "qwen3": dict(model_type="qwen3", head_dim=32, tie_word_embeddings=False, **SMALL),  # q/k norms, head_dim given
    "mistral": dict(model_type="mistral", sliding_window=64, **SMALL),
    "gemma": dict(model_type="gemma", head_dim=16, **SMALL),  # ties its embedding, scales it by sqrt(hidden)
    # Gemma 3: local and global layers (each its own rotary tables), four norms, q/k norms; SmolLM3's NoPE layer
    "gemma3_text": dict(model_type="gemma3_text", head_dim=16, sliding_window=64, sliding_window_pattern=2, **SMALL),
    "smollm3": dict(model_type="smollm3", no_rope_layer_interval=2, pad_token_id=None, **SMALL),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128),
    # mixture-of-experts: 4 routed experts, top 2 (Qwen2-MoE also a shared expert)
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, **SMALL),
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, **SMALL),
    # LLaMA-shaped layers with their own parts: Phi-3's fused qkv and gate_up (its pad_token_id, 32000 by
    # default, past this vocabulary), OLMo 2's q/k norms and norms after attention and MLP, StarCoder2's
    # biases, LayerNorms, GeLU MLP and embedding dropout, Phi-3.5-MoE's experts
    "phi3": dict(model_type="phi3", pad_token_id=None, tie_word_embeddings=False, **SMALL),
    "olmo2": dict(model_type="olmo2", tie_word_embeddings=False, **SMALL),
    "starcoder2": dict(model_type="starcoder2", embedding_dropout=0.1, tie_word_embeddings=True, **SMALL),
    "phimoe": dict(model_type="phimoe", num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                   **SMALL),
    # scales applied in the models' forward(), outside any layer: Granite's embedding_multiplier and
    # logits_scaling, Cohere's logit_scale (the chain must apply them to equal forward())
    "granite": dict(model_type="granite", embedding_multiplier=12.0, logits_scaling=16.0, residual_multiplier=0.22,
                    attention_multiplier=0.0078125, tie_word_embeddings=True, **SMALL),
    "cohere": dict(model_type="cohere", logit_scale=0.0625, tie_word_embeddings=True, **SMALL),
    # more mixtures of experts on the experts contract: Qwen3-MoE (head_dim its own), OLMoE, GraniteMoE (with
    # Granite's multipliers)
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      tie_word_embeddings=False, **SMALL),
    "olmoe": dict(model_type="olmoe", num_experts=4, num_experts_per_tok=2, pad_token_id=None, tie_word_embeddings=False,
                  **SMALL),
    "granitemoe": dict(model_type="granitemoe", num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0,
                       logits_scaling=16.0, residual_multiplier=0.22, tie_word_embeddings=True, **SMALL),
    # latent attention (as many K/V heads as query heads) and group-limited routing over 4 experts in 2 groups
    # beside a shared expert; layer 0 dense (first_k_dense_replace 1), layer 1 the mixture
    **{family: dict(model_type=family, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                    topk_group=1, first_k_dense_replace=1, moe_intermediate_size=32, kv_lora_rank=16, q_lora_rank=24,
                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, tie_word_embeddings=False,
                    **{**SMALL, "num_key_value_heads": 4})
       for family in ("deepseek_v2", "deepseek_v3")},
}
TIED = {"llama": False, "qwen2": True, "qwen3": False, "mistral": False, "gemma": True, "gpt2": True, "mixtral": False,
        "qwen2_moe": False, "phi3": False, "olmo2": False, "starcoder2": True, "phimoe": False, "granite": True,
        "cohere": True, "qwen3_moe": False, "olmoe": False, "granitemoe": True, "deepseek_v2": False, "deepseek_v3": False,
        "gemma3_text": True, "smollm3": True}


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "phimoe", "qwen3_moe", "olmoe", "granitemoe", "deepseek_v2",
                                    "deepseek_v3"])
def test_each_mixture_of_experts_family_follows_the_experts_contract(family):
    """The profile records routing and --ep splits the experts only where the layer's experts follow
    planner/runtime/routing.py's contract: 4 experts stacked, each token's 2 copies routed."""
    import torch

    from planner.runtime import routing

    build_model, example_batch = hfmodels.model_file(CONFIGS[family], seq_len=16)
    layer = build_model().layers[-1]  # a MoE layer in every family (DeepSeek's first is dense here)
    (name, experts), = routing.find_experts(layer)
    assert name.endswith("experts") and experts.num_experts == 4
    with torch.no_grad():
        found = routing.layer_routing(layer, torch.randn(3, 16, 64))
    assert len(found.routed_tokens) == 4 and sum(found.routed_tokens) == 3 * 16 * 2


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_each_family_cuts_into_layers_that_compute_the_models_own_forward(family):
    import torch

    build_model, example_batch = hfmodels.model_file(CONFIGS[family], seq_len=16)
    torch.manual_seed(0)
    model = build_model()
    layers = modelfile.pipeline_layers(model)
    assert [name for name, _ in layers] == ["embed", "layers.0", "layers.1", "head"]
    inputs, targets = example_batch(3)
    assert inputs.shape == targets.shape == (3, 16) and int(inputs.max()) < 256
    outputs = modelfile.check_chain(layers, inputs)
    assert outputs[-1].shape == (3, 16, 256)
    assert modelfile.forward_mismatch(model, layers, inputs) is None  # equal to HF's forward(), causal mask included
    embedding = getattr(model.embed, "embed_tokens", None) or model.embed.wte
    assert (embedding.weight is model.head.lm_head.weight) == TIED[family]
    # causal: the first position's logits do not depend on the later tokens
    changed = inputs.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 256
    model.eval()  # no dropout
    with torch.no_grad():
        first, second = (modelfile.check_chain(layers, batch)[-1] for batch in (inputs, changed))
    assert torch.allclose(first[:, :8], second[:, :8], atol=1e-5) and not torch.allclose(first, second)


def test_new_families_parameters_by_hand():
    # one decoder layer at hidden 64, 4 heads of 16, 2 KV heads, MLP 128
    attention, mlp = 64 * 64 * 2 + 64 * 32 * 2, 3 * 64 * 128
    per_layer = {
        "phi3": attention + mlp + 2 * 64,  # qkv_proj (64 x 128) and gate_up_proj fused: the same weights
        "olmo2": attention + mlp + 64 + 32 + 2 * 64,  # q_norm over 4 x 16, k_norm over 2 x 16
        "starcoder2": attention + (64 + 32 + 32 + 64) + 2 * 64 * 128 + 128 + 64 + 2 * 2 * 64,  # biases, GeLU MLP
        "granite": attention + mlp + 2 * 64,
        "cohere": attention + mlp + 64,  # one LayerNorm (no bias): attention and MLP read it in parallel
    }
    for family, count in per_layer.items():
        model = hfmodels.model_file(CONFIGS[family], seq_len=16)[0]()
        assert sum(p.numel() for p in model.layers[0].parameters()) == count, family


def test_a_default_pad_token_past_a_small_vocabulary_is_refused_in_one_sentence(tmp_path):
    # Phi3Config's pad_token_id defaults to 32000: --hf-set vocab_size=256 made transformers' nn.Embedding
    # raise an AssertionError, printed as a traceback
    config = {key: value for key, value in CONFIGS["phi3"].items() if key != "pad_token_id"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run("profile", "--hf-config", str(tmp_path), "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert ("the phi3 config's pad_token_id 32000 (transformers' default, the config giving none) is not below its "
            "vocab_size 256") in " ".join(result.output.split())
    assert not (tmp_path / "p.json").exists()
    hfmodels.check_config({**config, "pad_token_id": None}, seq_len=16)


def test_configs_ckplan_cannot_build_are_refused_in_one_sentence(tmp_path):
    with pytest.raises(UserError, match="model_type 'llama4' is not one ckplan builds"):
        hfmodels.check_config({"model_type": "llama4"}, seq_len=16)
    with pytest.raises(UserError, match="GptOss has no SDPA attention"):  # GPT-OSS: --arch-config reads it
        hfmodels.check_config({"model_type": "gpt_oss"}, seq_len=16)
    # DeepSeek's shared experts and dense layers are counts given, 0 or more (transformers fills 1 and 3)
    given = {k: v for k, v in CONFIGS["deepseek_v3"].items() if k != "first_k_dense_replace"}
    with pytest.raises(UserError, match="the deepseek_v3 config's first_k_dense_replace must be given"):
        hfmodels.check_config(given, seq_len=16)
    # Qwen3's head_dim is its own (transformers' default 128, not hidden / heads): never filled in
    with pytest.raises(UserError, match="the qwen3 config has no head_dim"):
        hfmodels.check_config({k: v for k, v in CONFIGS["qwen3"].items() if k != "head_dim"}, seq_len=16)
    with pytest.raises(UserError, match="exceeds the config's sliding_window 64"):
        hfmodels.check_config(CONFIGS["mistral"], seq_len=100)
    with pytest.raises(UserError, match="exceeds the config's max_position_embeddings 128"):
        hfmodels.check_config(CONFIGS["llama"], seq_len=129)
    (tmp_path / "not.json").write_text(json.dumps({"hidden_size": 4}))
    with pytest.raises(UserError, match="not a Hugging Face model config"):
        hfmodels.read_config(str(tmp_path / "not.json"))
    with pytest.raises(UserError, match="the folder holds no config.json"):
        hfmodels.read_config(str(tmp_path))
    with pytest.raises(UserError, match="never the Hugging Face hub or its cache"):
        hfmodels.read_config("nobody/no-such-model-here")
    with pytest.raises(UserError, match="expected KEY=VALUE"):
        hfmodels.with_settings({}, ("layers",))
    assert hfmodels.with_settings({"a": 1}, ("a=4", "b=true", "c=silu")) == {"a": 4, "b": True, "c": "silu"}


def test_profile_refuses_what_it_cannot_train_here_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    for args, fragment in [(["--hf-config", "mine", "--arch", "llama3-8b"], "give one model"),
                           (["--hf-config", "mine", "--tp", "2"], "--tp applies to --arch"),
                           (["--hf-set", "num_hidden_layers=1", "--arch", "llama3-8b"], "--hf-set applies to --hf-config"),
                           (["--hf-config", "mine", "--hf-set", "model_type=llama4"], "'llama4' is not one")]:
        result = run("profile", *args)
        assert result.exit_code != 0 and fragment in result.output, result.output
    with monkeypatch.context() as patch:
        patch.setattr("planner.commands.profile_hf.available_bytes", lambda: 1_000_000)
        result = run("profile", "--hf-config", "mine")
    assert result.exit_code == 1 and "training them here needs about" in result.output and "--hf-set" in result.output
    assert not (tmp_path / "profiles").exists()
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "hf_mine.py").write_text("# the user's own file\n")
    result = run("profile", "--hf-config", "mine/config.json")
    assert result.exit_code == 1 and "profiles/hf_mine.py exists and was not written by ckplan" in result.output
    assert (tmp_path / "profiles" / "hf_mine.py").read_text() == "# the user's own file\n"


def test_an_hf_set_key_no_code_reads_is_refused_not_kept_and_ignored(tmp_path, monkeypatch):
    # not close to a key Qwen3Config takes, and no code that builds the model reads it: transformers would keep it
    # as an attribute and build the model without it (on main it passed, and the profile ran without it)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text(json.dumps(CONFIGS["qwen3"]))
    result = run("profile", "--hf-config", "mine", "--hf-set", "pretraining_tp=2", "--fake")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and said.count("Error:") == 1 and "Traceback" not in said, said
    assert said == ("Error: --hf-set pretraining_tp: neither the config nor transformers' Qwen3Config has "
                    "pretraining_tp, and no code that builds the model reads it (transformers.models.qwen3.modeling_qwen3"
                    ", transformers' modeling and config utilities), so it would be kept and ignored; drop it")
    assert not (tmp_path / "profiles").exists()
    # a key LlamaConfig takes, and one GPT-2's config class does not take but shared code reads with getattr, pass
    assert hfmodels.with_settings(CONFIGS["llama"], ("mlp_bias=true",))["mlp_bias"] is True
    assert hfmodels.with_settings(CONFIGS["gpt2"], ("head_dim=16",))["head_dim"] == 16


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_hf_config_goes_through_profile_solve_and_launch_reference_without_a_model_file(family, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / f"tiny-{family}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**CONFIGS[family], "num_hidden_layers": 3, "n_layer": 3}))
    result = run_ok("profile", "--hf-config", str(folder), "--hf-set", "initializer_range=0.05", "--seq-len", "16",
                    "--micro-batch-size", "2", "--repeats", "1", "--warmup", "0", "--threads", "1")
    assert f"wrote profiles/hf_tiny_{family}.py" in result.output
    profile = io.load_profile(tmp_path / "profiles" / f"hf_tiny_{family}-cpu-mbs2.json")
    assert [layer.name for layer in profile.layers] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    assert bool(profile.tied) == TIED[family]
    assert hfmodels.is_generated(tmp_path / profile.model.file)
    run_ok("solve", "--profile", f"profiles/hf_tiny_{family}-cpu-mbs2.json", "--stages", "2", "--mem", "1GB",
           "--microbatches", "2", "--out", "plan.yaml")
    result = run_ok("launch", "plan.yaml", "--steps", "2", "--warmup-steps", "0", "--reference")
    assert "the pipeline trains like one process" in result.output


def test_a_measured_hf_config_profile_records_its_sequence_length(tmp_path, monkeypatch):
    """ckplan's model file feeds --seq-len tokens, but the measured profile did not record them: solve said
    'the profile records no sequence length' and the exports 'set it as your example_batch() makes it', to a
    user who wrote no example_batch(). A --fake profile recorded it already."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["phi3"]))
    run_ok("profile", "--hf-config", "config.json", "--seq-len", "16", "--micro-batch-size", "2", "--repeats", "1",
           "--warmup", "0", "--threads", "1", "--out", "p.json")
    assert io.load_profile(tmp_path / "p.json").assumptions["seq_len"] == 16
    said = " ".join(run_ok("solve", "--profile", "p.json", "--stages", "2", "--mem", "1GB", "--microbatches", "2",
                           "--out", "plan.yaml").output.split())
    assert "the profile records no sequence length, or no GPU whose peak MFU is taken against" in said
    run_ok("export", "plan.yaml", "--to", "torchtitan", "--torchtitan-version", "0.2.2", "--out", "titan.toml")
    text = (tmp_path / "titan.toml").read_text()
    assert "seq_len = 16" in text and "example_batch()" not in text


def test_a_second_profile_of_one_config_under_other_settings_keeps_the_first_model_file(tmp_path, monkeypatch):
    """Profiling one config again with another --hf-set (or --seq-len) rewrote hf_<config>.py, which the first
    profile and its plans run: `launch` then refused the first plan as stale. Each settings' file is kept."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["llama"]))
    common = ("--seq-len", "16", "--micro-batch-size", "2", "--repeats", "1", "--warmup", "0", "--threads", "1")
    run_ok("profile", "--hf-config", "config.json", *common, "--out", "a.json")
    first = io.load_profile(tmp_path / "a.json").model
    run_ok("profile", "--hf-config", "config.json", "--hf-set", "num_hidden_layers=3", *common, "--out", "b.json")
    second = io.load_profile(tmp_path / "b.json").model
    assert second.file != first.file and second.sha256 != first.sha256
    run_ok("solve", "--profile", "a.json", "--stages", "2", "--mem", "1GB", "--microbatches", "2", "--out", "plan.yaml")
    run_ok("validate", "plan.yaml")  # runs the first model file: not stale
    run_ok("profile", "--hf-config", "config.json", *common, "--out", "c.json")  # the first settings: its own file
    assert io.load_profile(tmp_path / "c.json").model == first
