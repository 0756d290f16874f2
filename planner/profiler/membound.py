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
  fused record);
- fused: the bytes of one kernel per fused op (inductor's kernels under torch.compile, Transformer
  Engine's and Megatron's fused norm, rotary and activation kernels): roofline.Work.fused_bytes.

What the rate leaves out: a fixed cost per kernel. The sweeps' fixed part (the time left at the
largest size after its bytes at the rate between the two largest) is 0-8 µs an eager op and of
either sign; it is the host's launch time in a benchmark that runs one op alone, which a training
step's large kernels hide (the host runs ahead), so it is not charged (docs/gpus.md says more).
A measured profile (`--device cuda`) is real time and never passes through here.
"""

from __future__ import annotations

from typing import Literal

from planner.models.gpus import GPU

MemboundKind = Literal["eager", "fused"]


def achieved_tbps(gpu: GPU, kind: MemboundKind = "eager") -> float:
    """The bandwidth memory-bound kernels of `kind` are measured to reach on `gpu`, TB/s."""
    fraction = gpu.membound_eager_efficiency if kind == "eager" else gpu.membound_fused_efficiency
    return gpu.hbm_tbps * fraction


def membound_facts(gpu: GPU) -> dict:
    """The rates and their source, as a profile's assumptions record them."""
    return {"eager": achieved_tbps(gpu, "eager"), "fused": achieved_tbps(gpu, "fused"), "source": gpu.membound_source}


def membound_ms(num_bytes: float, gpu: GPU, kind: MemboundKind = "eager") -> float:
    """`num_bytes` read and written by memory-bound kernels of `kind`, in ms."""
    return num_bytes / (achieved_tbps(gpu, kind) * 1e12) * 1e3
