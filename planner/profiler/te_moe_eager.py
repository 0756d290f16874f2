"""The eager ops a Megatron-core MoE block runs around Transformer Engine's kernels, beyond te_moe.py's fused
ones, as megatron-core 92c8482e (Megatron-Bridge 25.11's pin) and TE v2.9 run them (docs/framework-facts.md §123).
S = T·k token copies on the rank's local experts, f the experts' width / TP, h hidden; bf16 (2 B) activations and
routing weights (te_moe.py: the router runs in the input's dtype).

- GPT-OSS's clamp (`--activation-func-clamp-value`): `weighted_bias_quick_geglu_impl` (fusions/fused_bias_geglu.py
  410-440) chunks linear_fc1's 2f-wide output, clamps the GLU half (`max`) and the linear half (`-v, v`) and cats
  them, eagerly, before the compiled weighted GLU: forward two clamps (2 B read, 2 written, over f each) and the
  cat (4 B over 2f): 16 B per S·f; backward the cat's is views, each clamp's `clamp_backward` (torch
  FunctionsManual.cpp: `where(self <= max, grad, 0)`, 2 + 1 + 1 + 2 + 2 = 8 B; `where((self >= min)
  .logical_and_(self <= max), grad, 0)`, 3 + 3 + 3 + 5 = 14 B) and the chunk's (`split_backward`: a cat of the two
  gradients, 4 B over 2f): 30 B per S·f. Inside `bias_act_func`, so `--recompute-modules moe_act` reruns its forward.
- the experts' biases (`--add-bias-linear`): linear_fc1's is TE GroupedLinear's own (`skip_bias_add=False`,
  experts.py 757-790): added in the grouped GEMM's epilogue and its gradient made in the wgrad GEMM's (bf16:
  grouped_linear.py 150-180, 415-437 at TE v2.9): no pass of its own. linear_fc2's is returned
  (`skip_bias_add=True`) and `TEGroupedMLP._apply_bias` adds it weighted, expert by expert (experts.py 822-840):
  `cat([t + b * p for each expert's split])`: forward b·p written (2 B), the add (2 + 2 read, 2 written), the cat
  (2 + 2): 12 B per S·h; backward (autograd) the product's two gradients, `grad * p` summed to the bias and
  `grad * b` summed to the weight (2 + 2 + 2 B each), and the split's cat of the rows' gradient (2 + 2): 16 B per
  S·h. After linear_fc2: no recompute option reruns it but full.
- FP8's padding (`config.fp8`): TEGroupedMLP pads each local expert's rows to a multiple of 16 (`Fp8Padding`,
  experts.py 858-868) and unpads linear_fc2's output (`Fp8Unpadding`), TE's `fused_multi_row_padding` /
  `_unpadding` (a row read, 2 B, and written, 2 B; fp8_padding.py 20-68 at v2.9); backward each the other: 8 B
  per S·h each way. The padding is skipped only where every split is a multiple of 16 already (fp8_padding.py
  121-122); `--moe-router-force-load-balancing` routes by random logits (`RandomSTE`, moe_utils.py 908-935: a
  normal sample per token and expert, then the top-k), so a rank's E / EP splits are random counts, all multiples
  of 16 with probability about 16^(-E/EP): charged whenever a rank holds experts under FP8. TE's own kernels:
  the fused rate. The routing weights' padding (S x 1) is not charged (1/h of it).
- the rotary under YaRN (a non-latent attention, `Arch.rope_scaling` yarn with a factor F > 1: GPT-OSS's 32):
  attention.py 880-901 passes `mscale = _yarn_get_concentration_factor_from_config(config)`, 0.1·ln F + 1 without a
  yarn_mscale pair (yarn_rotary_pos_embedding.py 223-252), and `apply_rotary_pos_emb` takes the unfused
  `_apply_rotary_pos_emb_bshd` wherever mscale != 1.0, even under apply_rope_fusion (rope_utils.py 268-312): Q and
  K each `t * cos + rotate_half(t) * sin` (rotate_half a negation and a cat) and a cat with the empty unrotated
  part, eagerly: 24 B forward and 28 B backward per element of Q or K (the cos/sin tables per position beside it,
  1/heads of it, not charged), in place of TE's fused rotary (te_bytes.ROPE_FUSED_*).
- the auxiliary load-balancing loss's eager ops (`Arch.router_aux_loss`; its TE kernels: te_moe.py): forward
  `_apply_aux_loss`'s `routing_map.sum(dim=0)` (router.py 277 at 92c8482e: the bool map read, 1 B per token and
  expert, E int64 counts written; the counts' all-reduce over the TP x CP group, none at one rank, not charged);
  backward autograd's add of the logits' two gradients, the top-k's and the aux scores' (2 + 2 read, 2 written: 6 B
  per token and expert; 12 under `--moe-router-dtype fp32`, Arch.router_dtype_bytes). Elementwise class; T tokens, E experts.
"""

from __future__ import annotations

from collections import Counter

from planner.profiler import formulas, gptoss_time

CLAMP_FWD, CLAMP_BWD = 16, 30  # per element of each copy's f-wide GLU half (the module docstring)
APPLY_BIAS_FWD, APPLY_BIAS_BWD = 12, 16  # per element of each copy's h-wide linear_fc2 output
FP8_PAD_FWD, FP8_PAD_BWD = 8, 8  # per element of each copy's h-wide input and output (pad + unpad)
UNFUSED_ROPE_FWD, UNFUSED_ROPE_BWD = 24, 28  # per element of Q or K (scripts/megatron_moe_opbytes.py's count)
AUX_SUM_FWD, AUX_COUNT, AUX_ADD_BWD = 1, 8, 6  # per (token, expert); per expert (int64); per (token, expert)


def _copies(arch, shape) -> int:
    """S: the token copies the rank's local experts receive (te_moe.py's T·k)."""
    return shape.tokens * arch.num_experts_per_tok


def eager_classes(arch, shape) -> tuple[Counter, Counter]:
    """(forward, backward) bytes of the eager clamp and linear_fc2's weighted bias (the module docstring) by op class
    (membound.OP_CLASSES): the clamp runs in the experts' activation function (activation, as gptoss_time classes the
    eager profile's clamped SwiGLU), the bias's products, add and cat after linear_fc2 (elementwise); none for a
    block without them."""
    S, f, h = _copies(arch, shape), arch.moe_intermediate_size // shape.tp, arch.hidden_size
    clamp = (CLAMP_FWD * S * f, CLAMP_BWD * S * f) if arch.swiglu_limit else (0, 0)
    bias = (APPLY_BIAS_FWD * S * h, APPLY_BIAS_BWD * S * h) if arch.expert_bias else (0, 0)
    aux = aux_loss_bytes(arch, shape)
    return (+Counter(activation=clamp[0], elementwise=bias[0] + aux[0]),
            +Counter(activation=clamp[1], elementwise=bias[1] + aux[1]))


def aux_loss_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes of the aux loss's eager ops (the module docstring); (0, 0) where it does not run."""
    if not (arch.num_experts and arch.router_aux_loss):
        return 0, 0
    T, E = shape.tokens, arch.num_experts
    add = AUX_ADD_BWD * (arch.router_dtype_bytes or 2) // 2  # the logits' dtype: 6 B in bf16, 12 in fp32
    return AUX_SUM_FWD * T * E + AUX_COUNT * E, add * T * E


def eager_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes of the eager clamp and linear_fc2's weighted bias (eager_classes' sums)."""
    fwd, bwd = eager_classes(arch, shape)
    return sum(fwd.values()), sum(bwd.values())


def act_rerun_bytes(arch, shape) -> int:
    """Bytes the eager clamp adds to a moe_act rerun (its forward again)."""
    return CLAMP_FWD * _copies(arch, shape) * (arch.moe_intermediate_size // shape.tp) if arch.swiglu_limit else 0


def eager_expert_bias_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the eager profile charges the experts' two biases (gptoss_time.py: torchtitan's
    repeated biases over 2f + h per routed copy), which Megatron's block moves as eager_bytes says instead."""
    if not (arch.num_experts and arch.expert_bias):
        return 0, 0
    slots = arch.num_experts * formulas.expert_tokens(arch, shape)
    width = 2 * (arch.moe_intermediate_size // shape.tp) + arch.hidden_size
    return gptoss_time.EXPERT_BIAS_FWD * slots * width, gptoss_time.EXPERT_BIAS_BWD * slots * width


def fp8_padding_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes of TE's FP8 row padding and unpadding around the rank's grouped GEMMs."""
    if not arch.num_experts:
        return 0, 0
    S, h = _copies(arch, shape), arch.hidden_size
    return FP8_PAD_FWD * S * h, FP8_PAD_BWD * S * h


def unfused_rotary(arch) -> bool:
    """Whether Megatron-core rotates Q and K with its unfused rotary (YaRN above factor 1 on a non-latent
    attention: the module docstring)."""
    scaling = arch.rope_scaling
    return bool(scaling) and scaling[0] == "yarn" and scaling[1] > 1 and not arch.mla and arch.rotates
