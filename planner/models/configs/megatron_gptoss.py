"""What a Megatron-LM flags file says of GPT-OSS's pieces that Megatron-core runs outside Transformer Engine's
fused kernels (planner/profiler/te_moe_eager.py times them; docs/framework-facts.md §123):
- `--activation-func-clamp-value`: the gated experts' clamp, applied eagerly before the fused GLU
  (megatron-core 92c8482e fusions/fused_bias_geglu.py 410-440): `Arch.swiglu_limit`;
- the experts' biases (`add_bias_linear`, Megatron-LM's default; off under `--disable-bias-linear`): linear_fc2's
  added expert by expert (experts.py 822-840): `Arch.expert_bias`;
- YaRN on a non-latent attention (`--position-embedding-type yarn`, `--rotary-scaling-factor` F): Megatron-core
  passes the YaRN concentration factor 0.1·ln F + 1 as `mscale` to `apply_rotary_pos_emb`, which takes the unfused
  rotary wherever it is not 1.0 (rope_utils.py 268-312; attention.py 880-901; yarn_rotary_pos_embedding.py
  223-252): `Arch.rope_scaling = ("yarn", F, None)` where F > 1.
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
