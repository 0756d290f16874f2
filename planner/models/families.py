"""The model families each config reader takes, by Hugging Face `model_type`: the analytic reader's
(`profile --arch-config`, planner/models/archconfig.py: the architecture's formulas) and the ones built from
transformers' own code (`profile --hf-config`, planner/models/hfmodels.py). Each reader's refusal names the
other where the other reads the family, so both read these lists here."""

# families whose MLP is gated (gate and up projections, then down): SiLU-gated (SwiGLU) or, in
# Gemma and Gemma 3, GELU-gated (GeGLU), which keeps the same four f-wide tensors (gemma3: Gemma 3's multimodal
# config, whose text model is read; SmolLM3: LLaMA's block, rotary off on some layers)
GATED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text", "gemma3", "smollm3")
# gated-MLP families with a mixture of experts (and DeepSeek's latent attention)
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
GPT_TYPES = ("gpt2", "opt", "starcoder2")  # LayerNorm, a two-matrix MLP, biases, dropout; learned positions
# (StarCoder2: rotary, grouped-query attention)

# the families `profile --hf-config` builds from transformers' code with random weights
BUILT_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gpt2", "mixtral", "qwen2_moe", "phi3", "olmo2",
                  "starcoder2", "granite", "cohere", "phimoe", "qwen3_moe", "olmoe", "granitemoe", "deepseek_v2",
                  "deepseek_v3", "gemma3_text", "smollm3")
