"""The bytes a Megatron-core MoE block's eager pieces around Transformer Engine's kernels move per element, counted
op by op by ckplan's fake profiler (planner/profiler/fake.py OpBytes) on megatron-core 92c8482e's code (Megatron-Bridge
25.11's pin), copied here as it reads (planner/profiler/te_moe_eager.py has each figure's source):
- GPT-OSS's clamp: fusions/fused_bias_geglu.py `weighted_bias_quick_geglu_impl`'s chunk, two clamps and cat (the
  compiled weighted GLU after them is te_moe.py's), per element of the f-wide GLU half;
- linear_fc2's bias: transformer/moe/experts.py `TEGroupedMLP._apply_bias`, per element of the h-wide output;
- the unfused rotary Megatron-core runs where the YaRN concentration factor is not 1 (GPT-OSS's):
  models/common/embeddings/rope_utils.py `_apply_rotary_pos_emb_bshd` with `_rotate_half`, per element of Q or K.

    PYTHONPATH=$PWD python scripts/megatron_moe_opbytes.py
"""

import torch

from planner.profiler.fake import OpBytes

ROWS, F_WIDTH, HIDDEN, EXPERTS, LIMIT = 4096, 256, 128, 4, 7.0


def clamp_cat(x, clamp_value: float = LIMIT):  # fused_bias_geglu.py weighted_bias_quick_geglu_impl, 92c8482e
    x_glu, x_linear = x.chunk(2, -1)
    return torch.cat((x_glu.clamp(min=None, max=clamp_value), x_linear.clamp(min=-clamp_value, max=clamp_value)), -1)


def apply_bias(intermediate_parallel, bias_parallel, tokens_per_expert, permuted_probs):  # experts.py, 92c8482e
    shape = intermediate_parallel.shape
    return (
        torch.cat([t + b * p for t, b, p in zip(torch.split(intermediate_parallel.view(-1, shape[-1]),
                                                            tokens_per_expert),
                                                bias_parallel, torch.split(permuted_probs, tokens_per_expert))])
        .view(shape).to(intermediate_parallel.dtype))


def rotate_half(x):  # rope_utils.py _rotate_half, rotary_interleaved False, 92c8482e
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary_bshd(t, freqs, mscale: float = 1.3466):  # rope_utils.py _apply_rotary_pos_emb_bshd, 92c8482e
    rot_dim = freqs.shape[-1]
    t, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos_ = (torch.cos(freqs) * mscale).to(t.dtype)
    sin_ = (torch.sin(freqs) * mscale).to(t.dtype)
    t = (t * cos_) + (rotate_half(t) * sin_)
    return torch.cat((t, t_pass), dim=-1)


def counted(fn, *inputs):
    with OpBytes() as forward:
        out = fn(*inputs)
    grad = torch.ones_like(out)
    with OpBytes() as backward:
        out.backward(grad)
    return forward.bytes, backward.bytes


def main() -> None:
    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = counted(clamp_cat, torch.randn(ROWS, 2 * F_WIDTH, **bf16))
    print(f"clamp and cat: {fwd / (ROWS * F_WIDTH):g} B forward, {bwd / (ROWS * F_WIDTH):g} B backward per element of f")
    out = torch.randn(ROWS, HIDDEN, **bf16)
    biases = [torch.randn(HIDDEN, **bf16) for _ in range(EXPERTS)]
    probs = torch.rand(ROWS, 1, **bf16)
    fwd, bwd = counted(lambda o, p, *b: apply_bias(o, list(b), [ROWS // EXPERTS] * EXPERTS, p), out, probs, *biases)
    print(f"linear_fc2's weighted bias: {fwd / out.numel():g} B forward, {bwd / out.numel():g} B backward per element "
          f"of the output ({EXPERTS} experts of {ROWS // EXPERTS} rows, h {HIDDEN})")
    seq, heads, dim = 512, 256, 64  # [s, b, heads, d] as Megatron's attention holds Q and K; freqs [s, 1, 1, d] fp32
    q = torch.randn(seq, 1, heads, dim, **bf16)
    freqs = torch.randn(seq, 1, 1, dim, dtype=torch.float32)
    fwd, bwd = counted(rotary_bshd, q, freqs)
    print(f"unfused rotary: {fwd / q.numel():g} B forward, {bwd / q.numel():g} B backward per element of Q or K "
          f"({heads} heads: the cos/sin tables per position are 1/{heads} of it)")


if __name__ == "__main__":
    main()
