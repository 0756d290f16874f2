"""torchtitan's op-level selective activation checkpointing as a recompute option of an analytic
LLaMA block (`op-sac`): dense GQA blocks, and (§74 of docs/framework-facts.md) the mixture-of-experts
and latent-attention blocks of its Qwen3 MoE and DeepSeek-V3 models.

The policy (torchtitan 9dec370 torchtitan/parallelisms/parallelize_llama.py 214-260; b5bcd76c
torchtitan/distributed/activation_checkpoint.py 31-94 and 243-287): the whole block is wrapped in
torch's selective checkpoint; the outputs of the save ops are saved, every other op is rerun in the
backward, and of `aten.mm` (or `aten.linear`) only every second one is saved: a per-block counter
(a fresh dict per checkpointed call, 244) counts the mms, and an mm whose count is even is
recomputed (271). The save ops (31-94): torch's partitioner's compute-intensive ops (aten.mm, addmm,
bmm, _scaled_mm, the SDPA flash / efficient kernels: `get_default_op_list`, torch 2.13; not
aten._grouped_mm), SDPA cudnn / math, flex_attention, aten.max, aten.topk,
_c10d_functional.reduce_scatter_tensor and all_to_all_single. An mm whose weight has the shape of a
linear named in force_recompute_mm_shapes_by_fqns (default ["moe.router.gate"], 196-198) is
recomputed and not counted (265-267).

The mm order per block (torchtitan b5bcd76c): a GQA attention wq, wk, wv, wo (models/llama3,
models/qwen3 model.py); a latent attention (models/deepseek_v3/model.py 102-151) wq, or wq_a then
wq_b, then wkv_a, wkv_b, wo; then a dense FeedForward w1, w3, w2 (w2(silu(w1(x)) * w3(x))) or the
MoE (models/common/moe.py 396-453): the router's gate (forced recompute, uncounted), the routed
experts' three torch._grouped_mm (94-107: not saved, not counted), then the shared experts'
FeedForward w1, w3, w2 (counted). So a dense LLaMA block keeps wq 1, wv 3, w1 5, w2 7; a Qwen3 MoE
block wq and wv; a DeepSeek-V2-Lite-shaped block (no q latent) wq 1, wkv_b 3 and the shared w1 5,
w2 7; a DeepSeek-V3 block (q latent) wq_a 1, wkv_a 3, wo 5, the shared w3 7. Beside the mm outputs
a block keeps its input (the checkpoint's), the attention's output and logsumexp, the router's
top-k values (fp32) and indices (int64), and with TP + SP the two reduce-scatters' outputs. Its
backward reruns the rest: the other mms, the router's gate, the routed experts' grouped mms, and
every memory-bound op (torchtitan sets no early stop: the whole forward reruns), the rerun holding
what the block keeps without checkpointing, less what it keeps here.

GPT-OSS (torchtitan b5bcd76c models/gpt_oss): Q, K and V one fused linear (wqkv), and every linear but the
experts' has a bias, so on its [tokens, dim] activations F.linear runs as aten.addmm: a compute-intensive op the
policy saves always, outside the mm count (which counts aten.mm and aten.linear) and outside the forced
recompute of the router's gate (checked for those two only). So its block keeps wqkv's and wo's outputs and the
router's logits, and its backward reruns only the routed experts' grouped mms and the memory-bound ops (the
sinks' rescale among them).

Left out: under expert parallelism the two all_to_all_single outputs (the dispatched tokens and the
combined outputs) are saved too; the per-layer profile knows no expert parallelism (analytic.py), so
they are not in the kept bytes. The routing's device-to-host copies are saved on the host.
"""

from __future__ import annotations

from planner.models.archs import GPU, Arch
from planner.profiler import analytic_time
from planner.profiler.formulas import INDEX_BYTES, Shape, expert_tokens, kv_width, q_width
from planner.profiler.roofline import Kernel, work
from planner.schema import RecomputeOption

OPTION_OP_SAC = "op-sac"
FP32 = 4


def offers_op_sac(arch: Arch, shape: Shape, *, moe: bool) -> bool:
    """A LLaMA-style block with flash attention (timed so under flex too): GQA or latent attention,
    a dense SwiGLU MLP or the mixture of experts, the blocks torchtitan's models run (none has
    Qwen2-MoE's shared-expert gate, an mm more to count), GPT-OSS's included (its biased linears: _saved_mms)."""
    return arch.style == "llama" and not arch.shared_expert_gate and shape.attention == "flash"


def block_mms(arch: Arch, shape: Shape, *, moe: bool) -> list[tuple[str, int, int]]:
    """The block's counted mms in the order torchtitan runs them (module docstring): (name, input
    width, output width) per token on this device; an output under TP whole before its reduce."""
    t, h = shape.tp, arch.hidden_size
    if arch.mla:
        heads = arch.num_heads // t
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        latent = arch.kv_lora_rank + arch.qk_rope_head_dim
        query = [("wq_a", h, arch.q_lora_rank), ("wq_b", arch.q_lora_rank, heads * qk)] if arch.q_lora_rank \
            else [("wq", h, heads * qk)]
        attention = [*query, ("wkv_a", h, latent),
                     ("wkv_b", arch.kv_lora_rank, heads * (arch.qk_nope_head_dim + arch.v_head_dim)),
                     ("wo", heads * arch.v_head_dim, h)]
    elif arch.attention_sinks:  # GPT-OSS: torchtitan b5bcd76c fuses Q, K and V (gpt_oss/__init__.py fuse_qkv=True)
        q, kv = q_width(arch, shape), kv_width(arch, shape)
        attention = [("wqkv", h, q + 2 * kv), ("wo", q, h)]
    else:
        q, kv = q_width(arch, shape), kv_width(arch, shape)
        attention = [("wq", h, q), ("wk", h, kv), ("wv", h, kv), ("wo", q, h)]
    f = (arch.num_shared_experts * arch.shared_intermediate_size if moe else arch.intermediate_size) // t
    mlp = [("w1", h, f), ("w3", h, f), ("w2", f, h)] if f else []
    return attention + mlp


def _biased(arch: Arch, name: str) -> bool:
    """Whether the linear `name` has a bias: then it runs as aten.addmm on torchtitan's [tokens, dim]
    activations, one of torch's compute-intensive ops the policy saves always, outside its mm count (which
    counts aten.mm and aten.linear only: activation_checkpoint.py 241, 270-279 at b5bcd76c)."""
    return (name in ("wq", "wk", "wv", "wqkv") and arch.qkv_bias) or (name == "wo" and arch.o_bias)


def _saved_and_rerun(arch: Arch, shape: Shape, *, moe: bool) -> tuple[list, list]:
    """The block's mms the policy saves and those its backward reruns: a biased linear saved; of the
    others, counted in order, the odd saved and the even rerun."""
    mms = block_mms(arch, shape, moe=moe)
    counted = [mm for mm in mms if not _biased(arch, mm[0])]
    return [mm for mm in mms if _biased(arch, mm[0])] + counted[::2], counted[1::2]


def _attention_out(arch: Arch, shape: Shape) -> int:
    """The attention kernel's output width (saved with its fp32 logsumexp per head)."""
    return arch.num_heads // shape.tp * arch.v_head_dim if arch.mla else q_width(arch, shape)


def op_sac_kept_bytes(arch: Arch, shape: Shape, boundary: int, *, moe: bool = False) -> int:
    """What the block keeps per microbatch under the policy (the module docstring), its input
    (`boundary`) included."""
    tokens, d = shape.tokens, shape.d
    saved, _ = _saved_and_rerun(arch, shape, moe=moe)  # the biased, and counts 1, 3, 5, ...
    kept = boundary + sum(tokens * out * d for _, _, out in saved)
    if moe and arch.expert_bias:  # GPT-OSS's router gate has a bias: an addmm, saved (not force-recomputed)
        kept += tokens // shape.sp_div * arch.num_experts * d
    kept += tokens * _attention_out(arch, shape) * d + FP32 * (arch.num_heads // shape.tp) * tokens
    if moe:  # the router's top-k: fp32 values and int64 indices per token and choice
        kept += (FP32 + INDEX_BYTES) * tokens * arch.num_experts_per_tok // shape.sp_div
    if shape.sp:
        kept += 2 * boundary  # the two reduce-scatters' outputs
    return kept


def rerun_kernels(arch: Arch, shape: Shape, *, moe: bool) -> list[Kernel]:
    """The mms the backward reruns: the even-counted ones, and in a MoE block the router's gate and
    the routed experts' grouped mms (per expert, as analytic_time times the experts)."""
    tokens = shape.tokens
    kernels = [Kernel("matmul", 2 * tokens * a * b) for _, a, b in _saved_and_rerun(arch, shape, moe=moe)[1]]
    if moe:
        h, width, held = arch.hidden_size, arch.moe_intermediate_size // shape.tp, expert_tokens(arch, shape)
        if not arch.expert_bias:  # a biased gate (GPT-OSS's) is saved, not rerun
            kernels.append(Kernel("matmul", 2 * (tokens // shape.sp_div) * h * arch.num_experts))
        kernels += [Kernel("matmul", 2 * held * h * width)] * (3 * arch.num_experts)
    return kernels


def op_sac_option(arch: Arch, shape: Shape, gpu: GPU, mfu: float | None, *, boundary: int,
                  kept_without: int, moe: bool = False) -> RecomputeOption:
    """The `op-sac` option: kept as above; the rerun timed by the roofline: rerun_kernels, each its
    own kernel, and every memory-bound op of the forward (the norms, rotary, SiLU and product, the
    routing, dispatch and combine, the residual adds: none is a save op, and the whole forward
    reruns); the rerun forward holding what the block keeps without checkpointing beyond what it kept."""
    kernels = rerun_kernels(arch, shape, moe=moe)
    forward, _, _ = analytic_time.block_work(arch, shape, moe=moe)
    rerun = work(sum(k.flops for k in kernels), forward.bytes, kernels, classed=forward.classed)
    kept = op_sac_kept_bytes(arch, shape, boundary, moe=moe)
    return RecomputeOption(name=OPTION_OP_SAC, kept_bytes=kept,
                           recompute_ms=analytic_time.times_ms((rerun,), gpu, mfu)[0],
                           recompute_peak_bytes=max(0, kept_without - kept))
