"""A tiny compiled block's record (planner/profiler/compiled_record.py) against the buffers inductor's code allocates
when it runs, at the project's torch (2.13), and its scaling law on two widths (docs/published-runs.md §41.cblock).

The block is scripts/compiled_block_backward.py's (torchtitan 9dec370's LLaMA block), whole-block checkpointed as
torchtitan's full AC wraps it, compiled with fullgraph on CPU. torch.profiler's memory events (profile_memory) list
every allocation the CPU allocator makes while the compiled forward and backward run: the record's forward allocations
must appear among the forward's in order, each to the byte, and its backward's among the backward's (the kernels' own
workspaces, which no wrapper names, fall between).
Skipped where torch cannot compile here."""

from __future__ import annotations

import os
import sys
from collections import Counter
from fractions import Fraction

import pytest

from planner.profiler.compiled_record import Wrapper, block_record, degrees, scaled

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "scripts"))

WIDTHS = (32, 2, 1, 16, 64, 16)  # hidden, heads, kv heads, head dim, FFN, tokens


def _block():
    """The script's Block, its import's TORCH_COMPILE_DEBUG settings undone (they would write every later compile's
    debug files)."""
    saved = {name: os.environ.get(name) for name in ("TORCH_COMPILE_DEBUG", "TORCH_COMPILE_DEBUG_DIR")}
    from compiled_block_backward import Block

    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return Block


def _read(hidden, heads, kv_heads, head_dim, ffn, tokens):
    Block = _block()
    from torch._inductor.utils import run_and_get_code
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    block = checkpoint_wrapper(Block(hidden, heads, kv_heads, head_dim, ffn).to(torch.bfloat16), preserve_rng_state=False)
    x = torch.randn(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, tokens, hidden, dtype=torch.bfloat16)
    compiled = torch.compile(block, fullgraph=True)
    torch._dynamo.reset()
    try:
        _, codes = run_and_get_code(lambda: compiled(x).backward(grad))
    except Exception as error:  # noqa: BLE001  no compiler here: nothing to check
        pytest.skip(f"torch.compile unavailable: {type(error).__name__}")
    for param in block.parameters():
        param.grad = None
    x.grad = None
    made = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as forward:
        out = compiled(x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as backward:
        out.backward(grad)
    for prof in (forward, backward):
        made.append([event.nbytes() for event in prof.profiler.kineto_results.events()
                     if event.name() == "[memory]" and event.nbytes() > 0])
    empty = "def forward(self, ):\n    pass\n"
    return block_record(Wrapper(codes[0], empty), Wrapper(codes[1], empty)), made


@pytest.fixture(scope="module")
def readings():
    half = _read(*WIDTHS)
    whole = _read(*(w if at in (1, 2) else 2 * w for at, w in enumerate(WIDTHS)))  # heads kept, the rest doubled
    return half, whole


def _in_order(wanted: list[int], seen: list[int]) -> bool:
    it = iter(seen)
    return all(any(size == got for got in it) for size in wanted)


@pytest.mark.xdist_group("compiled_record_torch")  # one worker compiles the two widths for both tests
def test_the_records_allocations_are_the_ones_torch_makes(readings):
    for record, (forward, backward) in readings:
        # the forward's, in order; the rng state the checkpoint saves is the CPU generator's uint8 state
        sizes = [code for code in record.forward if code > 0]
        assert sizes and _in_order(sizes, forward), (sizes, forward)
        # the backward's, each size at most as often as torch made it (the kernels' own workspaces, the fallbacks'
        # tuples made in their kernels' order, fall between)
        sizes = Counter(code for code in record.backward if code > 0)
        made = Counter(backward)
        assert sizes and all(made[size] >= count for size, count in sizes.items()), (sizes, made)


@pytest.mark.xdist_group("compiled_record_torch")
def test_the_scaling_law_on_two_widths(readings):
    (half, _), (whole, _) = readings
    powers = degrees(half, Fraction(1, 2), whole, Fraction(1))
    assert scaled(half, Fraction(1, 2), powers) == whole
    # the forward's output, tokens x hidden in bf16, grows as the square of the factor
    assert half.output and powers[half.output - 1] == 2
    assert set(powers) <= {0, 1, 2}
