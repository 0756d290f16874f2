"""Published LLM architectures, as data, each with its source (GPU specs: planner/models/gpus.py,
re-exported here).

An `Arch` holds what the analytic profiler needs from a Hugging Face-style
config.json; `archconfig.from_hf_config` (planner/models/archconfig.py) reads one and refuses missing or nonsensical fields.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Literal

from planner.errors import UserError
from planner.models.gpus import (  # noqa: F401  the GPU data, re-exported where callers have always found it
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
    # a GPT block's Q, K and V as three Linears (transformers' OPT and StarCoder2: q_proj, k_proj, v_proj),
    # not GPT-2's one fused c_attn (or Megatron-LM's linear_qkv): three parameter groups of torch's split
    separate_qkv: bool = False
    head_dim: int | None = None  # None: hidden_size // num_heads
    source: str = ""
    # style "gpt": the MLP's activation (what each keeps and moves: planner/profiler/activations.py).
    # "gelu" is Megatron-LM's GELU as Korthikanti et al. count it, its input and its output kept (two
    # 8sbh); "gelu_kernel" one torch kernel (F.gelu, exact or tanh-approximated: transformers' gelu and
    # gelu_pytorch_tanh, StarCoder2's), the same bytes kept; ReLU (OPT) keeps only its output, which is
    # also the second matrix's input. "gelu_new", "gelu_fast", "gelu_python": transformers' GELUs
    # written out as eager ops (GPT-2's gelu_new: pow, tanh and six more), which keep their ops'
    # saved tensors too
    mlp_act: Literal["gelu", "relu", "gelu_kernel", "gelu_new", "gelu_fast", "gelu_python"] = "gelu"
    # attention to the last `sliding_window` tokens only (Mistral 7B v0.1): fewer attention
    # FLOPs past it; flash keeps the same bytes, and eager attention still builds all s² scores
    sliding_window: int | None = None
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k before rotary (q_norm, k_norm)
    # Gemma: the token embedding's output multiplied by √hidden_size (transformers' GemmaTextScaledWordEmbedding),
    # one more elementwise pass each way; no tensor kept
    scaled_embedding: bool = False
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
    # The router and experts as transformers 5.24 runs them, counted op by op by the analytic profile
    # (planner/profiler/analytic_moe.py): routing_weight_bytes, the top-k weights' element size as the
    # experts get them (4: Mixtral's router returns them in fp32, modeling_mixtral.py 104-111, so its experts
    # weight, reorder and sum in fp32; 2: Qwen3-MoE's casts them to the logits' dtype, modeling_qwen3_moe.py
    # 266; 0: the mixture not counted so); renormalizes_top_k: the top-k weights divided by their sum
    # (Mixtral always, Qwen3-MoE under norm_topk_prob)
    routing_weight_bytes: int = 0
    renormalizes_top_k: bool = False
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
    # Positions and norms: they change no memory or time (so they pin nothing, see canonical_json),
    # but a framework left at its own defaults would train another model, so exports carry them.
    # None: not known (the config does not say).
    rope_theta: float | None = None
    norm_eps: float | None = None  # rms_norm_eps (LLaMA style) or layer_norm_epsilon (GPT style)
    # (type, factor, original_max_position_embeddings): Llama 3.1's "llama3" or DeepSeek's "yarn"
    rope_scaling: tuple[str, float, int | None] | None = None
    # Dropout in training. None: the style's own (gpt: all three, as Korthikanti et al.'s model and
    # Megatron-LM's defaults; llama: none). A residual dropout (after the attention's and the MLP's
    # output projections, Korthikanti's two sbh masks) keeps a 1-byte mask per element of its output;
    # the embedding's dropout one over the embedding's output; the attention probabilities' dropout a
    # mask of the scores under eager attention only (flash and cuDNN drop inside the kernel). A
    # dropout of probability 0 keeps nothing (torch's dropout returns its input at p = 0).
    # Rotary positions (rotated Q and K, no parameters). None: the style's own (llama: rotary; gpt:
    # rotary where the model has no learned position table, as StarCoder2 and Megatron-LM's
    # --position-embedding-type rope); False: no positions at all (Megatron-LM's none).
    rotary: bool | None = None
    residual_dropout: bool | None = None
    embedding_dropout: bool | None = None
    attention_dropout: bool | None = None
    # GPT-OSS (planner/models/gptoss.py has the sources). layer_windows: each layer's own sliding window (None:
    # full attention), as the config's layer_types says (empty: every layer at `sliding_window`); a layer's
    # figures are read off `layer(i)`. attention_sinks: one learned logit per head (its `sinks`);
    # o_bias: the output projection's bias (attention_bias sets it beside qkv_bias); expert_bias: the
    # router's bias and each expert's two projections' biases; swiglu_limit: the experts' clamped SwiGLU.
    # sinks_in_kernel: the sinks applied inside the attention kernel (Megatron-core's --softmax-type learnable on
    # Transformer Engine's cuDNN fused attention: its softmax_offset), not by torchtitan's eager rescale of flash's
    # output: their parameters counted, no rescale's time or kept tensors (framework-facts §159)
    layer_windows: tuple[int | None, ...] = ()
    attention_sinks: bool = False
    sinks_in_kernel: bool = False
    o_bias: bool = False
    expert_bias: bool = False
    swiglu_limit: float | None = None
    # router_aux_loss: the router's auxiliary load-balancing loss runs in training (Megatron-core's aux_loss type with a
    # coefficient above 0: planner/models/configs/megatron_router.py; its passes timed in planner/profiler/te_moe.py)
    router_aux_loss: bool = False
    # router_dtype_bytes: the element size of the router's logits where Megatron-LM's --moe-router-dtype sets it (4:
    # fp32), and so of TE's router probabilities, intermediates and gradients and the permuted probabilities
    # (planner/models/configs/megatron_router.py; charged in planner/profiler/te_moe.py and
    # planner/cost/te_moe_kept.py); 0: the input's dtype (bf16)
    router_dtype_bytes: int = 0
    # Gemma 3 (planner/models/gemma3.py has the sources): post_norms, an RMSNorm on the attention's and on the
    # MLP's output before each residual add (post_attention_layernorm, post_feedforward_layernorm: four norms a
    # block). layer_rotary: each layer's rotary where the layers differ (SmolLM3's no_rope_layers: False on its
    # NoPE layers; empty: every layer as `rotary` says), read off `layer(i)` like layer_windows.
    post_norms: bool = False
    # Gemma's RMSNorm (GemmaRMSNorm, Gemma3RMSNorm): normalised and scaled by (1 + weight) in fp32, cast at the end;
    # what transformers' eager norm keeps (planner/profiler/hf_kept.py), not what a fused norm does
    fp32_norm_scale: bool = False
    layer_rotary: tuple[bool, ...] = ()
    # what the config describes that is not planned (a multimodal config's vision tower): said by the profile
    left_out: str = ""

    def __post_init__(self) -> None:
        for key in ("residual_dropout", "embedding_dropout", "attention_dropout"):
            if getattr(self, key) == (self.style == "gpt"):  # the style's own: pinned as unsaid
                object.__setattr__(self, key, None)
        if self.rotary is not None and self.rotary == (self.style == "llama" or not self.max_position_embeddings):
            object.__setattr__(self, "rotary", None)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def rotates(self) -> bool:
        if self.rotary is not None:
            return self.rotary
        return self.style == "llama" or not self.max_position_embeddings

    @property
    def drops_residual(self) -> bool:
        return self.style == "gpt" if self.residual_dropout is None else self.residual_dropout

    @property
    def drops_embedding(self) -> bool:
        return self.style == "gpt" if self.embedding_dropout is None else self.embedding_dropout

    @property
    def drops_attention(self) -> bool:
        return self.style == "gpt" if self.attention_dropout is None else self.attention_dropout

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def layer(self, index: int) -> Arch:
        """Decoder layer `index` as a model of its own kind: its own sliding window and rotary where the
        layers differ (GPT-OSS's and Gemma 3's sliding and full attention, SmolLM3's NoPE layers), else this
        model."""
        changes = {}
        if self.layer_windows:
            changes.update(sliding_window=self.layer_windows[index], layer_windows=())
        if self.layer_rotary:
            changes.update(rotary=self.layer_rotary[index], layer_rotary=())
        return replace(self, **changes) if changes else self

    def layer_variant(self, index: int) -> str | None:
        """What sets decoder layer `index` apart from the others of its kind where the layers differ (its window,
        its rotary): the profile's LayerProfile.variant, which the cost model groups by beside the kind so that a
        global layer is charged its own time, not its kind's mean. None where every layer is alike."""
        if len(set(self.layer_windows)) < 2 and len(set(self.layer_rotary)) < 2:
            return None
        own = self.layer(index)
        parts = [f"window {own.sliding_window}" if own.sliding_window else "full attention"]
        return ", ".join(parts if own.rotates else [*parts, "no rotary"])

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` has the mixture of experts as its MLP."""
        return self.num_experts > 0 and index not in self.dense_layers

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def canonical_json(self) -> str:
        """The dimensions that matter, as sorted JSON: what an analytic profile is pinned to."""
        data = {key: value for key, value in asdict(self).items() if key not in ("name", "source", *_UNPINNED)}
        for key, default in _LATER_FIELDS.items():  # fields added later pin nothing at their default
            if data[key] == default:
                del data[key]
        return json.dumps(data, sort_keys=True)

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def facts(self) -> dict:
        """The canonical dimensions and, where known, what positions and norms the model uses:
        what a profile records so an export can reproduce the model."""
        data = json.loads(self.canonical_json())
        if self.rope_theta is not None:
            data["rope_theta"] = self.rope_theta
        if self.norm_eps is not None:
            data["norm_eps"] = self.norm_eps
        if self.rope_scaling is not None:
            kind, factor, original = self.rope_scaling
            data["rope_scaling"] = {"type": kind, "factor": factor, "original_max_position_embeddings": original}
        return data


# Fields that define the model but change no memory or time: kept out of the canonical JSON a
# profile is pinned to (a built-in's pin is unchanged by learning them)
_UNPINNED = ("rope_theta", "norm_eps", "rope_scaling", "left_out", "fp32_norm_scale")
# The deepest model ckplan reads: the deepest published LLMs have 126 (Llama 3.1 405B) and 96
# (GPT-3) decoder layers; a config past this is a mistake, refused before any work is sized by it.
MAX_LAYERS = 1024


_LATER_FIELDS = {"mlp_act": "gelu", "sliding_window": None, "qk_norm": False, "scaled_embedding": False,
                 "num_experts": 0,
                 "num_experts_per_tok": 0, "moe_intermediate_size": 0, "num_shared_experts": 0,
                 "shared_intermediate_size": 0, "shared_expert_gate": False, "dense_layers": (),
                 "num_mtp_layers": 0, "kv_lora_rank": 0, "q_lora_rank": 0, "qk_rope_head_dim": 0,
                 "qk_nope_head_dim": 0, "v_head_dim": 0, "rotary": None, "residual_dropout": None, "embedding_dropout": None,
                 "attention_dropout": None, "layer_windows": (), "attention_sinks": False, "o_bias": False,
                 "expert_bias": False, "swiglu_limit": None, "sinks_in_kernel": False, "router_aux_loss": False,
                 "router_dtype_bytes": 0,
                 "post_norms": False, "layer_rotary": ()}


def _llama(name, hidden, inter, layers, heads, kv, vocab, max_pos, source, *, rope, eps, tied=False,
           qkv_bias=False, sliding_window=None, **moe_or_mla) -> Arch:
    return Arch(name=name, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
                num_kv_heads=kv, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=max_pos,
                qkv_bias=qkv_bias, source=source, sliding_window=sliding_window, rope_theta=rope, norm_eps=eps,
                **moe_or_mla)


def _qwen3(name, hidden, inter, layers, heads, tied) -> Arch:
    return Arch(name=name, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
                num_kv_heads=8, vocab_size=151936, tie_word_embeddings=tied, max_position_embeddings=None,
                head_dim=128, qk_norm=True, rope_theta=1000000.0, norm_eps=1e-6,
                source="torchtitan/models/qwen3/__init__.py qwen3_args at 238fa9953e4a")


def _gpt_oss(size: str, layers: int, experts: int) -> Arch:
    """openai/gpt-oss-20b and gpt-oss-120b config.json (torchtitan b5bcd76c gpt_oss/__init__.py _20b, _120b): the
    shared dimensions, GQA with biases and sinks, even layers in a 128-token window, top-4 biased experts of
    2880 with the SwiGLU clamped at 7 (planner/models/gptoss.py says where each is read)."""
    return Arch(name=f"gpt-oss-{size}", hidden_size=2880, intermediate_size=2880, num_layers=layers,
                num_heads=64, num_kv_heads=8, head_dim=64, vocab_size=201088, tie_word_embeddings=False,
                max_position_embeddings=131072, qkv_bias=True, o_bias=True, attention_sinks=True,
                layer_windows=tuple(128 if i % 2 == 0 else None for i in range(layers)),
                num_experts=experts, num_experts_per_tok=4, moe_intermediate_size=2880, expert_bias=True,
                swiglu_limit=7.0, rope_theta=150000.0, norm_eps=1e-5, rope_scaling=("yarn", 32.0, 4096),
                source=f"openai/gpt-oss-{size} config.json; torchtitan b5bcd76c torchtitan/models/gpt_oss/__init__.py "
                       f"_{size}; transformers 5.24.0 models/gpt_oss/modeling_gpt_oss.py")


ARCHS: dict[str, Arch] = {a.name: a for a in (
    # config.json of meta-llama/Llama-2-{7b,13b,70b}-hf; Touvron et al. 2023, "Llama 2", Table 1
    _llama("llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, "meta-llama/Llama-2-7b-hf config.json",
           rope=10000.0, eps=1e-5),
    _llama("llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, "meta-llama/Llama-2-13b-hf config.json",
           rope=10000.0, eps=1e-5),
    _llama("llama2-70b", 8192, 28672, 80, 64, 8, 32000, 4096, "meta-llama/Llama-2-70b-hf config.json",
           rope=10000.0, eps=1e-5),
    # config.json of meta-llama/Meta-Llama-3-{8B,70B}; Grattafiori et al. 2024, "The Llama 3 Herd", Table 3
    _llama("llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, "meta-llama/Meta-Llama-3-8B config.json",
           rope=500000.0, eps=1e-5),
    _llama("llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, "meta-llama/Meta-Llama-3-70B config.json",
           rope=500000.0, eps=1e-5),
    _llama("llama3.1-405b", 16384, 53248, 126, 128, 8, 128256, 131072,
           "meta-llama/Llama-3.1-405B config.json; Llama 3 Herd paper, Table 3",
           rope=500000.0, eps=1e-5, rope_scaling=("llama3", 8.0, 8192)),
    # torchtitan main b5bcd76c torchtitan/models/llama3/__init__.py _1b, _3b (fuse_qkv; hidden
    # compute_ffn_hidden_dim(dim, multiple_of=1024, ffn_dim_multiplier 1.5 / 1.0): 8192; weights tied), the
    # dimensions of meta-llama/Llama-3.2-1B and Llama-3.2-3B config.json (rms_norm_eps 1e-5)
    _llama("llama3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072,
           "torchtitan/models/llama3/__init__.py _1b at b5bcd76c; meta-llama/Llama-3.2-1B config.json",
           rope=500000.0, eps=1e-5, tied=True),
    _llama("llama3.2-3b", 3072, 8192, 28, 24, 8, 128256, 131072,
           "torchtitan/models/llama3/__init__.py _3b at b5bcd76c; meta-llama/Llama-3.2-3B config.json",
           rope=500000.0, eps=1e-5, tied=True),
    # torchtitan's debug flavor, its quickstart's model (_debugmodel at b5bcd76c): dim 256, 16 heads (as many
    # KV heads), 6 layers, hidden compute_ffn_hidden_dim(256, multiple_of=256) = 768, vocab 2048, untied
    _llama("titan-llama3-debugmodel", 256, 768, 6, 16, 16, 2048, 131072,
           "torchtitan/models/llama3/__init__.py _debugmodel at b5bcd76c", rope=500000.0, eps=1e-5),
    # config.json of mistralai/Mistral-7B-v0.1; Jiang et al. 2023, "Mistral 7B", Table 1
    _llama("mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, "mistralai/Mistral-7B-v0.1 config.json",
           sliding_window=4096, rope=10000.0, eps=1e-5),
    # config.json of Qwen/Qwen2.5-{7B,72B}; Qwen2.5 technical report 2024, Table 1 (q/k/v biases)
    _llama("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, 131072, "Qwen/Qwen2.5-7B config.json", qkv_bias=True,
           rope=1000000.0, eps=1e-6),
    _llama("qwen2.5-72b", 8192, 29568, 80, 64, 8, 152064, 131072, "Qwen/Qwen2.5-72B config.json", qkv_bias=True,
           rope=1000000.0, eps=1e-6),
    # Mixture of experts. config.json of mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1: each
    # layer's MLP is 8 SwiGLU experts of width intermediate_size, top 2 (Jiang et al. 2024,
    # "Mixtral of Experts", Table 1; 46.7B total / 12.9B active, and mistral.ai's Mixtral 8x22B
    # announcement, 141B / 39B). The 8x22B base's vocabulary is 32,000 (Mistral's weights page,
    # platform-docs-public a8d3613a; its Instruct and v0.3 have 32,768: configs/hf/README.md). The
    # router as the config route reads model_type mixtral (archconfig.py): the softmax's top-2 weights
    # renormalized (the paper's Softmax(TopK)) and in fp32, as transformers' MixtralSparseMoeBlock runs it
    _llama("mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768,
           "mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024, Mixtral of Experts, Table 1",
           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336, rope=1000000.0, eps=1e-5,
           routing_weight_bytes=4, renormalizes_top_k=True),
    _llama("mixtral-8x22b", 6144, 16384, 56, 48, 8, 32000, 65536,
           "mistralai/Mixtral-8x22B-v0.1 config.json; mistral.ai, Cheaper, Better, Faster, Stronger (2024)",
           num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16384, rope=1000000.0, eps=1e-5,
           routing_weight_bytes=4, renormalizes_top_k=True),
    # config.json of deepseek-ai/DeepSeek-V2-Lite: MLA without q compression (q_lora_rank null),
    # layer 0 dense (first_k_dense_replace 1), then 64 routed experts top 6 and 2 shared, width
    # 1408; DeepSeek-AI 2024, "DeepSeek-V2", Appendix B: 15.7B total, 2.4B activated
    _llama("deepseek-v2-lite", 2048, 10944, 27, 16, 16, 102400, 163840,
           "deepseek-ai/DeepSeek-V2-Lite config.json; DeepSeek-V2 paper (arXiv 2405.04434), Appendix B",
           num_experts=64, num_experts_per_tok=6, moe_intermediate_size=1408, num_shared_experts=2,
           shared_intermediate_size=1408, dense_layers=(0,), kv_lora_rank=512, qk_rope_head_dim=64,
           qk_nope_head_dim=128, v_head_dim=128, rope=10000.0, eps=1e-6, rope_scaling=("yarn", 40.0, 4096)),
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
           qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, rope=10000.0, eps=1e-6,
           rope_scaling=("yarn", 40.0, 4096)),
    # config.json of Qwen/Qwen3-30B-A3B: 128 experts top 8 of width 768 in every layer
    # (decoder_sparse_step 1, mlp_only_layers []), head_dim 128, q/k norms; its model card: 30.5B
    # total, 3.3B activated
    Arch(name="qwen3-30b-a3b", hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
         num_kv_heads=4, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=40960,
         head_dim=128, qk_norm=True, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
         rope_theta=1000000.0, norm_eps=1e-6,
         source="Qwen/Qwen3-30B-A3B config.json and model card; Qwen3 Technical Report (arXiv 2505.09388)"),
    # Qwen3's dense models as torchtitan builds them (torchtitan/models/qwen3/__init__.py qwen3_args at
    # 238fa9953e4a, the flavors of its qwen3 train configs): head_dim 128, q/k norms, 8 KV heads, vocab
    # 151936, rope_theta 1e6, norm_eps 1e-6 (model/args.py); 0.6B, 1.7B and 4B tie the embedding and the
    # head (enable_weight_tying). Positions: rotary, the cache as long as the sequence (args.py
    # update_from_config), so no table length is recorded.
    *(_qwen3(name, hidden, inter, layers, heads, tied) for name, hidden, inter, layers, heads, tied in (
        ("qwen3-0.6b", 1024, 3072, 28, 16, True), ("qwen3-1.7b", 2048, 6144, 28, 16, True),
        ("qwen3-4b", 2560, 9728, 36, 32, True), ("qwen3-8b", 4096, 12288, 36, 32, False),
        ("qwen3-14b", 5120, 17408, 40, 40, False), ("qwen3-32b", 5120, 25600, 64, 64, False))),
    # GPT-OSS (planner/models/gptoss.py: sources, what each field is)
    _gpt_oss("20b", 24, 32), _gpt_oss("120b", 36, 128),
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (d_model 12288, 96 layers,
    # 96 heads, context 2048), GPT-2's BPE vocabulary of 50257, tied embeddings, 4h MLP with GELU
    Arch(name="gpt3-175b", hidden_size=12288, intermediate_size=4 * 12288, num_layers=96, num_heads=96,
         num_kv_heads=96, vocab_size=50257, tie_word_embeddings=True, max_position_embeddings=2048,
         style="gpt", norm_eps=1e-5, source="Brown et al. 2020, Table 2.1"),
)}


def arch(name: str) -> Arch:
    if name.lower() not in ARCHS:
        raise UserError(f"unknown --arch {name!r}; choose one of {', '.join(ARCHS)}, or pass --arch-config config.json")
    return ARCHS[name.lower()]
