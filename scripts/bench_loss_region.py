"""The loss region of each runtime record (planner/cost/runtimes.py), measured with torch's MemTracker
on CPU: what stays from the loss's forward to its backward and the peak, in multiples of the bf16
logits. Each case is written from the framework's code as docs/framework-facts.md §4 reads it.

    .venv/bin/python scripts/bench_loss_region.py torchtitan_plain loss_parallel hf_446 hf_43x megatron compiled
"""
import sys

import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

N, V = 2048, 4096  # tokens, vocab
def logits_and_labels():
    w = torch.randn(64, V, dtype=torch.bfloat16, requires_grad=True)
    h = torch.randn(N, 64, dtype=torch.bfloat16)
    return w, h, torch.randint(0, V, (N,))

def torchtitan_plain(pred, labels):
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

def hf_446(pred, labels):
    # transformers >= 4.46 loss/loss_utils.py ForCausalLMLoss: upcast, pad-and-shift the labels, sum / items
    logits = pred.float()
    shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    loss = F.cross_entropy(logits.view(-1, V), shift_labels.view(-1), ignore_index=-100, reduction="sum")
    return loss / N, pred  # the model's output object keeps its (bf16) logits through backward

def hf_43x(pred, labels):  # LlamaForCausalLM.forward in transformers 4.3x: logits.float(), shift, CrossEntropyLoss
    logits = pred.float()
    shift_logits = logits[..., :-1, :].contiguous().view(-1, V)
    shift_labels = labels[..., 1:].contiguous().view(-1)
    return F.cross_entropy(shift_logits, shift_labels), logits  # the output object keeps logits (fp32)

class MegatronCE(torch.autograd.Function):
    """megatron/core/tensor_parallel/cross_entropy.py's steps at TP 1, written from its description."""
    @staticmethod
    def forward(ctx, logits, target):
        x = logits.float()
        x -= x.max(dim=-1, keepdim=True)[0]
        predicted = x.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        torch.exp(x, out=x)
        total = x.sum(dim=-1)
        loss = torch.log(total) - predicted
        x.div_(total.unsqueeze(-1))
        ctx.save_for_backward(x, target)
        return loss.mean()
    @staticmethod
    def backward(ctx, grad):
        x, target = ctx.saved_tensors
        x.scatter_add_(-1, target.unsqueeze(-1), -torch.ones_like(target, dtype=x.dtype).unsqueeze(-1))
        x.mul_(grad / x.shape[0])
        return x.to(torch.bfloat16), None

def megatron(pred, labels):
    return MegatronCE.apply(pred.flatten(0, 1), labels.flatten(0, 1))

def compiled(pred, labels):
    return torch.compile(torchtitan_plain)(pred, labels)

def run(name, fn):
    w, h, labels = logits_and_labels()
    mt = MemTracker()
    mt.track_external(w)
    logits_bytes = N * V * 2
    with mt:
        pred = (h @ w).unsqueeze(0)  # bf16 logits, (1, N, V)
        out = fn(pred, labels.unsqueeze(0))
        keep = out[1] if isinstance(out, tuple) else None  # noqa: F841  holds what the output keeps alive
        loss = out[0] if isinstance(out, tuple) else out
        del pred
        now = sum(v for dev in mt.get_tracker_snapshot("current").values() for k, v in dev.items() if k != "Total")
        loss.backward()
    peak = sum(v for dev in mt.get_tracker_snapshot("peak").values() for k, v in dev.items() if k != "Total")
    # the peak less the weight and its gradient (tracked, not logits-sized)
    other = 2 * w.numel() * 2
    kept = (now - 2 * w.numel()) / logits_bytes
    print(f"{name}: kept {kept:.2f}, peak {(peak - other) / logits_bytes:.2f} x the bf16 logits ({peak} B, logits {logits_bytes} B)")

def loss_parallel(pred, labels):
    """torchtitan's TP loss: the logits a DTensor sharded on the vocab, cross_entropy under loss_parallel()."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel as ctx
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    d = DTensor.from_local(pred, mesh, [Shard(-1)])
    with ctx():
        loss = F.cross_entropy(d.flatten(0, 1).float(), labels.flatten(0, 1))
    class L:
        def backward(self_):
            with ctx():
                loss.backward()
    return L()

if __name__ == '__main__':
  for name in sys.argv[1:]:
    run(name, globals()[name])

