"""What a Megatron-LM flags file says of GPT-OSS's pieces that Megatron-core runs outside Transformer Engine's
fused kernels (planner/profiler/te_moe_eager.py times them; docs/framework-facts.md §123):
- `--activation-func-clamp-value`: the gated experts' clamp, applied eagerly before the fused GLU
  (megatron-core 92c8482e fusions/fused_bias_geglu.py 410-440): `Arch.swiglu_limit`;
- the experts' biases (`add_bias_linear`, Megatron-LM's default; off under `--disable-bias-linear`): linear_fc2's
  added expert by expert (experts.py 822-840): `Arch.expert_bias`;
- YaRN on a non-latent attention (`--position-embedding-type yarn`, `--rotary-scaling-factor` F): Megatron-core
  passes the YaRN concentration factor 0.1·ln F + 1 as `mscale` to `apply_rotary_pos_emb`, which takes the unfused
  rotary wherever it is not 1.0 (rope_utils.py 268-312; attention.py 880-901; yarn_rotary_pos_embedding.py
  223-252): `Arch.rope_scaling = ("yarn", F, None)` where F > 1;
- `--softmax-type learnable` (GPT-OSS's sinks): one learned logit per head and layer (TE's `softmax_offset`, a
  parameter of the rank's heads),
  applied inside Transformer Engine's cuDNN fused attention (TE >= 2.8 with cuDNN >= 9.13.1; FlashAttention is
  disabled for it): `Arch.attention_sinks` with `sinks_in_kernel` (the parameters counted, no eager rescale);
  `off-by-one` a fixed zero logit in the same kernel, no parameters (docs/framework-facts.md §159);
- `--glu-linear-offset`: `act(gate) * (up + offset)`, an add inside the jit-fused quick-GeGLU
  (`weighted_bias_quick_geglu_impl`, fusions/fused_bias_geglu.py; experts.py passes `config.glu_linear_offset`),
  nothing of its own there; the eager GLU (`--no-bias-swiglu-fusion`) adds it as one more elementwise op (§159).
"""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs.megatron_args import Flags


def expert_facts(flags: Flags, *, moe: bool, no_bias: bool) -> tuple[dict, bool]:
    """(the Arch fields of the experts' clamp and biases, whether the linears have biases), reading the flags."""
    clamp = flags.take("--activation-func-clamp-value", "the gated experts' clamp (eager, before the fused GLU)", float)
    if clamp is not None and not clamp > 0:
        raise UserError(f"--activation-func-clamp-value {clamp!r} is not a positive number (GPT-OSS's is 7.0); give one")
    no_bias = no_bias or not flags.take("--add-bias-linear", "linear biases (Megatron-LM's default)", bool, True)
    if not moe:
        if clamp is not None:
            flags.notes.append("--activation-func-clamp-value: a dense MLP's clamp is not modelled (the experts' is)")
        return {}, not no_bias
    return {"expert_bias": not no_bias, "swiglu_limit": clamp}, not no_bias


def yarn_scaling(flags: Flags, kind: str, *, mla: bool) -> dict:
    """`rope_scaling` of a non-latent attention under YaRN with a factor above 1 (the module docstring); none else
    (a latent attention's YaRN is te_mla.py's, and --rotary-scaling-factor stays listed there)."""
    if kind != "yarn" or mla or not flags.has("--rotary-scaling-factor"):
        return {}
    factor = flags.take("--rotary-scaling-factor", "YaRN's rotary scaling (Megatron-core's unfused rotary above 1)",
                        float, 1.0)
    if not factor > 0:
        raise UserError(f"--rotary-scaling-factor {factor!r} is not a positive number; give one (GPT-OSS's is 32)")
    return {"rope_scaling": ("yarn", factor, None)} if factor > 1 else {}


# what the reader says of each --softmax-type (transformer_config.py softmax_type: vanilla, off-by-one, learnable)
SOFTMAX_TYPES = {
    "vanilla": ("modelled", "the softmax of every attention kernel (Megatron-LM's default)"),
    "off-by-one": ("no effect", "a fixed zero sink logit inside TE's cuDNN fused attention: no parameter, the kernel's "
                   "softmax denominator one term longer per row (timed as vanilla: no published rate of its own)"),
    "learnable": ("modelled", "GPT-OSS's sinks: one learned logit per head and layer (TE's softmax_offset: counted "
                  "in the parameters, their gradients and Adam's state), applied inside TE's cuDNN fused attention, "
                  "which keeps what it keeps without them (O, the softmax statistics) and is timed at the GPU's "
                  "cuDNN figures as vanilla (no published sink-kernel rate); no eager rescale as torchtitan's"),
}


def sink_fields(flags: Flags) -> dict:
    """The Arch's sink fields for --softmax-type (SOFTMAX_TYPES), its status said as the table has it."""
    kind = flags.take("--softmax-type", "attention softmax", str, "vanilla")
    if kind not in SOFTMAX_TYPES:
        raise UserError(f"--softmax-type {kind!r} is not one of Megatron-LM's ({', '.join(SOFTMAX_TYPES)}); give one")
    if flags.sink and flags.sink[-1][0] == "--softmax-type":
        flags.sink[-1] = (*flags.sink[-1][:2], *SOFTMAX_TYPES[kind])
    return {"attention_sinks": True, "sinks_in_kernel": True} if kind == "learnable" else {}


def glu_offset(flags: Flags, *, quick_geglu: bool) -> None:
    """--glu-linear-offset said as what it does: inside the fused quick-GeGLU, nothing; an eager GLU's add, not
    charged; with a SiLU GLU's fused kernel (which takes no offset: experts.py, mlp.py) not applied by Megatron."""
    offset = flags.take("--glu-linear-offset", "the GLU's linear offset", float, 0.0)
    if not flags.sink or flags.sink[-1][0] != "--glu-linear-offset":
        return
    fused = not flags.has("--no-bias-swiglu-fusion")
    if offset == 0:
        status, what = "no effect", "0: no offset (Megatron-LM's default)"
    elif quick_geglu and fused:
        status, what = "no effect", ("an add inside the jit-fused quick-GeGLU (weighted_bias_quick_geglu_impl takes "
                                     "glu_linear_offset): no pass, byte or kept tensor of its own (framework-facts §159)")
    elif fused:
        status, what = "no effect", ("the fused SiLU GLU (weighted_bias_swiglu_impl / bias_swiglu_impl) takes no offset: "
                                     "Megatron-core drops it on this path (framework-facts §159)")
    else:
        status, what = "not modelled", ("the eager GLU's `up + offset`: one more elementwise op over the f-wide half "
                                        "(2 B read, 2 B written an element, and its gradient a view), not charged")
    flags.sink[-1] = (*flags.sink[-1][:2], status, what)
