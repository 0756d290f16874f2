"""torchtitan's chunked cross-entropy (components/loss.py ChunkedLossWrapper, the installed torchtitan
0.3.0) run on CPU under torch's MemTracker, on a bf16 LM head with no FSDP: what the loss holds at
its peak and what stays from it to the decoder's backward, beyond the hidden states it is given, the
LM head's weight and its gradient. Printed beside ckplan's count (planner/cost/chunkedloss.py), which
tests/test_chunked_loss.py pins to the byte.

    .venv/bin/python scripts/bench_chunked_loss.py B L D V N
"""
import sys

import torch
from torch.distributed._tools.mem_tracker import MemTracker


def _total(mt: MemTracker, kind: str) -> int:
    return sum(v for dev in mt.get_tracker_snapshot(kind).values() for k, v in dev.items() if k != "Total")


def measure(batch: int, seq: int, hidden: int, vocab: int, chunks: int) -> dict[str, int]:
    """{"peak": .., "kept": ..} in bytes: the loss call's peak less what was live before it (the final
    norm's output `pred` among it), and what is live after it (the trainer's `del pred` done) less the same."""
    from torchtitan.components.loss import ChunkedLossWrapper
    torch.manual_seed(0)
    wrapper = ChunkedLossWrapper(ChunkedLossWrapper.Config(num_chunks=chunks))
    head = torch.nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)
    # MemTracker refuses a module called more than once per iteration (its per-module stats), and
    # the wrapper calls the head once per chunk: it is given nn.Linear's own forward, F.linear on the
    # same weight, which allocates the same tensors
    wrapper.set_lm_head(lambda x: torch.nn.functional.linear(x, head.weight))
    leaf = torch.randn(batch, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, seq))
    tokens = torch.tensor(float(batch * seq))
    # a later microbatch's: the head's .grad already there, each chunk's weight gradient added into it
    head.weight.grad = torch.zeros_like(head.weight)
    mt = MemTracker()
    mt.track_external(head, leaf, labels, tokens)  # already allocated: counted from here
    with mt:
        pred = leaf * 1  # the final norm's output (its own tensor, as in the model)
        before = _total(mt, "current")
        loss, _ = wrapper(pred, labels, tokens)
        peak = _total(mt, "peak")
        del pred
        kept = _total(mt, "current") - before
        loss.backward()
    return {"peak": peak - before, "kept": kept}


if __name__ == "__main__":
    b, seq, d, v, n = (int(x) for x in sys.argv[1:6])
    from planner.cost.chunkedloss import chunked_loss_bytes
    got = measure(b, seq, d, v, n)
    counted = chunked_loss_bytes(batch=b, seq=seq, hidden=d, vocab=v, chunks=n)
    print(f"B={b} L={seq} D={d} V={v} N={n}: measured peak {got['peak']} B, kept {got['kept']} B; "
          f"ckplan peak {counted.peak_bytes} B, kept {counted.kept_bytes} B")
