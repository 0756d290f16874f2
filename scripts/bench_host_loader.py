"""The host's time for the data loader's next() in Megatron-LM's get_batch, as multiples of one torch Linear forward.

Megatron-LM d98e8a64 builds its training loader as torch's DataLoader over the GPT dataset with a batch sampler,
`num_workers=args.num_workers` (default 2), `pin_memory=True`, `persistent_workers=True`
(megatron/training/datasets/data_samplers.py 104-116; arguments.py 3319); a sample is the dict of tokens, labels,
attention_mask (create_attention_mask_in_dataloader, on by default), loss_mask and position_ids
(megatron/core/datasets/gpt_dataset.py 370-377). get_batch calls next() on it once a microbatch on tensor-parallel
rank 0 of the first and the last stage (the others receive the broadcasts; planner/cost/hostcalls.py).

This measures what the training process itself spends in next() when the workers are ahead (a pause between calls
lets them refill the queue, as a training step's compute does): the batch's tensors received from the worker
through shared memory, the collate already done in the worker. CPU only: no pinned-memory thread here (on a CUDA
host its copy runs in a thread of its own). The unit is bench_host's: a torch Linear forward on tiny CPU tensors.
Beside it, the same loader over samples of one int (`--empty`): what next() costs with no tensor to receive, the
queue's and the processes' wake-ups, which on a loaded machine can dwarf the rest and do not scale as a Linear does.
docs/published-runs.md §66.ghost. Run:
    PYTHONPATH=$PWD python scripts/bench_host_loader.py [--seq 1024] [--micro-batch 4] [--calls 200] [--pause-ms 20] [--empty]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn


class OneInt(torch.utils.data.Dataset):
    """A sample of one int: the loader's own cost, no tensor received."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, idx: int) -> int:
        return idx


class GPTLikeDataset(torch.utils.data.Dataset):
    """Megatron's GPT sample's five tensors at sequence length `seq` (their dtypes as gpt_dataset.py makes them)."""

    def __init__(self, seq: int, size: int = 1 << 20):
        self.seq, self.size = seq, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        s = self.seq
        tokens = torch.randint(0, 50257, (s + 1,), dtype=torch.int64)
        return {"tokens": tokens[:-1].contiguous(), "labels": tokens[1:].contiguous(),
                "attention_mask": torch.tril(torch.ones((s, s), dtype=torch.bool)).unsqueeze(0) < 0.5,
                "loss_mask": torch.ones(s, dtype=torch.float32), "position_ids": torch.arange(s, dtype=torch.int64)}


def linear_us(calls: int) -> float:
    """µs of one torch Linear forward (bench_host's unit: hidden 32 over [8, 2, 32]), the median of `calls`."""
    lin, x = nn.Linear(32, 32), torch.randn(8, 2, 32, requires_grad=True)
    for _ in range(50):
        lin(x)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        lin(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def next_us(seq: int, micro_batch: int, calls: int, pause_s: float, workers: int, empty: bool = False) -> float:
    """µs the training process spends in one next() with the workers ahead, the median of `calls`."""
    data = OneInt() if empty else GPTLikeDataset(seq)
    loader = torch.utils.data.DataLoader(data, batch_size=micro_batch, num_workers=workers,
                                         persistent_workers=workers > 0, pin_memory=False)
    it = iter(loader)
    for _ in range(10):  # workers started, queue filled
        next(it)
        time.sleep(pause_s)
    times = []
    for _ in range(calls):
        time.sleep(pause_s)
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--empty", action="store_true", help="samples of one int: the loader's own cost")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    units, nexts = [], []
    for _ in range(args.repeats):
        units.append(linear_us(2000))
        nexts.append(next_us(args.seq, args.micro_batch, args.calls, args.pause_ms / 1e3, args.workers, args.empty))
    unit, got = min(units), min(nexts)
    print(f"torch {torch.__version__}, {'one-int samples' if args.empty else 'GPT samples'}, seq {args.seq}, micro batch {args.micro_batch}, {args.workers} workers, "
          f"{args.repeats} repeats x {args.calls} calls, {args.pause_ms} ms between calls")
    print(f"Linear forward {unit:.2f} µs; next() {got:.1f} µs (repeats {', '.join(f'{n:.1f}' for n in nexts)}) "
          f"= {got / unit:.1f} Linear forwards")


if __name__ == "__main__":
    main()
