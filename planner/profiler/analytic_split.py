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
from planner.profiler import analytic_moe, analytic_time, formulas
from planner.profiler.formulas import Shape
from planner.profiler.roofline import Kernel, Work, work
from planner.schema import OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD, runs_split_backward

# Hugging Face's modules, per part of a block: the parameter groups each part's parameters make
FP32_BYTES = 4
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


REGIONS = ("mlp", "attn", "mla-up", "core-attn", "norm-out")  # the parts region_groups counts


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


# ---------------------------------------------------------------- the split backward's bytes (§888-§890)


def saved_output_grad_bytes(arch: Arch, shape: Shape, *, moe: bool) -> int:
    """What torch's stage_backward_input leaves a block's weight pass: per parameter group, the gradient of the
    output of the group's first node on the block's input-to-output path (its pre-hook's `param_group["grads"]`,
    _backward.py 200-225: a Linear's [tokens, out features], a norm's [tokens, hidden]), bound until
    stage_backward_weight deletes it, in the activations' dtype; less the incoming gradient where a group's output
    is the block's (a dense block's down projection: the residual add passes it on as it is), which was live
    before. Gemma's norms scale in fp32 (Arch.fp32_norm_scale): their outputs' gradients, Qwen-style q and k
    norms' too, 4 B an element, and the post-MLP norm's is a cast of the incoming one, not it. Per device: projections split /t; the norms' and the output projections'
    [tokens, hidden] counted whole (over under SP, where a norm's rows are /t). A MoE block's routed experts at
    their capacity's rows (formulas.expert_tokens, every expert's); nothing subtracted there (a weighted or gated
    sum: the experts' outputs' gradients are new)."""
    t, h = shape.tp, arch.hidden_size
    if arch.mla:  # q_a, q_a norm, q_b (or q_proj); kv_a (latent and rope), kv_a norm, kv_b; o
        heads = arch.num_heads // t
        attention = (2 * arch.q_lora_rank + heads * (arch.qk_nope_head_dim + arch.qk_rope_head_dim)
                     + 2 * arch.kv_lora_rank + arch.qk_rope_head_dim + heads * (arch.qk_nope_head_dim + arch.v_head_dim) + h)
    elif arch.style == "gpt":  # c_attn (or q, k, v), c_proj
        attention = 3 * h // t + h
    else:  # q, k, v, o; Qwen3's q_norm and k_norm
        q, kv = formulas.q_width(arch, shape), formulas.kv_width(arch, shape)
        qk_norms = (q + kv) * (FP32_BYTES // shape.d if arch.fp32_norm_scale else 1)
        attention = q + 2 * kv + h + (qk_norms if arch.qk_norm else 0)
    norms = block_param_groups(arch, moe=moe)["norms"] * h * (FP32_BYTES // shape.d if arch.fp32_norm_scale else 1)
    rows = 0  # the routed experts' rows: their gate_up ([rows, 2f]) and down ([rows, hidden]) outputs' gradients
    if arch.style == "gpt":  # c_fc, c_proj
        mlp = arch.intermediate_size // t + h
    elif not moe:  # gate, up, down
        mlp = 2 * (arch.intermediate_size // t) + h
    else:  # the router's logits, the shared experts' gate, up and down, Qwen2-MoE's shared-expert gate
        rows = arch.num_experts * formulas.expert_tokens(arch, shape) * (2 * (arch.moe_intermediate_size // t) + h)
        shared = arch.num_shared_experts * arch.shared_intermediate_size // t
        mlp = arch.num_experts + (2 * shared + h if shared else 0) + (1 if arch.shared_expert_gate else 0)
    passed_on = 0 if moe or arch.post_norms or (arch.style == "gpt" and arch.drops_residual) else h  # the incoming
    return (shape.tokens * (attention + norms + mlp - passed_on) + rows) * shape.d


def split_bytes(arch: Arch, shape: Shape, *, moe: bool, param_count: int, transient_bytes: int,
                rerun_peak_bytes: int, weight_reruns: int) -> dict[str, int | None]:
    """A block's split backward bytes (LayerProfile's split fields) for an option whose rerun (none: 0) peaks at
    `rerun_peak_bytes`, `weight_reruns` times in the weight pass (its region's parameter groups), bounds from
    torch 2.13's _backward.py where the measured and fake profiles run it:
    - held: saved_output_grad_bytes;
    - the input pass's peak: the plain backward's (`transient_bytes`, analytic_scratch.block_transient_bytes:
      it frees each group's output gradient where the input pass keeps it) plus held, plus the rerun;
    - the weight pass's peak: every group's fresh weight gradient at once (`autograd.grad`'s result, added into
      .grad after: the whole block's, in the weights' dtype, above the two groups a weight pass holds at once),
      a norm weight's gradient's [tokens, hidden] product before its sum over the tokens (fp32 at most), and
      each group's rerun, all alive to the pass's end (a call's recomputed tensors outlive it: measured, §889);
    - its first group's peak: the whole pass's (unrecorded, None); what it carries to the next layer's: none's
      unrecorded (planner/cost/wgroups.py: the whole weight gradient less held), an option rerunning in the
      weight pass the whole weight gradient and its reruns, the reruns staying to the stage's pass's end (§890)."""
    held = saved_output_grad_bytes(arch, shape, moe=moe)
    norm_product = shape.tokens * arch.hidden_size * FP32_BYTES
    reruns = weight_reruns * rerun_peak_bytes
    return {"split_held_bytes": held, "split_input_peak_bytes": transient_bytes + held + rerun_peak_bytes,
            "split_peak_bytes": param_count * shape.d + norm_product + reruns,
            "split_first_peak_bytes": None, "split_carry_bytes": param_count * shape.d + reruns if reruns else None,
            "split_left_bytes": reruns}


def with_split_bytes(options: list, arch: Arch, shape: Shape, *, moe: bool, param_count: int,
                     transient_bytes: int) -> list:
    """A block's options, each that torch's split can run (runs_split_backward) with its split_bytes. Offload's
    copies (its recompute_peak_bytes) come back as the input pass starts and stay until the weight pass has run
    (its nodes hold them): held as well, not a weight-pass rerun."""
    def fields(option) -> dict:
        rerun = 0 if option.name == OPTION_NONE else option.recompute_peak_bytes
        if option.name == OPTION_OFFLOAD:
            found = split_bytes(arch, shape, moe=moe, param_count=param_count, transient_bytes=transient_bytes,
                                rerun_peak_bytes=rerun, weight_reruns=0)
            return {**found, "split_held_bytes": found["split_held_bytes"] + rerun}
        return split_bytes(arch, shape, moe=moe, param_count=param_count, transient_bytes=transient_bytes,
                           rerun_peak_bytes=rerun, weight_reruns=weight_reruns(option.name))

    every = sum(block_param_groups(arch, moe=moe).values())

    def weight_reruns(name: str) -> int:  # the parameter groups whose weight-pass call reruns the region:
        if name == OPTION_NONE:  # a part with no region here (op-sac: torch's policy over the block) all of them
            return 0
        parts = [] if name == OPTION_FULL else name.split(",")
        if any(part not in REGIONS for part in parts) or not parts:
            return every
        return sum(region_groups(arch, part, moe=moe) for part in parts)

    return [option.model_copy(update=fields(option)) if runs_split_backward(option.name) else option
            for option in options]
