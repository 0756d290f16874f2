"""The host's time a Megatron-LM step spends beside its layers' own ops, as multiples of one torch Linear forward
(the unit of scripts/bench_host.py and bench_host_step.py; the cost model carries each ratio to the GPU's host at its
published Linear forward, GPU.host_call_us: TransformerEngine#2053). Replicas of Megatron-LM d98e8a64's host calls on
tiny CPU tensors (each op's time is its dispatch, not its arithmetic):

- a tensor-parallel collective's issue: torch.distributed.all_reduce / all_gather_into_tensor /
  reduce_scatter_tensor / broadcast from Python, as TE's linears and Megatron's mappings call them. Two measures:
  (1) on torch's "fake" backend (FakeProcessGroup, world size 4, one process): torch.distributed's Python
  wrapper, the c10d dispatcher op and the backend's virtual call, a Work object returned -- what every backend
  (NCCL's too) pays before its own enqueue; (2) on a gloo group of 2 processes, async_op=True, the issue only
  (the wait outside the timing): (1) plus gloo's enqueue of the work on its own thread. What NCCL's
  ProcessGroupNCCL adds on a GPU (its CUDA events, the stream wait, ncclGroupStart/End and the kernel launch)
  has no CPU counterpart here: not measured;
- --overlap-param-gather's forward pre-hook (distributed_data_parallel.py 485-536, d98e8a64): registered on every
  module of the model; after a step's first microbatch each call is nn.Module's hooked path, the hook's assert,
  is_graph_capturing() (a module global's read), the loop over module.parameters(recurse=False) with a dict lookup a parameter and
  finish_param_sync's checks (param_and_grad_buffer.py 538-560: dispatched, no handle left: nothing to wait);
  timed as a module's call with the hook less the same module's call without it;
- get_batch on TP rank 0 (pretrain_gpt.py 110-150, megatron/core/utils.py 2167-2320 get_batch_on_this_tp_rank):
  next() on a torch DataLoader with 2 workers (Megatron's --num-workers default) over a dataset of Megatron's batch
  dict (tokens, labels, loss_mask, attention_mask, position_ids; the workers ahead: the main process's queue get,
  unpickling and collate's result only), the five keys' .cuda() (here a .clone(): a copy op each), and the five
  broadcasts (pipeline 1; first stage 3, last stage 3) timed as the collectives above;
- the logging's host calls per step (training.py training_log with --log-interval 1): one
  SummaryWriter.add_scalar (tensorboard's, where installed: say so where absent) and one Megatron timer's
  start/stop pair at --timing-log-level 0 (timers.py: a DummyTimer for levels above it).

Run: PYTHONPATH=$PWD python scripts/bench_host_comm.py [--repeats 9] [--calls 200] [--no-gloo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

S, B, H = 8, 2, 32  # tiny: dispatch, not arithmetic
KEYS = ("tokens", "labels", "loss_mask", "attention_mask", "position_ids")


def _median_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    return statistics.median(fn() for _ in range(calls)) * 1e6


def timed(fn):
    """fn wrapped to return its own duration."""
    def one():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return one


def linear_unit():
    lin, x = nn.Linear(H, H), torch.randn(S, B, H, requires_grad=True)
    return timed(lambda: lin(x))


def collective_calls(group, *, async_op: bool):
    """The four tensor-parallel collectives as Megatron / TE issue them, each a function timing its issue."""
    world = dist.get_world_size(group)
    x = torch.randn(S, B, H)
    gathered = torch.empty(world * S, B, H)
    shard = torch.empty(S // world if S % world == 0 else 1, B, H)
    whole = torch.randn(shard.shape[0] * world, B, H)

    def issue(call):
        def one():
            t0 = time.perf_counter()
            work = call()
            dt = time.perf_counter() - t0
            if work is not None:
                work.wait()
            return dt
        return one

    return {
        "all-reduce": issue(lambda: dist.all_reduce(x, group=group, async_op=async_op)),
        "all-gather": issue(lambda: dist.all_gather_into_tensor(gathered, x, group=group, async_op=async_op)),
        "reduce-scatter": issue(lambda: dist.reduce_scatter_tensor(shard, whole, group=group, async_op=async_op)),
        "broadcast": issue(lambda: dist.broadcast(x, 0, group=group, async_op=async_op)),
    }


def fake_collectives(calls: int) -> dict[str, float]:
    """µs per issue on torch's fake backend (world size 4, this process as rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        fns = collective_calls(None, async_op=False)
        return {name: _median_us(fn, calls) for name, fn in fns.items()}
    finally:
        dist.destroy_process_group()


def _gloo_rank(rank: int, world: int, path: str, calls: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    fns = collective_calls(None, async_op=True)
    res = {name: _median_us(fn, calls) for name, fn in fns.items()}
    dist.barrier()
    if rank == 0:
        out.put(res)
    dist.destroy_process_group()


def gloo_collectives(calls: int, world: int = 2) -> dict[str, float]:
    """µs per async issue on a gloo group of `world` processes (rank 0's medians)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_gloo_rank, args=(r, world, path, calls, out)) for r in range(world)]
        for p in procs:
            p.start()
        res = out.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
    return res


_IS_GRAPH_CAPTURING = False


def is_graph_capturing():  # megatron/core/transformer/cuda_graphs.py 244-246
    return _IS_GRAPH_CAPTURING


class _Bucket:  # param_and_grad_buffer.py's _ParamAndGradBucketGroup after the step's first microbatch
    def __init__(self):
        self.param_gather_dispatched, self.param_gather_handle = True, None
        self.overlap_param_gather = True

    def finish_param_sync(self, skip_next_bucket_dispatch: bool = False):
        assert self.overlap_param_gather
        if not self.param_gather_dispatched:
            raise AssertionError("dispatched at the step's first microbatch")
        if self.param_gather_handle is not None:
            raise AssertionError("waited at the step's first microbatch")


class _Ddp:  # the DDP's state the hook reads
    def __init__(self, model: nn.Module):
        bucket = _Bucket()
        self.use_forward_hook = True
        self.align_param_gather, self.overlap_param_gather_with_optimizer_step = True, False
        self.param_to_bucket_group = {p: bucket for p in model.parameters()}

    def make_hook(self):
        def hook(module, *unused):  # distributed_data_parallel.py 523-536
            assert self.use_forward_hook, "Should use pre-hook only when overlap_param_gather is True"
            if is_graph_capturing():
                return
            for param in module.parameters(recurse=False):
                if param not in self.param_to_bucket_group:
                    continue
                assert param.requires_grad
                skip = self.align_param_gather or self.overlap_param_gather_with_optimizer_step
                self.param_to_bucket_group[param].finish_param_sync(skip_next_bucket_dispatch=skip)
        return hook


class _Held(nn.Module):  # a module holding `n` parameters of its own (TE's LayerNormColumnParallelLinear: 4)
    def __init__(self, n: int):
        super().__init__()
        for i in range(n):
            self.register_parameter(f"p{i}", nn.Parameter(torch.randn(H)))

    def forward(self, x):
        return x


def pre_hook_calls(calls: int) -> tuple[float, float]:
    """µs a module's call gains from the pre-hook: (a module holding no parameter, each parameter it holds): the
    hooked call less the plain call of a module holding none and of one holding four."""
    gains = []
    for n in (0, 4):
        plain, hooked = _Held(n), _Held(n)
        hooked.register_forward_pre_hook(_Ddp(hooked).make_hook())
        x = torch.randn(S, B, H)
        samples = [(_median_us(timed(lambda m=plain, x=x: m(x)), calls), _median_us(timed(lambda m=hooked, x=x: m(x)),
                                                                                     calls))
                   for _ in range(3)]
        gains.append(min(h for _, h in samples) - min(p for p, _ in samples))
    return gains[0], (gains[1] - gains[0]) / 4


class _Batches(torch.utils.data.Dataset):  # GPTDataset's item, already built (the workers' side not timed)
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        tokens = torch.randint(0, 256, (S,))
        return {"tokens": tokens, "labels": torch.roll(tokens, -1), "loss_mask": torch.ones(S),
                "attention_mask": torch.ones(1, S, S, dtype=torch.bool), "position_ids": torch.arange(S)}


def dataloader_next(calls: int) -> float:
    """µs the main process spends in next() on a DataLoader with 2 workers kept ahead (a pause between calls)."""
    loader = torch.utils.data.DataLoader(_Batches(), batch_size=B, num_workers=2, persistent_workers=True,
                                         prefetch_factor=4)
    it = iter(loader)
    samples = []
    for i in range(calls + 20):
        time.sleep(0.004)  # the workers refill the queue: the main process's side alone is timed
        t0 = time.perf_counter()
        batch = next(it)
        dt = time.perf_counter() - t0
        if i >= 20:
            samples.append(dt)
    del batch, it, loader
    return statistics.median(samples) * 1e6


def batch_to_device(calls: int) -> float:
    """µs for get_batch's per-key copies (.cuda(non_blocking=True) here a .clone()) and its dict."""
    batch = _Batches()[0]

    def one():
        return {k: (batch[k].clone() if k in batch and batch[k] is not None else None) for k in KEYS}
    return _median_us(timed(one), calls)


def add_scalar(calls: int) -> float | None:
    """µs per SummaryWriter.add_scalar; None where tensorboard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        writer = SummaryWriter(log_dir=tmp)
        step = [0]

        def one():
            step[0] += 1
            writer.add_scalar("lm loss", 2.5, step[0])
        us = _median_us(timed(one), calls)
        writer.close()
    return us


class _Timer:  # megatron/core/timers.py Timer, without its barrier and torch.cuda.synchronize (GPU only)
    def __init__(self):
        self._elapsed, self._started, self._start_time = 0.0, False, time.time()

    def start(self, barrier=False):
        assert not self._started, "timer has already been started"
        self._start_time = time.time()
        self._started = True

    def stop(self, barrier=False):
        assert self._started, "timer is not started"
        self._elapsed += time.time() - self._start_time
        self._started = False


def timer_pair(calls: int) -> float:
    timer = _Timer()
    return _median_us(timed(lambda: (timer.start(), timer.stop())), calls)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-gloo", action="store_true", help="skip the two-process gloo measure")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    units, fake, hooks, copies, writer, timers = [], [], [], [], [], []
    for _ in range(args.repeats):  # interleaved with the unit: drift on a shared machine spreads over every part
        units.append(_median_us(linear_unit(), args.calls))
        fake.append(fake_collectives(args.calls))
        hooks.append(pre_hook_calls(args.calls))
        copies.append(batch_to_device(args.calls))
        writer.append(add_scalar(args.calls))
        timers.append(timer_pair(args.calls))
    unit = min(units)
    gloo = [] if args.no_gloo else [gloo_collectives(args.calls) for _ in range(max(1, args.repeats // 3))]
    loader = [dataloader_next(args.calls) for _ in range(max(1, args.repeats // 3))]
    print(f"torch {torch.__version__}, {args.repeats} repeats x {args.calls} calls; the unit (a torch Linear forward) "
          f"{unit:.1f} µs (median {statistics.median(units):.1f})")
    print("| part | µs, least (median) | / Linear fwd |")
    print("|---|---|---|")

    def row(name, values):
        values = [v for v in values if v is not None]
        if not values:
            print(f"| {name} | absent | — |")
            return
        print(f"| {name} | {min(values):.1f} ({statistics.median(values):.1f}) | {min(values) / unit:.2f} |")
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "broadcast"):
        row(f"{kind}, fake backend (dispatch)", [f[kind] for f in fake])
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "broadcast"):
        row(f"{kind}, gloo x 2, async issue", [g[kind] for g in gloo])
    row("forward pre-hook, a module (none held)", [h[0] for h in hooks])
    row("forward pre-hook, a parameter the module holds", [h[1] for h in hooks])
    row("DataLoader next(), 2 workers ahead", loader)
    row("get_batch's five copies and dict", copies)
    row("SummaryWriter.add_scalar", writer)
    row("timer start + stop", timers)


if __name__ == "__main__":
    main()
