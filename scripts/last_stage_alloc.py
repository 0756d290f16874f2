"""torchtitan 9dec370's last pipeline stage beyond its blocks on CPU: every request and free the c10 allocator reports to
torch's profiler (profile_memory; it sees inside DTensor's loss_parallel handlers and funcol, which a dispatch mode
such as MemTracker does not). The final RMSNorm (models/norms.py: `self._norm(x.float()).type_as(x) * self.weight`,
SequenceParallel), the output linear (ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
use_local_output=False)), the loss (train.py 131-134: `cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0,
1))` under loss_parallel), as torch's pipelining runs a last stage under 1F1B: each microbatch's forward and loss,
its backward at once, the stage's output kept (output_chunks) and detached after its backward, and `_merge_outputs`'
cat at the step's end. A process group of TP ranks on one process (torch's fake backend: collectives make their
outputs only). Imports no planner module, so that it runs under any torch (docs/published-runs.md §41.m17loss ran it
at torch 2.6.0 and 2.13.0). With LOSS_ONLY=1, only the loss on the head's logits (`--` the bf16 logits, no norm).

usage: [TP=4] [M=2] [LOSS_ONLY=0] python scripts/last_stage_alloc.py   # each phase's requests and frees of 1 KiB or more
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.profiler import ProfilerActivity, profile, record_function
from torch.testing._internal.distributed.fake_pg import FakeStore

TP, M = int(os.environ.get("TP", "4")), int(os.environ.get("M", "2"))
LOSS_ONLY = os.environ.get("LOSS_ONLY", "") not in ("", "0")
B, S, H, V = 2, 64, 48, 160  # batch, sequence, hidden, vocabulary: each size below a distinct number of bytes


class RMSNorm(nn.Module):
    """torchtitan 9dec370 models/norms.py's eager RMSNorm."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class LastStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.output = RMSNorm(H), nn.Linear(H, V, bias=False, dtype=torch.bfloat16)

    def forward(self, h):
        return self.output(self.norm(h))


def loss_fn(pred, labels):
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))  # torchtitan 9dec370 train.py 131-134


def main() -> None:
    dist.init_process_group("fake", rank=0, world_size=TP, store=FakeStore())
    mesh = init_device_mesh("cpu", (TP,))
    model = LastStage()
    parallelize_module(model, mesh, {"norm": SequenceParallel(), "output": ColwiseParallel(
        input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    torch.manual_seed(0)
    if LOSS_ONLY:
        inputs = [torch.randn(B, S, V // TP, dtype=torch.bfloat16, requires_grad=True) for _ in range(M)]
    else:  # each microbatch's receive buffer: the previous stage's sequence shard
        inputs = [torch.randn(B, S // TP, H, dtype=torch.bfloat16, requires_grad=True) for _ in range(M)]
    labels = [torch.randint(0, V, (B, S)) for _ in range(M)]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        outputs = []
        for i in range(M):
            with record_function(f"## F{i} ##"):
                out = DTensor.from_local(inputs[i], mesh, [Shard(-1)]) if LOSS_ONLY else model(inputs[i])
                outputs.append(out)
                with loss_parallel():
                    loss = loss_fn(out, labels[i])
            with record_function(f"## B{i} ##"):
                with loss_parallel():
                    loss.backward()
                out.detach_()
                del loss
        with record_function("## merge ##"):
            merged = torch.cat(outputs, 0)  # noqa: F841  alive to the profile's end, as the step returns it
    events = list(prof.profiler.kineto_results.events())
    spans = sorted((e.start_ns(), e.name()) for e in events if e.name().startswith("## "))
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    logits = B * S * V // TP * 2
    print(f"torch {torch.__version__}, TP {TP}, M {M}: h shard {B * S // TP * H * 2} B, h whole {B * S * H * 2} B, "
          f"logits {logits} B (bf16, a rank), fp32 logits {2 * logits} B")
    alive = peak = 0
    line: list[str] = []
    for at, nbytes in memory:
        while spans and spans[0][0] <= at:
            if line:
                print(" ", " ".join(line))
                line.clear()
            print(spans.pop(0)[1])
        alive += nbytes
        peak = max(peak, alive)
        if abs(nbytes) >= 1024:
            line.append(f"{nbytes:+d}")
    if line:
        print(" ", " ".join(line))
    print(f"peak {peak} B = {peak / logits:.2f} x the bf16 logits; at the end {alive} B")


if __name__ == "__main__":
    main()
