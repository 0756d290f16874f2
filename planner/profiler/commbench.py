"""A micro-benchmark of point-to-point sends on the backend and device a pipeline uses:
two processes ping-pong tensors of several sizes; half the round trip is one send
(planner/measure/calibrate.py fits latency + bytes / bandwidth through them).

gloo on cpu here; nccl on cuda (each rank on its own GPU, the clock read after a
synchronize). Never prints; returns samples.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import UserError
from planner.measure.calibrate import SendSample

SIZES_BYTES = (4 * 1024, 256 * 1024, 2 * 2**20, 8 * 2**20)
REPEATS = 15
WARMUP = 3


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_sends(*, backend: str = "gloo", device: str = "cpu", sizes_bytes=SIZES_BYTES, repeats: int = REPEATS,
                  threads: int = 1, timeout_s: float = 300.0) -> list[SendSample]:
    """One sample per size: the median one-way time (half a round trip) in ms. The two ranks
    are processes that die with this one however it ends (planner/runtime/children.CHILD_GUARD)."""
    from planner.runtime.children import child_env, guarded

    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="ckplan-sends-") as tmp:
        result = Path(tmp) / "sends.json"
        args = [backend, device, ",".join(map(str, sizes_bytes)), str(repeats), str(threads), str(port), str(result)]
        procs = [subprocess.Popen([sys.executable, "-c", guarded(_RANK_MAIN), str(rank), *args],
                                  env=child_env(_env()), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for rank in range(2)]
        try:
            codes = [proc.wait(timeout=timeout_s) for proc in procs]
        except subprocess.TimeoutExpired:
            codes = None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        if codes != [0, 0] or not result.is_file():
            said = b"".join(proc.stderr.read() for proc in procs).decode(errors="replace").strip().splitlines()
            raise UserError(f"timing sends between two {backend} processes failed"
                            f"{': ' + said[-1][:300] if said else ''}; calibrate needs two processes that can "
                            "reach each other on 127.0.0.1")
        samples = json.loads(result.read_text())
    return [SendSample(int(num_bytes), float(ms)) for num_bytes, ms in samples]


def _env() -> dict[str, str]:
    """This environment, with this planner first on the ranks' path."""
    import planner

    root = str(Path(planner.__file__).parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


_RANK_MAIN = "import sys\nfrom planner.profiler.commbench import rank_main\nrank_main(*sys.argv[1:])\n"


def rank_main(rank: str, backend: str, device: str, sizes: str, repeats: str, threads: str, port: str,
              result: str) -> None:
    """One of the two ranks (a process measure_sends started): rank 0 writes the samples."""
    found = _rank(int(rank), int(port), backend, device, tuple(int(n) for n in sizes.split(",")), int(repeats),
                  int(threads))
    if found is not None:
        Path(result + ".tmp").write_text(json.dumps(found))
        os.replace(result + ".tmp", result)


def _rank(rank: int, port: int, backend: str, device: str, sizes_bytes, repeats: int, threads: int):
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2)
    where = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    try:
        found = [(size, _ping_pong(rank, size, where, repeats)) for size in sizes_bytes]
        return found if rank == 0 else None
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
