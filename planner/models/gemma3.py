"""Gemma 3 and SmolLM3, what ckplan reads of them and from where.

Gemma 3, as transformers 5.24.0 `models/gemma3/modeling_gemma3.py` and `configuration_gemma3.py` build it
(framework-facts §421-§422):
- layers of two kinds by the config's `layer_types` ("sliding_attention": causal attention to the last
  `sliding_window` tokens; "full_attention": the whole causal prefix), or, where a config gives none,
  `sliding_window_pattern` P: every P-th layer full, the others sliding (Gemma3TextConfig.__post_init__);
  Gemma 3's published configs say P = 6, five local layers to one global;
- per-head q and k RMSNorms (q_norm, k_norm over head_dim) before rotary, head_dim its own (not hidden / heads);
- four RMSNorms a block: input_layernorm and pre_feedforward_layernorm before attention and MLP as in LLaMA,
  and post_attention_layernorm and post_feedforward_layernorm on their outputs before each residual add;
- the token embedding scaled by sqrt(hidden_size) (Gemma3TextScaledWordEmbedding), tied to the LM head;
- a gated MLP with gelu_pytorch_tanh (GeGLU), three matrices as SwiGLU's;
- its multimodal config (model_type "gemma3") wraps the text model's `text_config` beside a SigLIP
  `vision_config`: ckplan plans the text model and says the vision tower is left out.

SmolLM3 (`models/smollm3/`, §423): a LLaMA block with grouped-query attention and tied embeddings whose rotary
is off on the layers `no_rope_layers` marks 0 (SmolLM3Attention.use_rope), or, where a config gives no list,
every `no_rope_layer_interval`-th layer (SmolLM3Config.__post_init__); a sliding window, where
`use_sliding_window`, only on those NoPE layers.
"""

from __future__ import annotations

from dataclasses import replace

from planner.errors import UserError
from planner.models.archs import Arch

SLIDING, FULL = "sliding_attention", "full_attention"
VISION_LEFT_OUT = ("the vision tower (vision_config) and its projector are left out: the text model alone is "
                   "planned, as for text-only training")


def text_config(config: dict, where: str) -> tuple[dict, str]:
    """A multimodal Gemma 3 config's text model (its text_config, as a gemma3_text config) and what is left out."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise UserError(f"{where}: a gemma3 config holds its text model in text_config, and this one has none; "
                        "give text_config, or the text model's own config (model_type gemma3_text)")
    merged = {**text, "model_type": "gemma3_text"}
    if "tie_word_embeddings" in config and "tie_word_embeddings" not in text:  # Gemma3Config's own field
        merged["tie_word_embeddings"] = config["tie_word_embeddings"]
    return merged, VISION_LEFT_OUT if config.get("vision_config") is not None else ""


def gemma3_fields(config: dict, where: str, arch: Arch) -> Arch:
    """A gemma3_text config's own fields on the gated arch archconfig read from it: each layer's window, the
    four norms a block."""
    if config.get("use_bidirectional_attention"):
        raise UserError(f"{where}: use_bidirectional_attention is true (Gemma 3 as an encoder, every token seeing "
                        "the window both ways); ckplan plans causal decoders: set it to false")
    window = arch.sliding_window
    if window is None:
        raise UserError(f"{where} has no sliding_window; a gemma3_text config needs it (its local layers' window)")
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern")
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern <= 0:
            raise UserError(f"{where} has neither layer_types nor a positive sliding_window_pattern; a gemma3_text "
                            "config needs one to say which layers are local (Gemma 3's: every 6th layer global)")
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(arch.num_layers)]
    if not isinstance(types, list) or len(types) != arch.num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise UserError(f"{where}: layer_types must list {arch.num_layers} entries, each {SLIDING!r} or {FULL!r}, "
                        f"got {types!r}")
    return replace(arch, sliding_window=None, layer_windows=tuple(window if t == SLIDING else None for t in types),
                   post_norms=True)


def smollm3_fields(config: dict, where: str, arch: Arch) -> Arch:
    """A smollm3 config's own fields: each layer's rotary (its NoPE layers) and window."""
    layers = arch.num_layers
    marks = config.get("no_rope_layers")
    if marks is None:
        interval = config.get("no_rope_layer_interval")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise UserError(f"{where} has neither no_rope_layers nor a positive no_rope_layer_interval; a smollm3 "
                            "config needs one to say which layers skip rotary (SmolLM3-3B's: every 4th)")
        marks = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(marks, list) or len(marks) != layers or any(m not in (0, 1) or isinstance(m, bool) for m in marks):
        raise UserError(f"{where}: no_rope_layers must list {layers} entries, each 1 (rotary) or 0 (none), got "
                        f"{marks!r}")
    window = arch.sliding_window if config.get("use_sliding_window") is True else None
    windows = tuple(None if m else window for m in marks) if window else ()
    return replace(arch, sliding_window=None, layer_windows=windows, layer_rotary=tuple(bool(m) for m in marks))


# transformers 5.24's Qwen configs (framework-facts §505): the window only where use_sliding_window (default false), and
# then on the layers layer_types marks sliding; where a config gives none, Qwen2Config / Qwen3Config mark those from
# max_window_layers (default 28) up (configuration_qwen2.py 82-93, configuration_qwen3.py 76-96), Qwen2MoeConfig the
# even-indexed ones below it (configuration_qwen2_moe.py 112-116), and Qwen3MoeConfig has no layer_types: its
# attention takes the window on every layer (modeling_qwen3_moe.py 149)
QWEN_MAX_WINDOW_LAYERS = 28


def qwen_fields(config: dict, where: str, arch: Arch) -> Arch:
    """A Qwen config's window on the layers that have it: every layer alike where none or all do."""
    window = arch.sliding_window
    if window is None or config.get("use_sliding_window") is not True:
        return replace(arch, sliding_window=None)
    types = config.get("layer_types") if config.get("model_type") != "qwen3_moe" else [SLIDING] * arch.num_layers
    if types is None:
        bound = config.get("max_window_layers", QWEN_MAX_WINDOW_LAYERS)
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise UserError(f"{where}: max_window_layers must be a whole number of layers, got {bound!r}")
        sliding = ((lambda i: i % 2 == 0 and i < bound) if config.get("model_type") == "qwen2_moe"
                   else (lambda i: i >= bound))
        types = [SLIDING if sliding(i) else FULL for i in range(arch.num_layers)]
    if not isinstance(types, list) or len(types) != arch.num_layers or any(t not in (SLIDING, FULL) for t in types):
        raise UserError(f"{where}: layer_types must list {arch.num_layers} entries, each {SLIDING!r} or {FULL!r}, "
                        f"got {types!r}")
    if all(t == SLIDING for t in types):
        return arch
    if all(t == FULL for t in types):
        return replace(arch, sliding_window=None)
    return replace(arch, sliding_window=None, layer_windows=tuple(window if t == SLIDING else None for t in types))
