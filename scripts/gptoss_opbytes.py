"""The bytes GPT-OSS's memory-bound pieces move per element, counted op by op by ckplan's fake profiler
(planner/profiler/fake.py OpBytes) on torchtitan b5bcd76c's code, copied here as it reads (gpt_oss/moe.py swiglu,
gpt_oss/model.py apply_attention_sink_rescale; the expert's bias adds as GptOssGroupedExperts.forward makes them),
against SiLU's SwiGLU (torchtitan's GroupedExperts: silu(x1) * x3). Prints bytes per element of the f-wide
tensors (the SwiGLUs), per element of the (tokens, heads, head_dim) output (the sinks), forward and backward.

    PYTHONPATH=$PWD python scripts/gptoss_opbytes.py
"""

import torch
import torch.nn.functional as F

from planner.profiler.fake import OpBytes

ROWS, F_WIDTH, HEADS, HEAD_DIM = 4096, 256, 8, 64  # GPT-OSS's head_dim


def swiglu(x, alpha: float = 1.702, limit: float = 7.0):  # torchtitan b5bcd76c gpt_oss/moe.py
    x_glu, x_linear = x[..., ::2], x[..., 1::2]
    x_glu = x_glu.clamp(min=None, max=limit)
    x_linear = x_linear.clamp(min=-limit, max=limit)
    out_glu = x_glu * torch.sigmoid(alpha * x_glu)
    return torch.addcmul(out_glu, out_glu, x_linear)


def sink_rescale(out, lse, sinks):  # torchtitan b5bcd76c gpt_oss/model.py apply_attention_sink_rescale
    sinks = sinks.view(*([1] * (lse.ndim - 1)), -1)
    sink_scale = torch.sigmoid(lse - sinks).unsqueeze(-1)
    return out * sink_scale.to(out.dtype)


def expert_bias(h, bias, counts):  # torchtitan b5bcd76c gpt_oss/moe.py GptOssGroupedExperts.forward's b1 and b2
    padded = torch.cat([bias, bias.new_zeros(1, bias.shape[-1])])
    per_row = padded.repeat_interleave(counts, dim=0, output_size=h.shape[0])
    return h + per_row.to(h.dtype)


def counted(fn, *inputs):
    with OpBytes() as forward:
        out = fn(*inputs)
    grad = torch.ones_like(out)
    with OpBytes() as backward:
        out.backward(grad)
    return forward.bytes, backward.bytes


def main() -> None:
    bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
    gate_up = torch.randn(ROWS, 2 * F_WIDTH, **bf16)
    fwd, bwd = counted(swiglu, gate_up)
    print(f"clamped SwiGLU: {fwd / (ROWS * F_WIDTH):g} B forward, {bwd / (ROWS * F_WIDTH):g} B backward per element of f")
    x1, x3 = torch.randn(ROWS, F_WIDTH, **bf16), torch.randn(ROWS, F_WIDTH, **bf16)
    fwd, bwd = counted(lambda a, b: F.silu(a) * b, x1, x3)
    print(f"SiLU SwiGLU: {fwd / (ROWS * F_WIDTH):g} B forward, {bwd / (ROWS * F_WIDTH):g} B backward per element of f")
    experts = 4
    h = torch.randn(ROWS, 2 * F_WIDTH, **bf16)
    bias = torch.randn(experts, 2 * F_WIDTH, **bf16)
    counts = torch.tensor([ROWS // experts] * experts + [0])
    fwd, bwd = counted(expert_bias, h, bias, counts)
    print(f"an expert's bias add: {fwd / h.numel():g} B forward, {bwd / h.numel():g} B backward per element of its output")
    x = torch.randn(ROWS, F_WIDTH, **bf16)
    weight, with_bias = torch.randn(F_WIDTH, F_WIDTH, **bf16), torch.randn(F_WIDTH, **bf16)
    plain = counted(lambda a, w: F.linear(a, w), x, weight)
    biased = counted(lambda a, w, b: F.linear(a, w, b), x, weight, with_bias)
    print(f"a linear's bias: {(biased[0] - plain[0]) / (ROWS * F_WIDTH):g} B forward, "
          f"{(biased[1] - plain[1]) / (ROWS * F_WIDTH):g} B backward per element of its output (beyond the linear)")
    out = torch.randn(ROWS, HEADS, HEAD_DIM, **bf16)
    lse = torch.randn(ROWS, HEADS, dtype=torch.float32, requires_grad=True)
    sinks = torch.randn(HEADS, dtype=torch.float32, requires_grad=True)
    fwd, bwd = counted(sink_rescale, out, lse, sinks)
    print(f"sinks' rescale: {fwd / out.numel():g} B forward, {bwd / out.numel():g} B backward per output element "
          f"(head_dim {HEAD_DIM}; per token and head: {fwd / (ROWS * HEADS):g} and {bwd / (ROWS * HEADS):g})")


if __name__ == "__main__":
    main()
