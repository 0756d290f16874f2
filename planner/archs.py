"""Published LLM architectures, as data, each with its source (GPU specs: planner/gpus.py,
re-exported here).

An `Arch` holds what the analytic profiler needs from a Hugging Face-style
config.json; `from_hf_config` reads one and refuses missing or nonsensical fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal

from planner.errors import UserError
from planner.gpus import (  # noqa: F401  the GPU data, re-exported where callers have always found it
    CONTEXT_SOURCE,
    CUDA_CONTEXT_BYTES,
    GPU,
    GPU_ALIASES,
    GPUS,
    HOST_ADAM_NS_PER_PARAM,
    HOST_ADAM_SOURCE,
    gpu,
)

Style = Literal["llama", "gpt"]


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer, as its config.json describes it.

    style "llama": RMSNorm, SwiGLU MLP (3 matrices of width intermediate_size),
    grouped-query attention, rotary positions, no dropout, no biases but optional
    Q/K/V biases (Qwen2). style "gpt": LayerNorm, GELU MLP (2 matrices), biases
    everywhere, learned position embeddings, dropout — Korthikanti et al.'s model.
    """

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    style: Style = "llama"
    qkv_bias: bool = False  # Qwen2's attention has biases on q, k and v projections
    head_dim: int | None = None  # None: hidden_size // num_heads
    source: str = ""
    # style "gpt": the MLP's activation. GELU keeps its input and its output (Korthikanti's two
    # 8sbh); ReLU (OPT) keeps only its output, which is also the second matrix's input
    mlp_act: Literal["gelu", "relu"] = "gelu"
    # attention to the last `sliding_window` tokens only (Mistral 7B v0.1): fewer attention
    # FLOPs past it; flash keeps the same bytes, and eager attention still builds all s² scores
    sliding_window: int | None = None
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k before rotary (q_norm, k_norm)
    # Mixture of experts (num_experts 0: every MLP dense). A MoE layer's MLP is a router (a
    # hidden x experts linear, top-k of its probabilities), `num_experts` routed SwiGLU experts of
    # width moe_intermediate_size of which each token reaches `num_experts_per_tok`, and
    # `num_shared_experts` SwiGLU experts of width shared_intermediate_size every token reaches
    # (run as one SwiGLU of their summed width, as Hugging Face and Megatron-LM build them)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: sigmoid(hidden -> 1 linear) scales the shared output
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is dense (intermediate_size) in a MoE model
    # DeepSeek-V3's multi-token-prediction modules: recorded, not planned (see from_hf_config)
    num_mtp_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank 0: none). K and V are projected up
    # from a kv_lora_rank latent; Q from a q_lora_rank latent (0: from the hidden state, V2-Lite).
    # Each head's q and k are qk_nope_head_dim wide plus qk_rope_head_dim rotary dimensions (the
    # k rotary part one per token, shared by the heads); v is v_head_dim wide.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` has the mixture of experts as its MLP."""
        return self.num_experts > 0 and index not in self.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def canonical_json(self) -> str:
        """The dimensions that matter, as sorted JSON: what an analytic profile is pinned to."""
        data = {key: value for key, value in asdict(self).items() if key not in ("name", "source")}
        for key, default in _LATER_FIELDS.items():  # fields added later pin nothing at their default
            if data[key] == default:
                del data[key]
        return json.dumps(data, sort_keys=True)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


_LATER_FIELDS = {"mlp_act": "gelu", "sliding_window": None, "qk_norm": False, "num_experts": 0,
                 "num_experts_per_tok": 0, "moe_intermediate_size": 0, "num_shared_experts": 0,
                 "shared_intermediate_size": 0, "shared_expert_gate": False, "dense_layers": (),
                 "num_mtp_layers": 0, "kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0,
                 "qk_nope_head_dim": 0, "v_head_dim": 0}


def _llama(name, hidden, inter, layers, heads, kv, vocab, max_pos, source, *, tied=False, qkv_bias=False,
           sliding_window=None, **moe_or_mla) -> Arch:
    return Arch(name=name, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
                num_kv_heads=kv, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=max_pos,
                qkv_bias=qkv_bias, source=source, sliding_window=sliding_window, **moe_or_mla)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    # config.json of meta-llama/Llama-2-{7b,13b,70b}-hf; Touvron et al. 2023, "Llama 2", Table 1
    _llama("llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, "meta-llama/Llama-2-7b-hf config.json"),
    _llama("llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, "meta-llama/Llama-2-13b-hf config.json"),
    _llama("llama2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, "meta-llama/Llama-2-70b-hf config.json"),
    # config.json of meta-llama/Meta-Llama-3-{8B,70B}; Grattafiori et al. 2024, "The Llama 3 Herd", Table 3
    _llama("llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, "meta-llama/Meta-Llama-3-8B config.json"),
    _llama("llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, "meta-llama/Meta-Llama-3-70B config.json"),
    _llama("llama3.1-405b", 16384, 53248, 126, 128, 8, 128256, 131072,
           "meta-llama/Llama-3.1-405B config.json; Llama 3 Herd paper, Table 3"),
    # config.json of mistralai/Mistral-7B-v0.1; Jiang et al. 2023, "Mistral 7B", Table 1
    _llama("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, "mistralai/Mistral-7B-v0.1 config.json",
           sliding_window=4096),
    # config.json of Qwen/Qwen2.5-{7B,72B}; Qwen2.5 technical report 2024, Table 1 (q/k/v biases)
    _llama("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 131072, "Qwen/Qwen2.5-7B config.json", qkv_bias=True),
    _llama("qwen2.5-72b", 8192, 29568, 80, 64, 8, 152064, 131072, "Qwen/Qwen2.5-72B config.json", qkv_bias=True),
    # Mixture of experts. config.json of mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1: each
    # layer's MLP is 8 SwiGLU experts of width intermediate_size, top 2 (Jiang et al. 2024,
    # "Mixtral of Experts", Table 1; 46.7B total / 12.9B active, and mistral.ai's Mixtral 8x22B
    # announcement, 141B / 39B)
    _llama("mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768,
           "mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024, Mixtral of Experts, Table 1",
           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336),
    _llama("mixtral-8x22b", 6144, 16384, 56, 48, 8, 32000, 65536,
           "mistralai/Mixtral-8x22B-v0.1 config.json; mistral.ai, Cheaper, Better, Faster, Stronger (2024)",
           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16384),
    # config.json of deepseek-ai/DeepSeek-V2-Lite: MLA without q compression (q_lora_rank null),
    # layer 0 dense (first_k_dense_replace 1), then 64 routed experts top 6 and 2 shared, width
    # 1408; DeepSeek-AI 2024, "DeepSeek-V2", Appendix B: 15.7B total, 2.4B activated
    _llama("deepseek-v2-lite", 2048, 10944, 27, 16, 16, 102400, 163840,
           "deepseek-ai/DeepSeek-V2-Lite config.json; DeepSeek-V2 paper (arXiv 2405.04434), Appendix B",
           num_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408, num_shared_experts=2,
           shared_intermediate_size=1408, dense_layers=(0,), kv_lora_rank=512, qk_rope_head_dim=64,
           qk_nope_head_dim=128, v_head_dim=128),
    # config.json of deepseek-ai/DeepSeek-V3: layers 0-2 dense (first_k_dense_replace 3), then 256
    # routed experts top 8 and 1 shared, width 2048; MLA with q_lora_rank 1536. DeepSeek-AI 2024,
    # "DeepSeek-V3 Technical Report" §2: 671B total, 37B activated. Its one multi-token-prediction
    # module (num_nextn_predict_layers 1; 14B more in the checkpoint's 685B) is not part of the 671B
    # and not planned here: the 61 layers of the main model are.
    _llama("deepseek-v3", 7168, 18432, 61, 128, 128, 129280, 163840,
           "deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 Technical Report (arXiv 2412.19437) §2, "
           "main model without its MTP module",
           num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, num_shared_experts=1,
           shared_intermediate_size=2048, dense_layers=(0, 1, 2), kv_lora_rank=512, q_lora_rank=1536,
           qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
    # config.json of Qwen/Qwen3-30B-A3B: 128 experts top 8 of width 768 in every layer
    # (decoder_sparse_step 1, mlp_only_layers []), head_dim 128, q/k norms; its model card: 30.5B
    # total, 3.3B activated
    Arch(name="qwen3-30b-a3b", hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
         num_kv_heads=4, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
         head_dim=128, qk_norm=True, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
         source="Qwen/Qwen3-30B-A3B config.json and model card; Qwen3 Technical Report (arXiv 2505.09388)"),
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (d_model 12288, 96 layers,
    # 96 heads, context 2048), GPT-2's BPE vocabulary of 50257, tied embeddings, 4h MLP with GELU
    Arch(name="gpt3-175b", hidden_size=12288, intermediate_size=4 * 12288, num_layers=96, num_heads=96,
         num_kv_heads=96, vocab_size=50257, tie_word_embeddings=True, max_position_embeddings=2048,
         style="gpt", source="Brown et al. 2020, Table 2.1"),
)}


def arch(name: str) -> Arch:
    if name.lower() not in ARCHS:
        raise UserError(f"unknown --arch {name!r}; choose one of {', '.join(ARCHS)}, or pass --arch-config config.json")
    return ARCHS[name.lower()]


# ---------------------------------------------------------------- config.json

_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# families whose MLP is gated (gate and up projections, then down): SiLU-gated (SwiGLU) or, in
# Gemma, GELU-gated (GeGLU), which keeps the same four f-wide tensors
GATED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# gated-MLP families with a mixture of experts (and DeepSeek's latent attention)
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
_GATED_ACTS = ("silu", "swish")
GPT_TYPES = ("gpt2", "opt")  # LayerNorm, a two-matrix MLP, biases, learned positions, dropout
_QWEN_MOE = ("qwen2_moe", "qwen3_moe")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")


def from_hf_config(config: object, *, where: str, name: str) -> Arch:
    """An Arch from a Hugging Face-style config.json (already parsed): gated-MLP decoders
    (LLaMA, Mistral, Qwen2, Qwen3, Gemma, or any config with a SiLU MLP), their mixture-of-experts
    kin (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 with latent attention) and GPT-style ones
    (GPT-2, OPT). `where` names the file in error messages."""
    if not isinstance(config, dict):
        raise UserError(f"{where} is not a JSON object of model settings; pass a Hugging Face config.json")
    model_type = config.get("model_type", "")
    _refuse_unmodelled(config, where, model_type)
    if model_type == "gpt2":
        return _gpt2(config, where, name)
    if model_type == "opt":
        return _opt(config, where, name)
    if model_type and model_type not in (*GATED_TYPES, *MOE_TYPES):
        raise UserError(f"{where}: model_type {model_type!r} is not read; --arch-config reads "
                        f"{', '.join((*GATED_TYPES, *MOE_TYPES, *GPT_TYPES))} configs (one without model_type "
                        "is read as LLaMA-style)")
    return _checked_heads(_gated(config, where, name, model_type), where)


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
    kv = _optional_int(config, "num_key_value_heads", where) or dims["num_attention_heads"]
    act = config.get("hidden_activation") or config.get("hidden_act", "silu")
    gelu_gated = model_type == "gemma" and isinstance(act, str) and act.startswith("gelu")
    if act not in _GATED_ACTS and not gelu_gated:
        raise UserError(f"{where}: hidden_act {act!r} with model_type {model_type or 'unset'!r} is not read; "
                        f"--arch-config reads gated-MLP decoders ({', '.join(GATED_TYPES)}, or hidden_act "
                        f"'silu') and GPT-style ones ({', '.join(GPT_TYPES)})")
    tied = _bool(config, "tie_word_embeddings", where, default=model_type == "gemma")
    # Qwen2-MoE names its q/k/v biases qkv_bias (on unless told, as in Qwen1.5-MoE's configs)
    qkv_bias = (_bool(config, "qkv_bias", where, default=True) if model_type == "qwen2_moe" else
                _bool(config, "attention_bias", where, default=model_type == "qwen2"))
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
                sliding_window=_sliding_window(config, where), qk_norm=model_type in ("qwen3", "qwen3_moe"),
                source=where, **_experts(config, where, model_type, dims), **mla)


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
    if model_type == "mixtral":  # every layer: experts of the dense width
        if config.get("router_jitter_noise"):
            raise UserError(f"{where}: router_jitter_noise = {config['router_jitter_noise']!r} multiplies the "
                            "router's input by noise it keeps for backward, which is not modelled: set it to 0")
        return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=dims["intermediate_size"])
    width = _need(config, "moe_intermediate_size", where)
    if model_type in _QWEN_MOE:
        step = _optional_int(config, "decoder_sparse_step", where) or 1
        only = _layer_list(config, "mlp_only_layers", where, layers)
        shared = (dict(num_shared_experts=1, shared_expert_gate=True,
                       shared_intermediate_size=_need(config, "shared_expert_intermediate_size", where))
                  if model_type == "qwen2_moe" else {})
        return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width,
                    dense_layers=tuple(i for i in range(layers) if i in only or (i + 1) % step), **shared)
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
_EXPERTS = {"mixtral": ("num_local_experts",), "qwen2_moe": ("num_experts",),
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
    "num_local_experts": ("mixtral", "qwen3_moe"), "num_experts": _QWEN_MOE, "n_routed_experts": _DEEPSEEK,
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
                            f"{', '.join(readers)}")


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
    GELU (gelu_new), tied embeddings unless told."""
    for key in ("n_embd", "n_layer", "n_head", "vocab_size"):
        if key not in config:
            raise UserError(f"{where} has no {key}; a GPT-2 config needs n_embd, n_layer, n_head, vocab_size")
    hidden = _positive_int(config, "n_embd", where)
    _activation(config, where, "gelu")
    arch = Arch(name=name, hidden_size=hidden, intermediate_size=_optional_int(config, "n_inner", where) or 4 * hidden,
                num_layers=_positive_int(config, "n_layer", where), num_heads=_positive_int(config, "n_head", where),
                num_kv_heads=_positive_int(config, "n_head", where), vocab_size=_positive_int(config, "vocab_size", where),
                tie_word_embeddings=_bool(config, "tie_word_embeddings", where, default=True),
                max_position_embeddings=_optional_int(config, "n_positions", where) or 1024, style="gpt",
                source=where)
    return _checked_heads(arch, where)


def _opt(config: dict, where: str, name: str) -> Arch:
    """OPT's config.json: ffn_dim is the MLP width, ReLU unless told, learned positions with
    two extra rows (OPTLearnedPositionalEmbedding's offset of 2), tied embeddings."""
    missing = [key for key in ("hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if key not in config]
    if missing:
        raise UserError(f"{where} has no {', '.join(missing)}; an OPT config needs hidden_size, ffn_dim, "
                        "num_hidden_layers, num_attention_heads, vocab_size")
    hidden = _positive_int(config, "hidden_size", where)
    projection = config.get("word_embed_proj_dim", hidden)
    if projection != hidden:
        raise UserError(f"{where}: word_embed_proj_dim {projection!r} differs from hidden_size {hidden}; the "
                        "embedding projections (OPT-350m) are not modelled")
    if not _bool(config, "enable_bias", where, default=True):
        raise UserError(f"{where}: enable_bias is false; GPT-style configs are read with biases")
    heads = _positive_int(config, "num_attention_heads", where)
    arch = Arch(name=name, hidden_size=hidden, intermediate_size=_positive_int(config, "ffn_dim", where),
                num_layers=_positive_int(config, "num_hidden_layers", where), num_heads=heads, num_kv_heads=heads,
                vocab_size=_positive_int(config, "vocab_size", where),
                tie_word_embeddings=_bool(config, "tie_word_embeddings", where, default=True),
                max_position_embeddings=(_optional_int(config, "max_position_embeddings", where) or 2048) + 2,
                style="gpt", mlp_act=_activation(config, where, "relu"), source=where)
    return _checked_heads(arch, where)


def _activation(config: dict, where: str, default: str) -> Literal["gelu", "relu"]:
    act = config.get("activation_function", default)
    if isinstance(act, str) and act.startswith("gelu"):
        return "gelu"
    if act == "relu":
        return "relu"
    raise UserError(f"{where}: activation_function {act!r} is not read; GPT-style configs use gelu or relu")


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
