"""The host's time to issue a Megatron-core dense block's forward and backward, as multiples of one torch
Linear forward: a measurement on the machine this runs on (CPU tensors, tiny shapes, so each op's time is its
dispatch, not its arithmetic), anchored by the cost model to the published CPU time of one Linear forward on the
GPU's host (GPU.host_call_us: TransformerEngine#2053, 13.48 µs on a DGX H100's Xeon 8480C).

The replica is Megatron-core's TE layer spec dense block as the G rows run it (Megatron-LM 6e091e1b:
megatron/core/transformer/transformer_layer.py `_forward_attention`, `_forward_mlp`; attention.py
`SelfAttention.get_query_key_value_tensors`; mlp.py `MLP.forward`; fusions/fused_bias_dropout.py,
fused_bias_gelu.py; jit.py: `jit_fuser = torch.compile` on torch >= 2.2):

  linear_qkv (TE LayerNormColumnParallelLinear: one module, here an nn.Linear with its bias)
  mixed_qkv.view, split along the last dim (TE's SplitAlongDim: torch.split here), query.reshape
  core_attention (TEDotProductAttention: one module, here sbhd -> bhsd permutes + F.scaled_dot_product_attention)
  linear_proj (TERowParallelLinear, skip_bias_add: its bias returned beside the output)
  self_attn_bda (bias_dropout_add_fused_train, torch.compile'd: x + bias, dropout 0.1, + residual)
  linear_fc1 (TE LayerNormColumnParallelLinear, skip_bias_add), bias_gelu_impl (GeLUFunction, an
  autograd.Function around the compiled bias_gelu / bias_gelu_back), linear_fc2, mlp_bda (compiled)

A third replica is a MoE block (MoEBlock: the dense block's attention half, then Megatron-core's MoELayer with the
alltoall dispatcher, `--moe-router-fusion`, `--moe-permute-fusion` and TE's GroupedLinear, Megatron-LM 0014f137;
docs/framework-facts.md §94): each TE fused kernel one op each way (_OneKernel), the split sizes' host copy
(`.tolist()`), the all-to-alls left out (collectives: not run here).

A fourth is a latent-attention block (MLABlock: Megatron-core's TE spec with MLASelfAttention, Megatron-LM d98e8a64;
docs/framework-facts.md §882), with either attention stand-in.

Each TE module stands for one torch Linear (or SDPA) call: TransformerEngine#2126 (2026-01-03) reads the BF16
TE Linear's CPU overhead as "nearly the same with vanilla torch linear"; a stand-in, not TE's own code.

Prints, per part, the forward's and the backward's median time per call, its spread over repeats (noise), the
aten ops the part dispatches eager (TorchDispatchMode), and each as a multiple of the Linear forward: the least
of the repeats' medians over the Linear's least (the host's own time; the rest is other work on a shared machine),
beside the per-repeat ratios' median and range (the noise). Run:
    PYTHONPATH=$PWD python scripts/bench_host.py [--repeats 7] [--calls 400] [--eager] [--only "MLA,dense block"]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

S, B, H, HEADS, FFN = 8, 2, 32, 4, 128  # tiny: dispatch, not arithmetic


def _bias_dropout_add(x, bias, residual, prob: float):  # fused_bias_dropout.py _bias_dropout_add_func, training
    return residual + F.dropout(x + bias, p=prob, training=True)


def _bias_gelu(bias, y):  # fused_bias_gelu.py
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def _bias_gelu_back(g, bias, y):
    x = bias + y
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g


FUSED = {"bda": _bias_dropout_add, "gelu": _bias_gelu, "gelu_back": _bias_gelu_back}


class GeLUFunction(torch.autograd.Function):  # fused_bias_gelu.py GeLUFunction
    @staticmethod
    def forward(ctx, inp, bias):
        ctx.save_for_backward(inp, bias)
        return FUSED["gelu"](bias, inp)

    @staticmethod
    def backward(ctx, grad_output):
        inp, bias = ctx.saved_tensors
        tmp = FUSED["gelu_back"](grad_output, bias, inp)
        return tmp, tmp


class Attention(nn.Module):  # TEDotProductAttention's stand-in, sbhd in and out
    def forward(self, q, k, v):
        s, b = q.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class _CausalSoftmax(torch.autograd.Function):  # TE's ScaledUpperTriangMaskedSoftmax: one fused kernel each way
    @staticmethod
    def forward(ctx, scores, scale: float):
        sq, sk = scores.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool).triu(1)
        probs = torch.softmax((scores * scale).masked_fill(mask, float("-inf")), dim=-1)
        ctx.save_for_backward(probs)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, probs, -1, probs.dtype) * ctx.scale, None


class UnfusedAttention(nn.Module):
    """TE's UnfusedDotProductAttention, sbhd (--attention-backend unfused; TransformerEngine f8a01cd5
    attention/dot_product_attention/backends.py 366-640): torch.empty for the scores, q/k reshaped, baddbmm (beta 0,
    alpha 1/sqrt(d)), view, FusedScaleMaskSoftmax's causal kernel (one autograd Function here), attention dropout,
    v reshaped, probs viewed, bmm, view, permute + contiguous, view. Not replicated: the dropout's RNG tracker fork
    (Megatron's get_cuda_rng_tracker().fork(), CUDA RNG state swaps)."""

    def forward(self, q, k, v):
        sq, b, heads, hn = q.shape
        sk = k.shape[0]
        out = torch.empty(b * heads, sq, sk)
        q2, k2 = q.reshape(sq, b * heads, -1), k.reshape(sk, b * heads, -1)
        scores = torch.baddbmm(out, q2.transpose(0, 1), k2.transpose(0, 1).transpose(1, 2), beta=0.0,
                               alpha=hn ** -0.5).view(b, heads, sq, sk)
        probs = F.dropout(_CausalSoftmax.apply(scores, 1.0), p=0.1, training=True)
        v2 = v.reshape(sk, b * heads, -1)
        ctx = torch.bmm(probs.view(b * heads, sq, -1), v2.transpose(0, 1)).view(b, heads, sq, v.shape[-1])
        return ctx.permute(2, 0, 1, 3).contiguous().view(sq, b, -1)


class Block(nn.Module):
    def __init__(self, attention: nn.Module | None = None):
        super().__init__()
        self.linear_qkv = nn.Linear(H, 3 * H)
        self.core_attention = attention or Attention()
        self.linear_proj = nn.Linear(H, H, bias=False)
        self.proj_bias = nn.Parameter(torch.zeros(H))
        self.linear_fc1 = nn.Linear(H, FFN, bias=False)
        self.fc1_bias = nn.Parameter(torch.zeros(FFN))
        self.linear_fc2 = nn.Linear(FFN, H, bias=False)
        self.fc2_bias = nn.Parameter(torch.zeros(H))

    def attention_half(self, x):
        """linear_qkv, the q/k/v views, core attention, linear_proj and its bias-dropout-add."""
        hn = H // HEADS
        mixed = self.linear_qkv(x).view(S, B, HEADS, 3 * hn)
        q, k, v = torch.split(mixed, [hn, hn, hn], dim=3)
        q = q.reshape(q.size(0), q.size(1), -1, hn)
        ctx = self.core_attention(q, k, v)
        return FUSED["bda"](self.linear_proj(ctx), self.proj_bias, x, 0.1)

    def forward(self, x):
        x = self.attention_half(x)
        inter = GeLUFunction.apply(self.linear_fc1(x), self.fc1_bias)
        return FUSED["bda"](self.linear_fc2(inter), self.fc2_bias, x, 0.1)


EXPERTS, TOPK, LOCAL = 8, 2, 4  # a MoE block's router width, top-k, and the rank's local experts (EP 2)


def _weighted_swiglu(y, probs):  # fused_bias_swiglu.py weighted_bias_swiglu_impl's function (jit_fuser)
    gate, up = torch.chunk(y, 2, -1)
    return (F.silu(gate) * up * probs).to(y.dtype)


FUSED["wswiglu"] = _weighted_swiglu


class _OneKernel(torch.autograd.Function):
    """A TE fused kernel each way (the top-k router, the permute / sort / unpermute): one op forward and one
    backward, as TE's autograd Functions call one tex / Triton kernel each (router.py FusedTopkScoreFunction,
    permutation.py _moe_permute_mask_map / _moe_unpermute_mask_map / _moe_chunk_sort)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.rows = x.size(0)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, grad.size(1)).index_add_(0, index, grad), None


class MoEBlock(Block):
    """The dense block's attention half, then Megatron-core's MoELayer with the alltoall dispatcher and
    TEGroupedMLP, fused router and permute (megatron/core/transformer/moe/moe_layer.py, router.py TopKRouter,
    token_dispatcher.py MoEAlltoAllTokenDispatcher, experts.py TEGroupedMLP, Megatron-LM 0014f137): the router
    Linear, the fused top-k, the split sizes (routing_map.sum, the host copy of tokens_per_expert / input and
    output splits: `.tolist()`), permutation 1, the all-to-all (a collective: not run here, its issue left out),
    permutation 2 (sort by local expert), linear_fc1 (TE GroupedLinear: torch.split by m_splits and one grouped
    GEMM, here the split and one Linear), the weighted SwiGLU (compiled), linear_fc2 the same, the unsort,
    unpermutation 1 and the mlp_bda (compiled)."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(H, EXPERTS, bias=False)
        self.fc1 = nn.Linear(H, 2 * FFN, bias=False)
        self.fc2 = nn.Linear(FFN, H, bias=False)

    def forward(self, x):
        x = self.attention_half(x)
        tokens = x.view(-1, H)
        logits = self.router(tokens)
        probs, top = torch.topk(logits, TOPK)  # TE's fused top-k with its score function: one kernel
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
        tokens_per_expert = routing_map.sum(0)
        splits = tokens_per_expert.tolist()  # the dispatcher's device-to-host copy (its sync on a GPU)
        index = top.reshape(-1)
        permuted = _OneKernel.apply(tokens, index % tokens.size(0))
        weights = probs.reshape(-1, 1)
        local = _OneKernel.apply(permuted, torch.arange(permuted.size(0)))  # permutation 2
        chunks = torch.split(local, [local.size(0) // LOCAL] * LOCAL)  # TE GroupedLinear's split by m_splits
        inter = FUSED["wswiglu"](self.fc1(torch.cat(chunks)), weights)
        out = self.fc2(torch.cat(torch.split(inter, [inter.size(0) // LOCAL] * LOCAL)))
        out = _OneKernel.apply(out, torch.arange(out.size(0)))  # unsort
        merged = _OneKernel.apply(out, torch.arange(out.size(0)))[: tokens.size(0)]  # unpermutation 1
        del splits
        return FUSED["bda"](merged.view(S, B, H), self.fc2_bias, x, 0.1)


# a latent attention's ranks and head dims (tiny); v as wide as q/k so that the SDPA stand-in runs one kernel (on
# CPU unequal widths take its op-by-op math path; TE's fused attention is one call at any widths)
Q_LORA, KV_LORA, QK_HEAD, QK_POS, V_HEAD = 12, 8, 4, 2, 6


@functools.lru_cache(maxsize=32)
def _yarn(seq_len: int):  # YarnRotaryEmbedding.forward, lru_cache'd (yarn_rotary_pos_embedding.py 159-161)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), torch.ones(QK_POS))
    return freqs[:, None, None, :], 1.0


def _rotary(t, freqs, mscale: float):
    """rope_utils.py _apply_rotary_pos_emb_bshd under mla_rotary_interleaved (apply_rope_fusion off), with
    _rotate_half not interleaved."""
    freqs = freqs.squeeze(-2) if freqs.dim() == t.dim() + 1 and freqs.size(-2) == 1 else freqs
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t = torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1)
    cos_, sin_ = (torch.cos(freqs) * mscale).to(t.dtype), (torch.sin(freqs) * mscale).to(t.dtype)
    x1, x2 = torch.chunk(t, 2, dim=-1)
    t = (t * cos_) + (torch.cat((-x2, x1), dim=-1) * sin_)
    return torch.cat((t, t_pass), dim=-1)


class MLABlock(Block):
    """Megatron-core's TE layer spec with multi-latent attention, mla_down_proj_fusion off, no --qk-layernorm
    (gpt_layer_specs.py 244-318, multi_latent_attention.py MLASelfAttention 298-470, 638-1003, Megatron-LM d98e8a64;
    docs/framework-facts.md §882): input_layernorm (TENorm, its own module), the yarn rotary table (an lru_cache'd
    call), linear_q_down_proj and linear_kv_down_proj (TELinear), the latent split, q_layernorm and kv_layernorm
    (IdentityOp modules), linear_q_up_proj and linear_kv_up_proj (TEColumnParallelLinear), the q / kv views, the
    k_pos_emb unsqueeze, the table's slice, the q and kv splits, rotary on q's and k's positional parts unfused
    (apply_rope_fusion is off under --position-embedding-type learned_absolute: arguments.py 1628-1629), the query
    cat, k_pos_emb's expand, the key cat, three .contiguous(), the core attention (the dense block's stand-ins),
    linear_proj and its bias-dropout-add; then the dense block's MLP. Not run: k_pos_emb's gather from the
    sequence-parallel region (a collective: its issue counted apart, planner/cost/hostcalls.py)."""

    def __init__(self, attention: nn.Module | None = None):
        super().__init__(attention)
        self.input_layernorm = nn.LayerNorm(H)
        self.linear_q_down_proj = nn.Linear(H, Q_LORA, bias=False)
        self.linear_kv_down_proj = nn.Linear(H, KV_LORA + QK_POS, bias=False)
        self.q_layernorm, self.kv_layernorm = nn.Identity(), nn.Identity()
        self.linear_q_up_proj = nn.Linear(Q_LORA, HEADS * (QK_HEAD + QK_POS), bias=False)
        self.linear_kv_up_proj = nn.Linear(KV_LORA, HEADS * (QK_HEAD + V_HEAD), bias=False)
        self.linear_proj = nn.Linear(HEADS * V_HEAD, H, bias=False)

    def attention_half(self, x):
        hidden = self.input_layernorm(x)
        freqs, mscale = _yarn(S)
        q_compressed = self.linear_q_down_proj(hidden)
        kv_combined = self.linear_kv_down_proj(hidden)
        kv_compressed, k_pos_emb = torch.split(kv_combined, [KV_LORA, QK_POS], dim=-1)
        q_compressed, kv_compressed = self.q_layernorm(q_compressed), self.kv_layernorm(kv_compressed)
        q = self.linear_q_up_proj(q_compressed)
        q = q.view(*q.size()[:-1], HEADS, QK_HEAD + QK_POS)
        kv = self.linear_kv_up_proj(kv_compressed)
        kv = kv.view(*kv.size()[:-1], HEADS, QK_HEAD + V_HEAD)
        k_pos_emb = torch.unsqueeze(k_pos_emb, -2)
        freqs = freqs[0:q.size(0)]
        q_no_pe, q_pos_emb = torch.split(q, [QK_HEAD, QK_POS], dim=-1)
        k_no_pe, value = torch.split(kv, [QK_HEAD, V_HEAD], dim=-1)
        q_pos_emb, k_pos_emb = _rotary(q_pos_emb, freqs, mscale), _rotary(k_pos_emb, freqs, mscale)
        query = torch.cat([q_no_pe, q_pos_emb], dim=-1)
        key = torch.cat([k_no_pe, k_pos_emb.expand(-1, -1, HEADS, -1)], dim=-1)
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
        ctx = self.core_attention(query, key, value)
        return FUSED["bda"](self.linear_proj(ctx), self.proj_bias, x, 0.1)


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


STAT = {"per_repeat": statistics.median}  # --fastest: min, the call no other process interrupted (a loaded machine)


def _time(fn, calls: int) -> float:
    """µs a call, the median (--fastest: the least) over `calls` timed one by one (fn returns the seconds it timed)."""
    return STAT["per_repeat"](fn() for _ in range(calls)) * 1e6


def parts():
    """(name, forward(x) -> out, input maker): each part's forward on fresh inputs that need a gradient."""
    torch.manual_seed(0)
    _yarn(S)  # the rotary table built before any count or timing, as Megatron's lru_cache holds it across steps
    block = Block()
    unfused = Block(UnfusedAttention())
    lin = nn.Linear(H, H)
    hn = H // HEADS

    def x_in():
        return torch.randn(S, B, H, requires_grad=True)

    def ffn_in():
        return torch.randn(S, B, FFN, requires_grad=True)

    def qkv_in():
        return tuple(torch.randn(S, B, HEADS, hn, requires_grad=True) for _ in range(3))

    def glue(x):
        mixed = block.linear_qkv(x).view(S, B, HEADS, 3 * hn)
        q, k, v = torch.split(mixed, [hn, hn, hn], dim=3)
        return q.reshape(q.size(0), q.size(1), -1, hn)

    return [
        ("torch Linear (the unit)", lin, x_in),
        ("core_attention stand-in", lambda t: block.core_attention(*t), qkv_in),
        ("bias-dropout-add", lambda t: FUSED["bda"](t, block.proj_bias, t, 0.1), x_in),
        ("bias-gelu (GeLUFunction)", lambda t: GeLUFunction.apply(t, block.fc1_bias), ffn_in),
        ("linear_qkv + view/split/reshape", glue, x_in),
        ("dense block (TE spec replica)", block, x_in),
        ("unfused attention (TE's UnfusedDotProductAttention)", lambda t: unfused.core_attention(*t), qkv_in),
        ("dense block, unfused attention", unfused, x_in),
        ("MoE block (alltoall dispatcher, fused router and permute)", MoEBlock(), x_in),
        ("MLA block (latent attention, TE spec)", MLABlock(), x_in),
        ("MLA block, unfused attention", MLABlock(UnfusedAttention()), x_in),
    ]


def measure(fwd, make, calls: int) -> tuple[float, float]:
    def one_fwd():
        inp = make()
        t0 = time.perf_counter()
        fwd(inp)
        return time.perf_counter() - t0

    def one_bwd():
        out = fwd(make())
        grad = torch.ones_like(out)
        t0 = time.perf_counter()
        out.backward(grad)
        return time.perf_counter() - t0

    for _ in range(20):  # warm-up (compiles, caches)
        one_fwd(), one_bwd()
    return _time(one_fwd, calls), _time(one_bwd, calls)


def count_ops(fwd, make) -> tuple[int, int]:
    inp = make()
    with _Count() as c:
        out = fwd(inp)
    f = c.ops
    with _Count() as c:
        out.backward(torch.ones_like(out))
    return f, c.ops


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--eager", action="store_true", help="leave Megatron's jit_fuser functions uncompiled")
    ap.add_argument("--only", default="", help="comma-separated words: time the parts whose names hold one (and "
                    "the unit Linear); default: every part")
    ap.add_argument("--fastest", action="store_true", help="each repeat's fastest call, not its median: on a "
                    "machine other processes load, the calls none interrupted")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    STAT["per_repeat"] = min if args.fastest else statistics.median
    words = [w for w in args.only.split(",") if w]
    rows = [row for i, row in enumerate(parts()) if not i or not words or any(w in row[0] for w in words)]
    # aten ops counted eager (a compiled function's graph runs as one kernel a device; counted op by op here)
    counts = {name: count_ops(fwd, make) for name, fwd, make in rows}
    if not args.eager:
        for name in list(FUSED):
            FUSED[name] = torch.compile(FUSED[name])
    samples = {name: [] for name, _, _ in rows}
    for _ in range(args.repeats):  # interleaved repeats: drift on a shared machine spreads over every part
        for name, fwd, make in rows:
            samples[name].append(measure(fwd, make, args.calls))
    unit = [f for f, _ in samples[rows[0][0]]]
    print(f"torch {torch.__version__}, {'eager' if args.eager else 'compiled'} fused functions, "
          f"{'fastest call' if args.fastest else 'median'} a repeat, "
          f"{args.repeats} repeats x {args.calls} calls, S={S} B={B} H={H} heads={HEADS} ffn={FFN}")
    print("| part | eager aten ops fwd / bwd | fwd µs, least (median) | bwd µs, least (median) | fwd / Linear fwd "
          "| bwd / Linear fwd | per-repeat ratios fwd, bwd: median (min-max) |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _ in rows:
        fs = [f for f, _ in samples[name]]
        bs = [b for _, b in samples[name]]
        rf = [f / u for f, u in zip(fs, unit)]
        rb = [b / u for b, u in zip(bs, unit)]
        # the least of the repeats' medians: the time the host needs, the rest other work on a shared machine
        print(f"| {name} | {counts[name][0]} / {counts[name][1]} | {min(fs):.1f} ({statistics.median(fs):.1f}) | "
              f"{min(bs):.1f} ({statistics.median(bs):.1f}) | {min(fs) / min(unit):.2f} | {min(bs) / min(unit):.2f} | "
              f"{statistics.median(rf):.2f} ({min(rf):.2f}-{max(rf):.2f}), "
              f"{statistics.median(rb):.2f} ({min(rb):.2f}-{max(rb):.2f}) |")

if __name__ == "__main__":
    main()
