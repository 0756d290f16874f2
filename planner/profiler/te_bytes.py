"""Bytes Transformer Engine's fused kernels move per element of the tensor they work on (and per token for the
norms' statistics), forward and backward: the counts te_fused.py (dense blocks) and te_moe.py (MoE blocks) time
at the memory-bound rates. Their sources are te_fused.py's docstring's."""

# per element of the normalised tensor, and per token (the statistics), forward and backward
TE_NORM_FWD, TE_NORM_BWD = 4, 6
TE_RMSNORM_TOKEN = 4  # 1/rms (fp32)
ROPE_FUSED_FWD, ROPE_FUSED_BWD = 4, 4
SWIGLU_FUSED_FWD, SWIGLU_FUSED_BWD = 6, 10
GELU_FUSED_FWD, GELU_FUSED_BWD = 4, 6
