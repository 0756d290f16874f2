"""Memory-bound kernels at the rate they are measured to run, not at the datasheet's HBM bandwidth.

A norm, an activation, rotary, a residual add, a cast or the loss moves bytes and does next to no
arithmetic; the roofline (roofline.py) times it by those bytes over a bandwidth. The datasheet's
figure is a ceiling these kernels do not reach. Liger-Kernel publishes the median time of the very
ops ckplan charges (Hugging Face's LlamaRMSNorm, torch's LayerNorm and cross entropy, Hugging Face's
rotary, eager SwiGLU), as eager torch, torch.compile and fused Triton kernels, on named GPUs
(github linkedin/Liger-Kernel, benchmark/data/*.csv). `scripts/membound_rates.py` counts each
benchmark op's bytes as ckplan does (the fake profiler's OpBytes for eager; inductor's own count for
torch.compile; a fused kernel's inputs and outputs, once each) and divides by the published time:
docs/gpus.md "Memory-bound kernels" has every row. Per GPU two fractions of the datasheet bandwidth
come of it (archs.GPU.membound_eager_efficiency, membound_fused_efficiency):

- eager: the bytes eager aten ops move (the fake and analytic profiles' count, every pass without a
  fused record), per op class (OP_CLASSES, Work.classed) at that class's own sweeps' fraction
  (GPU.membound_class_efficiency) where the GPU's architecture has them, else at the eager mean;
- fused: the bytes of one kernel per fused op (inductor's kernels under torch.compile, Transformer
  Engine's and Megatron's fused norm, rotary and activation kernels): roofline.Work.fused_bytes.

What the rate leaves out: a fixed cost per kernel. The sweeps' fixed part (the time left at the
largest size after its bytes at the rate between the two largest) is 0-8 µs an eager op and of
either sign; it is the host's launch time in a benchmark that runs one op alone, which a training
step's large kernels hide (the host runs ahead), so it is not charged (docs/gpus.md says more).
A measured profile (`--device cuda`) is real time and never passes through here.
"""

from __future__ import annotations

from planner.models.gpus import GPU
from planner.models.membound_rate import MemboundKind, achieved_tbps, fraction  # noqa: F401 (a GPU record's rates, kept importable from here)

# The eager op classes both profilers can tell apart (the analytic one by formula, the fake one by the
# innermost module running the op: fake.op_class), each measured by its own Liger-Kernel sweep
# (docs/gpus.md §4, scripts/membound_rates.py):
OP_CLASSES = {
    "norm": "RMSNorm's chain (Hugging Face's LlamaRMSNorm: fp32 upcast, pow, mean, rsqrt, two multiplies)",
    "layer_norm": "torch's LayerNorm (native_layer_norm, one kernel each way)",
    "attention": "the attention module's own ops: rotary (transformers' apply_rotary_pos_emb), Q/K/V's "
                 "gradient sums, eager attention's softmax",
    "activation": "the MLP's own ops: SwiGLU's SiLU and product (F.silu(a) * b), GELU, their gradients",
    "loss": "cross entropy (log_softmax and nll_loss, each way)",
    "elementwise": "the rest: residual adds, casts, copies, .grad accumulation, dropout, lookups "
                   "(torch's relu then square, an elementwise chain alone)",
}


def membound_facts(gpu: GPU) -> dict:
    """The rates and their source, as a profile's assumptions record them."""
    return {"eager": achieved_tbps(gpu, "eager"), "fused": achieved_tbps(gpu, "fused"),
            "by_class": {name: achieved_tbps(gpu, "eager", name) for name in OP_CLASSES},
            "source": gpu.membound_source}


def membound_ms(num_bytes: float, gpu: GPU, kind: MemboundKind = "eager", op_class: str | None = None) -> float:
    """`num_bytes` read and written by memory-bound kernels of `kind` (eager: of `op_class`), in ms."""
    return num_bytes / (achieved_tbps(gpu, kind, op_class) * 1e12) * 1e3
