"""A Hugging Face-style config.json read as an `Arch` (`ckplan profile --arch-config`): every
field that sets the model's size given or refused, every field that changes memory modelled or
refused, never filled with a default of transformers' (planner/models/archs.py holds `Arch`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from planner.errors import UserError
from planner.models.archs import MAX_LAYERS, Arch
from planner.models.families import BUILT_FAMILIES, GATED_TYPES, GPT_TYPES, MOE_TYPES
from planner.models.gemma3 import gemma3_fields, qwen_fields, smollm3_fields, text_config
from planner.models.gptoss import gpt_oss_fields

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_GATED_ACTS = ("silu", "swish")
_QWEN_MOE = ("qwen2_moe", "qwen3_moe")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_GEMMAS = ("gemma", "gemma3_text")  # head_dim their own, GELU-gated MLP, scaled and tied embedding


def from_hf_config(config: object, *, where: str, name: str) -> Arch:
    """An Arch from a Hugging Face-style config.json (already parsed): gated-MLP decoders
    (LLaMA, Mistral, Qwen2, Qwen3, Gemma, Gemma 3, SmolLM3, or any config with a SiLU MLP), their mixture-of-experts
    kin (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 with latent attention) and GPT-style ones
    (GPT-2, OPT). `where` names the file in error messages."""
    if not isinstance(config, dict):
        raise UserError(f"{where} is not a JSON object of model settings; pass a Hugging Face config.json")
    model_type = config.get("model_type", "")
    left_out = ""
    if model_type == "gemma3":  # multimodal: the text model (planner/models/gemma3.py)
        config, left_out = text_config(config, where)
        model_type = "gemma3_text"
    # the family first: a family not read is said so, not refused for the first of its fields another family
    # reads (Llama 4's num_local_experts was "read for mixtral, qwen3_moe, gpt_oss", as if renaming it would do)
    if model_type and model_type not in (*GATED_TYPES, *MOE_TYPES, *GPT_TYPES):
        raise UserError(f"{where}: model_type {model_type!r} is not read; --arch-config reads "
                        f"{', '.join((*GATED_TYPES, *MOE_TYPES, *GPT_TYPES))} configs (one without model_type "
                        f"is read as LLaMA-style; `search --hf-config` reads the same){_built_from_code(model_type)}")
    _refuse_unmodelled(config, where, model_type)
    if model_type == "gpt2":
        return _gpt2(config, where, name)
    if model_type == "opt":
        return _opt(config, where, name)
    if model_type == "starcoder2":
        return _starcoder2(config, where, name)
    arch = _gated(config, where, name, model_type)
    family = {"gpt_oss": gpt_oss_fields, "gemma3_text": gemma3_fields, "smollm3": smollm3_fields,
              **dict.fromkeys(("qwen2", "qwen3", "qwen2_moe", "qwen3_moe"), qwen_fields)}.get(model_type)
    arch = family(config, where, arch) if family else arch
    return _checked_heads(replace(arch, left_out=left_out) if left_out else arch, where)


def _built_from_code(model_type: str) -> str:
    """Where `profile --hf-config` builds the family (planner/models/hfmodels.py), the way to it."""
    if model_type not in BUILT_FAMILIES:
        return ""
    return ("; `ckplan profile --hf-config CONFIG --fake` runs transformers' own "
            f"{model_type} code at full size, and its profile goes to `solve` and to `search --profile`")


def _gated(config: dict, where: str, name: str, model_type: str) -> Arch:
    for key in ("attention_dropout", "hidden_dropout"):
        if config.get(key) not in (None, 0, 0.0):
            raise UserError(f"{where}: {key} = {config[key]!r}; dropout is not modelled for gated-MLP "
                            "decoders (it keeps a mask per dropped tensor): set it to 0")
    if config.get("mlp_bias"):
        raise UserError(f"{where}: mlp_bias is true; gated-MLP decoders are read without MLP biases")
    missing = [key for key in _REQUIRED if key not in config]
    if missing:
        raise UserError(f"{where} has no {', '.join(missing)}; a decoder config needs {', '.join(_REQUIRED)}")
    dims = {key: _positive_int(config, key, where) for key in _REQUIRED}
    _check_depth(dims["num_hidden_layers"], "num_hidden_layers", where)
    if model_type in _GEMMAS and config.get("head_dim") is None:  # Gemma's is not hidden / heads (its default 256)
        raise UserError(f"{where} has no head_dim; a {model_type} config needs it (Gemma's heads are not hidden_size / "
                        "num_attention_heads wide)")
    kv = _optional_int(config, "num_key_value_heads", where) or dims["num_attention_heads"]
    act = config.get("hidden_activation") or config.get("hidden_act", "silu")
    gelu_gated = model_type in _GEMMAS and isinstance(act, str) and act.startswith("gelu")
    if act not in _GATED_ACTS and not gelu_gated:
        raise UserError(f"{where}: hidden_act {act!r} with model_type {model_type or 'unset'!r} is not read; "
                        f"--arch-config reads gated-MLP decoders ({', '.join(GATED_TYPES)}, or hidden_act "
                        f"'silu') and GPT-style ones ({', '.join(GPT_TYPES)})")
    # tied unless told: GemmaConfig, Gemma3TextConfig and SmolLM3Config default tie_word_embeddings True
    tied = _bool(config, "tie_word_embeddings", where, default=model_type in (*_GEMMAS, "smollm3"))
    # Qwen2-MoE names its q/k/v biases qkv_bias (on unless told, as in Qwen1.5-MoE's configs)
    qkv_bias = (_bool(config, "qkv_bias", where, default=True) if model_type == "qwen2_moe" else
                _bool(config, "attention_bias", where, default=model_type in ("qwen2", "gpt_oss")))
    mla = _latent_attention(config, where) if model_type in _DEEPSEEK else {}
    if mla and qkv_bias:
        raise UserError(f"{where}: attention_bias is true; latent attention is read without biases on its "
                        "projections: set it to false")
    return Arch(name=name, hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
                num_layers=dims["num_hidden_layers"], num_heads=dims["num_attention_heads"],
                num_kv_heads=dims["num_attention_heads"] if mla else kv, vocab_size=dims["vocab_size"],
                tie_word_embeddings=tied, max_position_embeddings=_optional_int(config, "max_position_embeddings", where),
                qkv_bias=qkv_bias,
                # transformers writes DeepSeek's qk_rope_head_dim as head_dim; MLA's widths are its own
                head_dim=None if mla else _optional_int(config, "head_dim", where),
                sliding_window=_sliding_window(config, where), qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
                scaled_embedding=model_type in _GEMMAS, fp32_norm_scale=model_type in _GEMMAS,
                source=where, **_experts(config, where, model_type, dims), **mla,
                **_positions(config, where), norm_eps=_epsilon(config, where, "rms_norm_eps"))


def _experts(config: dict, where: str, model_type: str, dims: dict) -> dict:
    """The mixture of experts of a MoE config, as Arch fields (none for a dense type), with the
    layers each family keeps dense: DeepSeek the first first_k_dense_replace (and, in its own
    modelling code, those off every moe_layer_freq-th); Qwen those in mlp_only_layers or off every
    decoder_sparse_step-th (Hugging Face's Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer)."""
    if model_type not in MOE_TYPES:
        return {}
    layers = dims["num_hidden_layers"]
    experts = _expert_count(config, where, _EXPERTS[model_type])
    top_k = _need(config, "num_experts_per_tok", where)
    if top_k > experts:
        raise UserError(f"{where}: num_experts_per_tok {top_k} exceeds the {experts} experts; fix the config")
    if model_type in ("mixtral", "gpt_oss"):  # every layer: experts of the dense width
        if config.get("router_jitter_noise"):
            raise UserError(f"{where}: router_jitter_noise = {config['router_jitter_noise']!r} multiplies the "
                            "router's input by noise it keeps for backward, which is not modelled: set it to 0")
        return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=dims["intermediate_size"],
                    **(dict(routing_weight_bytes=4, renormalizes_top_k=True) if model_type == "mixtral" else {}))
    width = _need(config, "moe_intermediate_size", where)
    if model_type in _QWEN_MOE:
        step = _optional_int(config, "decoder_sparse_step", where) or 1
        only = _layer_list(config, "mlp_only_layers", where, layers)
        shared = (dict(num_shared_experts=1, shared_expert_gate=True,
                       shared_intermediate_size=_need(config, "shared_expert_intermediate_size", where))
                  if model_type == "qwen2_moe" else {})
        routing = dict(routing_weight_bytes=2, renormalizes_top_k=_bool(config, "norm_topk_prob", where, default=False)) \
            if model_type == "qwen3_moe" else {}  # Qwen3MoeConfig's default: False
        return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                    dense_layers=tuple(i for i in range(layers) if i in only or (i + 1) % step), **shared, **routing)
    first = _count(config, "first_k_dense_replace", where)
    every = _optional_int(config, "moe_layer_freq", where) or 1
    shared = _count(config, "n_shared_experts", where)
    # DeepSeek-V3's multi-token-prediction modules (num_nextn_predict_layers) are a training
    # objective beside the model: Hugging Face's DeepseekV3ForCausalLM does not build them (it
    # drops their weights on load) and the published 671B leaves them out. Recorded, not planned;
    # the profile says so.
    return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                num_shared_experts=shared, shared_intermediate_size=width if shared else 0,
                dense_layers=tuple(i for i in range(layers) if i < first or i % every),
                num_mtp_layers=_count(config, "num_nextn_predict_layers", where))


# the routed-expert count's name in each family's config.json; Qwen3-MoE's published configs say
# num_experts, transformers 5 writes num_local_experts (its attribute map)
_EXPERTS = {"mixtral": ("num_local_experts",), "gpt_oss": ("num_local_experts",), "qwen2_moe": ("num_experts",),
            "qwen3_moe": ("num_experts", "num_local_experts"), "deepseek_v2": ("n_routed_experts",),
            "deepseek_v3": ("n_routed_experts",)}


def _expert_count(config: dict, where: str, names: tuple[str, ...]) -> int:
    given = {name: _positive_int(config, name, where) for name in names if config.get(name) is not None}
    if not given:
        raise UserError(f"{where} has no {' or '.join(names)}; a {config['model_type']} config needs its expert count")
    if len(set(given.values())) > 1:
        raise UserError(f"{where}: {' and '.join(f'{k} = {v}' for k, v in given.items())} disagree; give one")
    return next(iter(given.values()))


def _latent_attention(config: dict, where: str) -> dict:
    """DeepSeek's multi-head latent attention; q_lora_rank null: queries straight from the hidden
    state (DeepSeek-V2-Lite)."""
    fields = {key: _need(config, key, where) for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                                         "v_head_dim")}
    return dict(**fields, q_lora_rank=_optional_int(config, "q_lora_rank", where) or 0)


# Mixture-of-experts and latent-attention fields, and the model_types whose readers read them. In
# any other config such a field is refused: read as absent it would plan a MoE model as dense
# (read as a dense LLaMA, a Mixtral-8x7B config gave 7.2B parameters instead of 46.7B, issue 19).
# Read and charged nothing, as they change no memory or FLOPs the profile counts beside what it
# charges: DeepSeek's group-limited routing (n_group, topk_group, topk_method) picks which
# experts a token reaches, not how many (its group scores are tokens x groups, small beside the
# tokens x experts probabilities charged); scoring_func softmax or sigmoid keeps one fp32
# probability per expert either way; routed_scaling_factor and norm_topk_prob rescale the
# tokens x top-k routing weights. The load-balancing loss (router_aux_loss_coef, aux_loss_alpha,
# seq_aux) is computed from the kept probabilities.
_MOE_FIELDS = {
    "num_local_experts": ("mixtral", "qwen3_moe", "gpt_oss"), "num_experts": _QWEN_MOE, "n_routed_experts": _DEEPSEEK,
    "num_experts_per_tok": MOE_TYPES, "moe_intermediate_size": (*_QWEN_MOE, *_DEEPSEEK),
    "shared_expert_intermediate_size": ("qwen2_moe",), "n_shared_experts": _DEEPSEEK,
    "decoder_sparse_step": _QWEN_MOE, "mlp_only_layers": _QWEN_MOE, "first_k_dense_replace": _DEEPSEEK,
    "moe_layer_freq": _DEEPSEEK, "router_jitter_noise": ("mixtral",), "num_nextn_predict_layers": _DEEPSEEK,
    "n_group": _DEEPSEEK, "topk_group": _DEEPSEEK, "topk_method": _DEEPSEEK, "scoring_func": _DEEPSEEK,
    "routed_scaling_factor": _DEEPSEEK, "norm_topk_prob": (*_QWEN_MOE, *_DEEPSEEK),
    "kv_lora_rank": _DEEPSEEK, "q_lora_rank": _DEEPSEEK, "qk_rope_head_dim": _DEEPSEEK,
    "qk_nope_head_dim": _DEEPSEEK, "v_head_dim": _DEEPSEEK,
}
_SOFTCAPPING = ("attn_logit_softcapping", "final_logit_softcapping")


def _refuse_unmodelled(config: dict, where: str, model_type: str) -> None:
    """One sentence naming the first field of a kind ckplan would otherwise read as absent."""
    for key in _SOFTCAPPING:
        if config.get(key) not in (None, 0, False):
            raise UserError(f"{where}: logit soft-capping is not modelled (it keeps more of the logits for backward; "
                            f"field {key} = {config[key]!r}); ckplan would predict too little memory")
    for key, readers in _MOE_FIELDS.items():
        value = config.get(key)
        if value not in (None, 0, False, []) and model_type not in readers:
            raise UserError(f"{where}: {key} = {value!r} is a mixture-of-experts or latent-attention setting that "
                            f"is not read for model_type {model_type or 'unset'!r}, and read as absent it would plan "
                            f"the model as dense with far too little memory; --arch-config reads it for model_type "
                            f"{', '.join(readers)}{_built_from_code(model_type)}")


def _need(config: dict, key: str, where: str) -> int:
    if config.get(key) is None:
        raise UserError(f"{where} has no {key}; a {config.get('model_type') or 'mixture-of-experts'} config needs it")
    return _positive_int(config, key, where)


def _count(config: dict, key: str, where: str) -> int:
    """A count that may be 0 or absent (0)."""
    value = config.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserError(f"{where}: {key} must be a whole number of 0 or more, got {value!r}")
    return value


def _layer_list(config: dict, key: str, where: str, num_layers: int) -> list[int]:
    value = config.get(key) or []
    if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_layers
                                          for i in value):
        raise UserError(f"{where}: {key} must be a list of layer indices from 0 to {num_layers - 1}, got {value!r}")
    return value


def _gpt2(config: dict, where: str, name: str) -> Arch:
    """GPT-2's config.json: n_embd, n_layer, n_head, n_inner (None: 4·n_embd), n_positions;
    GELU (gelu_new), tied embeddings unless told. num_key_value_heads (not GPT-2's own: a GPT
    block with grouped-query attention, as Megatron-LM builds it under --group-query-attention
    without --swiglu) splits the heads into that many K/V groups (absent: one per query head)."""
    for key in ("n_embd", "n_layer", "n_head", "vocab_size", "n_positions"):
        if key not in config:
            raise UserError(f"{where} has no {key}; a GPT-2 config needs n_embd, n_layer, n_head, vocab_size, "
                            "n_positions (the learned position embedding's rows)")
    hidden = _positive_int(config, "n_embd", where)
    act = _activation(config, where, "gelu_new")  # GPT2Config's default
    heads = _positive_int(config, "n_head", where)
    arch = Arch(name=name, hidden_size=hidden, intermediate_size=_optional_int(config, "n_inner", where) or 4 * hidden,
                num_layers=_check_depth(_positive_int(config, "n_layer", where), "n_layer", where),
                num_heads=heads, num_kv_heads=_optional_int(config, "num_key_value_heads", where) or heads,
                vocab_size=_positive_int(config, "vocab_size", where),
                tie_word_embeddings=_bool(config, "tie_word_embeddings", where, default=True),
                max_position_embeddings=_positive_int(config, "n_positions", where), style="gpt", mlp_act=act,
                norm_eps=_epsilon(config, where, "layer_norm_epsilon", default=1e-5), source=where,
                # GPT2Config's defaults: 0.1 each (transformers' configuration_gpt2.py)
                residual_dropout=_drops(config, "resid_pdrop", where, 0.1),
                embedding_dropout=_drops(config, "embd_pdrop", where, 0.1),
                attention_dropout=_drops(config, "attn_pdrop", where, 0.1))
    return _checked_heads(arch, where)


def _starcoder2(config: dict, where: str, name: str) -> Arch:
    """StarCoder2's config.json (transformers' Starcoder2Config): a GPT-style block (LayerNorm of
    norm_epsilon, a two-matrix GELU MLP, biases where use_bias, the default) with grouped-query
    attention and rotary positions (no position table), its dropouts residual_dropout (after the
    attention's and the MLP's output projections), embedding_dropout and attention_dropout, each 0
    unless told (modeling_starcoder2.py)."""
    missing = [key for key in _REQUIRED if key not in config]
    if missing:
        raise UserError(f"{where} has no {', '.join(missing)}; a starcoder2 config needs {', '.join(_REQUIRED)}")
    if not _bool(config, "use_bias", where, default=True):
        raise UserError(f"{where}: use_bias is false; GPT-style configs are read with biases")
    act = _activation(config, where, "gelu_pytorch_tanh", "hidden_act")
    dims = {key: _positive_int(config, key, where) for key in _REQUIRED}
    arch = Arch(name=name, hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
                num_layers=_check_depth(dims["num_hidden_layers"], "num_hidden_layers", where),
                num_heads=dims["num_attention_heads"],
                num_kv_heads=_optional_int(config, "num_key_value_heads", where) or dims["num_attention_heads"],
                vocab_size=dims["vocab_size"], tie_word_embeddings=_bool(config, "tie_word_embeddings", where,
                                                                         default=True),
                max_position_embeddings=None, style="gpt", mlp_act=act, separate_qkv=True,
                sliding_window=_sliding_window(config, where), **_positions(config, where),
                norm_eps=_epsilon(config, where, "norm_epsilon", default=1e-5), source=where,
                residual_dropout=_drops(config, "residual_dropout", where, 0.0),
                embedding_dropout=_drops(config, "embedding_dropout", where, 0.0),
                attention_dropout=_drops(config, "attention_dropout", where, 0.0))
    return _checked_heads(arch, where)


def _drops(config: dict, key: str, where: str, default: float) -> bool:
    """Whether a dropout probability (`default` where the config names none) drops anything."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UserError(f"{where}: {key} must be a probability from 0 up to 1, got {value!r}")
    return value > 0


def _opt(config: dict, where: str, name: str) -> Arch:
    """OPT's config.json: ffn_dim is the MLP width, ReLU unless told, learned positions with
    two extra rows (OPTLearnedPositionalEmbedding's offset of 2), tied embeddings;
    num_key_value_heads as for GPT-2."""
    needed = ("hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads", "vocab_size",
              "max_position_embeddings")
    missing = [key for key in needed if key not in config]
    if missing:
        raise UserError(f"{where} has no {', '.join(missing)}; an OPT config needs {', '.join(needed)}")
    hidden = _positive_int(config, "hidden_size", where)
    projection = config.get("word_embed_proj_dim", hidden)
    if projection != hidden:
        raise UserError(f"{where}: word_embed_proj_dim {projection!r} differs from hidden_size {hidden}; the "
                        "embedding projections (OPT-350m) are not modelled")
    for key in ("activation_dropout", "layerdrop"):  # OPTConfig's defaults: 0.0 both
        if _drops(config, key, where, 0.0):
            raise UserError(f"{where}: {key} = {config[key]!r} is not modelled (a dropout inside the MLP keeps "
                            "another mask; layer drop skips layers at random): set it to 0")
    if not _bool(config, "enable_bias", where, default=True):
        raise UserError(f"{where}: enable_bias is false; GPT-style configs are read with biases")
    heads = _positive_int(config, "num_attention_heads", where)
    arch = Arch(name=name, hidden_size=hidden, intermediate_size=_positive_int(config, "ffn_dim", where),
                num_layers=_check_depth(_positive_int(config, "num_hidden_layers", where), "num_hidden_layers", where),
                num_heads=heads, num_kv_heads=_optional_int(config, "num_key_value_heads", where) or heads, vocab_size=_positive_int(config, "vocab_size", where),
                tie_word_embeddings=_bool(config, "tie_word_embeddings", where, default=True),
                max_position_embeddings=_positive_int(config, "max_position_embeddings", where) + 2,
                # OPT's LayerNorms take torch's default epsilon (modeling_opt.py names none)
                style="gpt", mlp_act=_activation(config, where, "relu"), norm_eps=1e-5, source=where, separate_qkv=True,
                # OPTConfig's defaults: dropout 0.1 (after the embedding and both output projections),
                # attention_dropout 0.0 (transformers' configuration_opt.py)
                residual_dropout=_drops(config, "dropout", where, 0.1),
                embedding_dropout=_drops(config, "dropout", where, 0.1),
                attention_dropout=_drops(config, "attention_dropout", where, 0.0))
    return _checked_heads(arch, where)


# transformers' ACT2FN (activations.py, 5.24) -> Arch.mlp_act: GELU as one torch kernel (GELUActivation,
# GELUTanh), or written out as eager ops, each keeping its own ops' saved tensors (NewGELUActivation,
# and AccurateGELUActivation, which runs the same ops; FastGELUActivation; the python erf form)
_ACTIVATIONS = {"gelu": "gelu_kernel", "gelu_pytorch_tanh": "gelu_kernel", "relu": "relu", "gelu_new": "gelu_new",
                "gelu_accurate": "gelu_new", "gelu_fast": "gelu_fast", "gelu_python": "gelu_python"}


def _activation(config: dict, where: str, default: str, key: str = "activation_function"
                ) -> Literal["relu", "gelu_kernel", "gelu_new", "gelu_fast", "gelu_python"]:
    act = config.get(key, default)
    if isinstance(act, str) and act in _ACTIVATIONS:
        return _ACTIVATIONS[act]
    raise UserError(f"{where}: {key} {act!r} is not read; GPT-style configs use relu or GELU "
                    f"({', '.join(name for name in _ACTIVATIONS if name != 'relu')})")


def _check_depth(layers: int, key: str, where: str) -> int:
    if layers > MAX_LAYERS:
        raise UserError(f"{where}: {key} = {layers} is past the {MAX_LAYERS} decoder layers ckplan plans (the deepest "
                        "published LLM has 126); fix the config")
    return layers


def _positions(config: dict, where: str) -> dict:
    """rope_theta and rope_scaling, from config.json (transformers 4) or its rope_parameters
    (transformers 5); rope_theta None where the config names none."""
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0
                              or theta == float("inf")):
        raise UserError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    scaling = config.get("rope_scaling") or (params if params.get("rope_type", "default") != "default" else None)
    return dict(rope_theta=None if theta is None else float(theta), rope_scaling=_rope_scaling(scaling, where))


def _rope_scaling(scaling: object, where: str) -> tuple[str, float, int | None] | None:
    if scaling is None:
        return None
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if kind == "default":
        return None
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if (kind not in ("llama3", "yarn", "linear", "dynamic") or isinstance(factor, bool)
            or not isinstance(factor, (int, float)) or not factor > 0):
        raise UserError(f"{where}: rope_scaling {scaling!r} is not read; ckplan reads llama3, yarn, linear or "
                        "dynamic scaling with a positive factor")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original <= 0):
        raise UserError(f"{where}: rope_scaling's original_max_position_embeddings must be a positive integer, "
                        f"got {original!r}")
    return kind, float(factor), original


def _epsilon(config: dict, where: str, key: str, *, default: float | None = None) -> float | None:
    value = config.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1):
        raise UserError(f"{where}: {key} must be a number between 0 and 1, got {value!r}")
    return None if value is None else float(value)


def _sliding_window(config: dict, where: str) -> int | None:
    """The attention window, where the model uses one (Qwen2 configs carry a window they do
    not use: use_sliding_window false)."""
    if config.get("sliding_window") is None or config.get("use_sliding_window") is False:
        return None
    return _positive_int(config, "sliding_window", where)


def _checked_heads(arch: Arch, where: str) -> Arch:
    if arch.head_dim is None and not arch.mla and arch.hidden_size % arch.num_heads:
        raise UserError(f"{where}: hidden_size {arch.hidden_size} is not a multiple of num_attention_heads "
                        f"{arch.num_heads}; fix the config or give head_dim")
    if arch.num_heads % arch.num_kv_heads:
        raise UserError(f"{where}: num_attention_heads {arch.num_heads} is not a multiple of "
                        f"num_key_value_heads {arch.num_kv_heads}")
    return arch


def _positive_int(config: dict, key: str, where: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UserError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _optional_int(config: dict, key: str, where: str) -> int | None:
    return None if config.get(key) is None else _positive_int(config, key, where)


def _bool(config: dict, key: str, where: str, *, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{where}: {key} must be true or false, got {value!r}")
    return value
