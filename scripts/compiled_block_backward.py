"""The buffers alive at a compiled torchtitan block's backward peak, read from inductor's wrapper (CPU).

torchtitan 9dec370's TransformerBlock (models/llama/model.py 160-260: RMSNorm over fp32, GQA with repeat_kv before
SDPA, SwiGLU; the rotary product left out: elementwise, fused) at tiny widths, parallelized as 9dec370's apply_tp
plans a block (parallelize_llama.py: SequenceParallel norms, PrepareModuleInput Shard(1) -> Replicate, wq/wk/wv/w1/w3
colwise, wo/w2 rowwise to Shard(1); under --float8 torchao's Float8 styles after convert_to_float8_training) on
torch's `fake` process group of TP ranks in one process, then `torch.compile(block, fullgraph=True)`, one forward
and backward. The backward's wrapper (TORCH_COMPILE_DEBUG's output_code.py) is replayed by
planner/profiler/inductor_buffers.run_call with its inputs' bytes from fx_graph_readable.py and every fallback's
layout from ir_post_fusion.txt, and the buffers live at its peak are printed, each also times SCALE (the widths'
factor squared: the tiny block at 1/64 of the 405B rows' per-rank widths has each T x width tensor 4,096 times
smaller). docs/published-runs.md §37.bwdalloc (torch 2.13, torchao 0.18) and §39.bwd26 (the rows' torch 2.6.0 and
torchao eab345c).

    PYTHONPATH=. [PYTHONPATH=...:<torchao>] python scripts/compiled_block_backward.py \\
        [--tp 8] [--float8] [--ac] [--async-tp] [--dims 256,128,8,2,832,512] [--scale 4096]

--dims: hidden, heads, kv heads, head dim, FFN, tokens (one sequence). --ac wraps the block in checkpoint_wrapper
first (9dec370's apply_ac 'full'); on torch 2.13 with TP it fails in AOTAutograd (a DeviceMesh among the saved), on
2.6.0 it compiles. --async-tp turns on inductor's micro-pipeline TP as 9dec370 does; its fused scaled matmul wants
every weight dimension divisible by 16, so use 1/8 widths (--dims 2048,128,8,16,6656,4096 --scale 64).
"""
import argparse
import glob
import os
import tempfile

DEBUG = tempfile.mkdtemp(prefix="compiled_block_backward_")
os.environ.setdefault("TORCH_COMPILE_DEBUG", "1")
os.environ.setdefault("TORCH_COMPILE_DEBUG_DIR", DEBUG)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from planner.profiler.inductor_buffers import graph_input_bytes, ir_buffer_bytes, run_call  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), 1e-5

    def forward(self, x):
        out = x.float()
        return (out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.wq = nn.Linear(dim, heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        rep = xq.shape[2] // xk.shape[2]  # 9dec370 repeat_kv: expand then reshape (a copy)
        keys = xk.unsqueeze(3).expand(bs, seqlen, xk.shape[2], rep, self.head_dim).reshape(bs, seqlen, -1, self.head_dim)
        values = xv.unsqueeze(3).expand(bs, seqlen, xv.shape[2], rep, self.head_dim).reshape(bs, seqlen, -1, self.head_dim)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, head_dim, hidden):
        super().__init__()
        self.attention = Attention(dim, heads, kv_heads, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


_LIBRARY = []  # the registration below lives as long as the process


def cpu_scaled_mm():
    """torch 2.6.0's CPU build has no `aten::_scaled_mm` (2.13's has); a reference kernel registered for CPU lets the
    compiled block run there. The wrapper's buffers are inductor's at compile time (`extern_kernels._scaled_mm(...,
    out=bufN)` into a buffer it allocated), so the kernel's body changes no byte read; only the numbers it writes."""
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_scaled_mm", "CPU"):
        return

    def product(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        result = (a.float() * scale_a.float()) @ (b.float() * scale_b.float())
        return (result if bias is None else result + bias.float()).to(out_dtype or a.dtype)

    def product_out(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False, *,
                    out):
        return out.copy_(product(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum))

    library = torch.library.Library("aten", "IMPL")
    library.impl("_scaled_mm", product, "CPU")
    library.impl("_scaled_mm.out", product_out, "CPU")
    _LIBRARY.append(library)


def async_tp():
    """9dec370's apply_tp under enable_async_tensor_parallel (parallelize_llama.py 201-205): inductor's
    micro-pipeline TP pass over the TP group's symmetric memory. The fused ops' CUDA kernels cannot run on CPU;
    torch registers each one's unfused form for Meta (`_symmetric_memory/__init__.py`, 2.6.0 618-1069), and that
    form is registered here for CPU too: the wrapper's buffers (the gathered input each fused op returns, its
    outputs) are the op's schema's, whatever kernel fills them."""
    import torch.distributed._symmetric_memory as symm_mem

    torch._inductor.config._micro_pipeline_tp = True
    # enable_symm_mem_for_group bootstraps through the group's store, which the fake group's FakeStore cannot set;
    # the pass asks only is_symm_mem_enabled_for_group, true under torch's own test mode (2.6.0 __init__.py 86-93)
    symm_mem._is_test_mode = True
    for name, fallback in (("fused_all_gather_matmul", "_fused_all_gather_matmul_fallback"),
                           ("fused_all_gather_scaled_matmul", "_fused_all_gather_scaled_matmul_fallback"),
                           ("fused_matmul_reduce_scatter", "_fused_matmul_reduce_scatter_fallback"),
                           ("fused_scaled_matmul_reduce_scatter", "_fused_scaled_matmul_reduce_scatter_fallback")):
        if hasattr(symm_mem, fallback):
            torch.library.impl(symm_mem.lib, name, "CPU")(getattr(symm_mem, fallback))


def block_plan(float8: bool) -> dict:
    """9dec370's TP plan of one TransformerBlock (torchtitan parallelize_llama), Float8's styles under --float8."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if float8:
        from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel as ColwiseParallel  # noqa: F811
        from torchao.float8.float8_tensor_parallel import Float8RowwiseParallel as RowwiseParallel  # noqa: F811
        from torchao.float8.float8_tensor_parallel import (
            PrepareFloat8ModuleInput as PrepareModuleInput,  # noqa: F811
        )
    return {"attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel()}


def parallelize(block, tp: int, float8: bool, overlap: bool = False):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    mesh = init_device_mesh("cpu", (tp,))
    plan = block_plan(float8)
    block.attention.n_heads //= tp
    block.attention.n_kv_heads //= tp
    parallelize_module(block, mesh, plan)
    if overlap:
        async_tp()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--float8", action="store_true")
    parser.add_argument("--ac", action="store_true")
    parser.add_argument("--async-tp", action="store_true", help="9dec370's enable_async_tensor_parallel (TP > 1)")
    parser.add_argument("--dims", default="256,128,8,2,832,512")
    parser.add_argument("--scale", type=int, default=4096)
    parser.add_argument("--read", metavar="DIR", help="replay the backward wrapper an earlier run left in DIR (its "
                        "compile debug folder) and compile nothing: torch 2.6.0's CPU wrapper of the block without "
                        "AC cannot run (a scalar buffer named before it is made), and the run stops after writing it")
    args = parser.parse_args()
    if args.read:
        report(args.read, args.scale)
        return
    dim, heads, kv_heads, head_dim, hidden, tokens = (int(v) for v in args.dims.split(","))
    torch.manual_seed(0)
    block = Block(dim, heads, kv_heads, head_dim, hidden).to(torch.bfloat16)
    if args.float8:
        cpu_scaled_mm()
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(block)
    if args.tp > 1:
        parallelize(block, args.tp, args.float8, args.async_tp)
    if args.ac:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        block = checkpoint_wrapper(block, preserve_rng_state=False)
    x = torch.randn(1, tokens // args.tp, dim, dtype=torch.bfloat16, requires_grad=True)
    print(f"compile debug folder: {os.environ['TORCH_COMPILE_DEBUG_DIR']}", flush=True)  # for --read after a failed run
    torch.compile(block, fullgraph=True)(x).sum().backward()
    report(os.environ["TORCH_COMPILE_DEBUG_DIR"], args.scale)


def report(debug_dir: str, scale: int):
    [folder] = glob.glob(os.path.join(debug_dir, "**", "*backward*"), recursive=True)
    with open(os.path.join(folder, "output_code.py")) as code, open(os.path.join(folder, "fx_graph_readable.py")) as fx, \
            open(os.path.join(folder, "ir_post_fusion.txt")) as ir:
        result = run_call(code.read(), graph_input_bytes(fx.read()), buffer_bytes=ir_buffer_bytes(ir.read()))
    print(f"backward wrapper: {folder}")
    print(f"peak {result.peak_bytes:,} B (x{scale}: {result.peak_bytes * scale:,}) after {result.peak_statement}")
    for name, size in result.at_peak:
        print(f"  {name:>16} {size:>12,} {size * scale:>16,}")


if __name__ == "__main__":
    main()
