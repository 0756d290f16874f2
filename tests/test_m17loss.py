"""torchtitan 9dec370's loss under TP's loss_parallel, as the installed torch's CPU allocator makes it, against the
programs the replay plays for it (planner/cost/fsdp2_layers.py loss_forward_program, loss_program; docs/published-
runs.md §41.m17loss, framework-facts §393-§395).

torch's profiler with profile_memory sees every request the c10 allocator serves, inside DTensor's loss_parallel
handlers too (a dispatch mode such as MemTracker does not: its mode is off while DTensor's handler runs, so at torch
2.6.0 MemTracker reads this loss's peak as 4.97 x the bf16 logits where the allocator's is 8.00). A batch of 32
tokens, a vocabulary of 96 (48 a rank at TP 2): the bf16 logits 32 x 48 x 2 = 3,072 B a rank, F (the fp32 logits)
6,144 B; no other tensor of the loss is F's size (the per-token statistics are 32 x 4 B).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

TOKENS, VOCAB, TP = 32, 96, 2
FP32_LOGITS = TOKENS * VOCAB // TP * 4


@pytest.fixture
def fake_mesh():
    """A process group of 2 on one CPU process (torch's fake backend: its collectives make their outputs only)."""
    import torch.distributed as dist

    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=TP, store=fake_pg.FakeStore())
    from torch.distributed.device_mesh import init_device_mesh

    yield init_device_mesh("cpu", (TP,))
    dist.destroy_process_group()


def _allocator_events(mesh) -> tuple[list[int], list[int]]:
    """The signed sizes of the CPU allocator's requests and frees at the loss's forward and at its backward, in order."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    pred = torch.randn(1, TOKENS, VOCAB // TP, dtype=torch.bfloat16, requires_grad=True)  # the head's local logits
    labels = torch.randint(0, VOCAB, (1, TOKENS))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logits = DTensor.from_local(pred, mesh, [Shard(-1)])
        with loss_parallel():
            # torchtitan 9dec370 train.py 131-134
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        with record_function("## backward ##"), loss_parallel():
            loss.backward()
    assert pred.grad is not None and pred.grad.dtype == torch.bfloat16
    events = list(prof.profiler.kineto_results.events())
    backward = next(e.start_ns() for e in events if e.name() == "## backward ##")
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    return ([n for t, n in memory if t < backward], [n for t, n in memory if t >= backward])


def _signs(program: tuple[int, ...], size: int) -> list[int]:
    """A coded program (n > 0 allocates, -k frees id k) as the signed sizes torch's allocator reports."""
    return [size if code > 0 else -size for code in program]


def test_the_loss_requests_are_the_programs_the_replay_plays(fake_mesh):
    from test_bridge_memory import profile, setup

    from planner.cost.fsdp2_layers import loss_forward_program, loss_program, program_kept_bytes

    tiny, run = profile(tp=TP, sp=True), setup(runtime="torchtitan", runtime_version="9dec370", tp=TP)
    f = tiny.layers[-1].output_bytes * 2  # the profile's fp32 logits: the programs' unit
    forward, backward = _allocator_events(fake_mesh)
    fp32 = [n for n in forward if abs(n) == FP32_LOGITS]
    # forward: the .float() copy, the shifted logits, exp's (freed once summed), the result, the shifted and the copy
    # freed: the result alone left for the backward
    assert fp32 == _signs(loss_forward_program(tiny, run), FP32_LOGITS)
    assert program_kept_bytes(loss_forward_program(tiny, run)) == f and sum(fp32) == FP32_LOGITS
    # backward: the zeros, exp's, the sum's, exp's freed, the product's, the zeros and the sum freed, then the saved
    # result (which the replay frees with the loss's kept tensors) and the product (after its bf16 cast is made)
    fp32 = [n for n in backward if abs(n) == FP32_LOGITS]
    assert fp32[:8] == _signs(loss_program(tiny, run, 3 * f), FP32_LOGITS) and fp32[8:] == [-FP32_LOGITS]
    bf16_cast = backward.index(FP32_LOGITS // 2)  # the logits' gradient in bf16 (ToCopyBackward)
    assert [n for n in backward[:bf16_cast] if abs(n) == FP32_LOGITS].count(-FP32_LOGITS) == 4  # product still alive
    # the peak in F: the kept result and three more, what the replay's loss_kept + loss_extra hold at once
    alive = peak = 0
    for n in forward + backward:
        alive += n if abs(n) == FP32_LOGITS else 0
        peak = max(peak, alive)
    assert peak == 4 * FP32_LOGITS
