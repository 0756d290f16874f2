"""A split backward's two passes per recompute option, analytically: torch 2.13's I
(stage_backward_input) and W (stage_backward_weight) of a block under none, full and the selective
options, as the fake profile counts them when it runs torch's passes (planner/profiler/fake_split.py).

What each pass runs (docs/framework-facts.md §62, §73, §78):
- option none: W the weight-gradient GEMMs and the gradients' accumulation into .grad
  (analytic_time.block_weight_grad_work), I the rest of the backward;
- a region under torch's non-reentrant checkpoint (full: the whole block; a module-level option: that
  module) is rerun once in I, and once more in W for every parameter group whose gradient needs the
  region's saved tensors: stage_backward_weight calls torch.autograd.grad once per group
  (torch/distributed/pipelining/_backward.py 292-339), each call a graph task of its own, and the
  checkpoint reruns its region once per graph task that unpacks one of its saved tensors (torch's
  GraphExecGroup, which would share one rerun, is not used by torch 2.13's pipelining). Each rerun
  stops early where the option's recompute_ms does (the checkpoint's early stop), so I = none's I +
  recompute_ms, W = none's W + (groups in the region) x recompute_ms.

The groups (torch 2.13 _backward.get_param_groups): a parameter's group is keyed by the first autograd
nodes downstream of it that the block's input also reaches; parameters meeting the activations at the
same node share a group. So one group per op that takes the activation and a parameter: a Linear's weight
with its bias (one addmm or linear node), a norm's weight with its bias (one native_layer_norm; an RMSNorm's
weight multiply), each routed experts' tensor (transformers' MoE experts hold gate_up_proj and down_proj as
one tensor each over the experts). Counted here from the block's structure as the analytic profile models
it (Hugging Face's modules, `block_param_groups`); tests/test_analytic_split.py checks each count against
torch's own grouping on the same family's transformers block.
"""

from __future__ import annotations

from planner.models.archs import GPU, Arch
from planner.profiler import analytic_moe, analytic_time
from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel, Work, work
from planner.schema import OPTION_FULL, OPTION_NONE, runs_split_backward

# Hugging Face's modules, per part of a block: the parameter groups each part's parameters make
NORMS = 2  # the attention's and the MLP's norm (input_layernorm, post_attention_layernorm; GPT-2's ln_1, ln_2)


def attention_groups(arch: Arch) -> int:
    """The attention module's parameter groups: q, k, v and o projections (a bias joins its
    projection's group: Qwen2's q/k/v biases add none), Qwen3's q_norm and k_norm; GPT-2's one
    c_attn (Q, K and V fused, as analytic_time times it) and c_proj, OPT's and StarCoder2's four (Arch.separate_qkv); latent attention (DeepSeek-V2/V3):
    q_proj, or q_a_proj, q_a_layernorm and q_b_proj with a Q latent; kv_a_proj_with_mqa, kv_a_layernorm,
    kv_b_proj; o_proj."""
    if arch.mla:
        return (3 if arch.q_lora_rank else 1) + 3 + 1
    if arch.style == "gpt":  # OPT's and StarCoder2's q_proj, k_proj, v_proj, out_proj (o_proj): 4
        return 4 if arch.separate_qkv else 2
    return 4 + (2 if arch.qk_norm else 0)


def mlp_groups(arch: Arch, *, moe: bool) -> int:
    """The MLP's parameter groups: gate, up and down (GPT: the two matrices with their biases); a
    mixture of experts: the router, the routed experts' gate_up_proj and down_proj (transformers' fused
    expert tensors: one group each, however many experts), the shared experts' MLP (gate, up, down)
    and Qwen2-MoE's shared-expert gate."""
    if arch.style == "gpt":
        return 2
    if not moe:
        return 3
    return 1 + 2 + (3 if arch.num_shared_experts else 0) + (1 if arch.shared_expert_gate else 0)


def block_param_groups(arch: Arch, *, moe: bool) -> dict[str, int]:
    """Per part of a decoder block, the parameter groups torch 2.13's stage_backward_weight makes
    (one torch.autograd.grad call each): {"attention", "mlp", "norms"}."""
    return {"attention": attention_groups(arch), "mlp": mlp_groups(arch, moe=moe),
            "norms": NORMS + (2 if arch.post_norms else 0)}  # Gemma 3's post-attention and post-MLP norms


def region_groups(arch: Arch, part: str, *, moe: bool) -> int:
    """The parameter groups inside a part an analytic option checkpoints (analytic_kept.selective_options):
    W's calls that rerun it. `core-attn` is the attention core (no parameter: its rerun is I's alone); `attn`
    the attention module (attention_groups); `mla-up`
    the up projections (q_b_proj where Q has a latent, kv_b_proj); `mlp` the MLP module; `norm-out`
    Megatron-LM's norms recomputed by a hook on their sub-block's output gradient (CheckpointWithoutOutput,
    not torch's checkpoint): once, in I, none in W."""
    if part == "mlp":
        return mlp_groups(arch, moe=moe)
    if part == "attn":  # the attention module whole: every projection's weight needs its saved tensors
        return attention_groups(arch)
    if part == "mla-up":
        return 2 if arch.q_lora_rank else 1
    if part in ("core-attn", "norm-out"):
        return 0
    raise ValueError(f"no region for part {part!r}")


def none_split(arch: Arch, shape: Shape, bwd: Work, gpu: GPU, mfu: float | None, *, moe: bool) -> tuple[float, float]:
    """Option none's (input pass, weight pass) ms of a block whose backward's work is `bwd`
    (analytic_time.block_work): W its own work (analytic_time.block_weight_grad_work), I the rest of
    the backward's work, each at the roofline (the norm weights' gradients leave the norms' bytes for
    W, where the fake profile's counters class them elementwise: torch's W runs them outside the
    norm module's backward)."""
    weight = analytic_time.block_weight_grad_work(arch, shape, moe=moe)
    norms = analytic_time.norm_weight_grad_bytes(arch, shape)
    as_in_backward = work(weight.flops, weight.bytes, [k for k, n in weight.kernels for _ in range(n)],
                          classed={"elementwise": weight.bytes - norms, "norm": norms})
    return analytic_time.times_ms((bwd - as_in_backward, weight), gpu, mfu)


def torch_rerun_ms(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None, part: str, part_ms: float, *,
                   moe: bool) -> float:
    """What torch's non-reentrant checkpoint reruns of a part a selective option checkpoints, in ms, where
    it differs from the option's recompute (`part_ms`, analytic_time.rerun_work: the whole part's forward,
    as a reentrant checkpoint reruns it, Megatron-LM's): a dense MLP's rerun stops before its last GEMM
    (the down projection, GPT's second matrix), whose input is the last tensor the forward saved, packed
    before the GEMM runs (torch's early stop, torch/utils/checkpoint.py `_StopRecomputationError`). A split
    backward runs only under torch's pipelining, so its reruns are these. A GPT block that drops its residual
    (transformers' GPT-2 and StarCoder2 MLPs end in that dropout, whose mask is saved after c_proj runs): the whole
    MLP and the dropout. Mixtral's mixture: all but what follows its weighting (analytic_moe.early_stop_bytes);
    another MoE block's mixture: as recorded."""
    if part == "mlp" and moe and analytic_moe.counts_mixture(arch):  # Mixtral's: all but the mixture's tail
        rerun = analytic_time.rerun_work(arch, shape, part, moe=True)
        tail = analytic_moe.early_stop_bytes(arch, shape)
        return analytic_time.times_ms((rerun - work(0, tail, [], classed={"activation": tail}),), gpu, mfu)[0]
    if part != "mlp" or moe:
        return part_ms
    rerun = analytic_time.rerun_work(arch, shape, part, moe=False)
    if arch.style == "gpt" and arch.drops_residual:
        dropout = analytic_time.DROPOUT_FWD * shape.tokens * arch.hidden_size
        return analytic_time.times_ms((rerun + work(0, dropout, [], classed={"elementwise": dropout}),), gpu, mfu)[0]
    last = 2 * shape.tokens * arch.hidden_size * (arch.intermediate_size // shape.tp)  # down (c_proj) GEMM's FLOPs
    return analytic_time.times_ms((rerun - work(last, 0, [Kernel("matmul", last)]),), gpu, mfu)[0]


def split_ms(none_split: tuple[float, float], recompute_ms: float, weight_reruns: float) -> dict[str, float]:
    """An option's input_grad_ms and weight_grad_ms: none's pair, its rerun once in I, and
    `weight_reruns` (a sum of each rerun's ms x the groups that rerun it) in W."""
    none_input, none_weight = none_split
    return {"input_grad_ms": none_input + recompute_ms, "weight_grad_ms": none_weight + weight_reruns}


def full_split(arch: Arch, none_split: tuple[float, float], recompute_ms: float, *, moe: bool) -> dict[str, float]:
    """Full recompute's pair: the block rerun once in I and once per parameter group in W."""
    groups = sum(block_param_groups(arch, moe=moe).values())
    return split_ms(none_split, recompute_ms, groups * recompute_ms)


def splits(arch: Arch, none_pair: tuple[float, float], recompute_ms: float, *, moe: bool) -> dict[str, dict[str, float]]:
    """None's and full's pairs, by option name (what analytic._layer records on those two options)."""
    return {OPTION_NONE: dict(zip(("input_grad_ms", "weight_grad_ms"), none_pair, strict=True)),
            OPTION_FULL: full_split(arch, none_pair, recompute_ms, moe=moe)}


def selective_split(arch: Arch, name: str, none_split: tuple[float, float] | None,
                    part_ms: dict[str, float], *, moe: bool) -> dict[str, float]:
    """A selective option's pair (`name`: its parts joined by commas; `part_ms`: each part's rerun ms),
    {} where none is recorded or torch's split cannot run it (a selective-checkpoint part: runs_split_backward)."""
    if none_split is None or not runs_split_backward(name) or name == OPTION_FULL:
        return {}
    parts = name.split(",")
    if any(part not in part_ms for part in parts):
        return {}
    return split_ms(none_split, sum(part_ms[part] for part in parts),
                    sum(region_groups(arch, part, moe=moe) * part_ms[part] for part in parts))
