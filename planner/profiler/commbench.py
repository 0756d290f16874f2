"""A micro-benchmark of point-to-point sends on the backend and device a pipeline uses:
two processes ping-pong tensors of several sizes; half the round trip is one send
(planner/calibrate.py fits latency + bytes / bandwidth through them).

gloo on cpu here; nccl on cuda (each rank on its own GPU, the clock read after a
synchronize). Never prints; returns samples.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from planner.measure.calibrate import SendSample

SIZES_BYTES = (4 * 1024, 256 * 1024, 2 * 2**20, 8 * 2**20)
REPEATS = 15
WARMUP = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_sends(*, backend: str = "gloo", device: str = "cpu", sizes_bytes=SIZES_BYTES, repeats: int = REPEATS,
                  threads: int = 1) -> list[SendSample]:
    """One sample per size: the median one-way time (half a round trip) in ms."""
    port = _free_port()
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(_rank, args=(port, backend, device, tuple(sizes_bytes), repeats, threads, results),
                       nprocs=2, join=True, start_method="spawn")
    samples = results.get()
    return [SendSample(num_bytes, ms) for num_bytes, ms in samples]


def _rank(rank: int, port: int, backend: str, device: str, sizes_bytes, repeats: int, threads: int, results) -> None:
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2)
    where = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    try:
        found = [(size, _ping_pong(rank, size, where, repeats)) for size in sizes_bytes]
        if rank == 0:
            results.put(found)
    finally:
        dist.destroy_process_group()


def _ping_pong(rank: int, num_bytes: int, where: torch.device, repeats: int) -> float:
    buffer = torch.zeros(max(num_bytes // 4, 1), dtype=torch.float32, device=where)
    times_ms = []
    for attempt in range(WARMUP + repeats):
        _sync(where)
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        else:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        _sync(where)
        if attempt >= WARMUP:
            times_ms.append((time.perf_counter() - start) * 1000 / 2)
    return statistics.median(times_ms)


def _sync(where: torch.device) -> None:
    if where.type == "cuda":
        torch.cuda.synchronize(where)
