"""A tiny compiled block's record (planner/profiler/compiled_record.py) against the buffers inductor's code allocates
when it runs, at the project's torch (2.13), and its scaling law on two widths (docs/published-runs.md §41.cblock).

The block is scripts/compiled_block_backward.py's (torchtitan 9dec370's LLaMA block), whole-block checkpointed as
torchtitan's full AC wraps it, compiled with fullgraph on CPU (scripts/compiled_record_torch_fixture.py).
torch.profiler's memory events (profile_memory) list every allocation the CPU allocator makes while the compiled
forward and backward run: the record's forward allocations must appear among the forward's in order, each to the
byte, and its backward's among the backward's (the kernels' own workspaces, which no wrapper names, fall between).
One width is compiled live; the other (every width doubled but the heads) is the fixture that script writes at the
same torch (tests/fixtures/compiled_record_torch.json: both wrappers and the allocations torch made), held to the
same check, and the scaling law is read between the two. Skipped where torch cannot compile here."""

from __future__ import annotations

import json
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from planner.profiler.compiled_record import Wrapper, block_record, degrees, scaled

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from compiled_record_torch_fixture import FIXTURE, WHOLE, WIDTHS, compile_and_run  # noqa: E402

EMPTY = "def forward(self, ):\n    pass\n"


def _record(codes):
    return block_record(Wrapper(codes[0], EMPTY), Wrapper(codes[1], EMPTY))


@pytest.fixture(scope="module")
def stored():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def readings(stored):
    try:
        codes, made = compile_and_run(*WIDTHS)
    except Exception as error:  # noqa: BLE001  no compiler here: nothing to check
        pytest.skip(f"torch.compile unavailable: {type(error).__name__}")
    assert tuple(stored["widths"]) == WHOLE
    return (_record(codes), made), (_record(stored["codes"]), stored["made"])


def _in_order(wanted: list[int], seen: list[int]) -> bool:
    it = iter(seen)
    return all(any(size == got for got in it) for size in wanted)


@pytest.mark.xdist_group("compiled_record_torch")  # one worker compiles the live width for both tests
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
def test_the_scaling_law_on_two_widths(readings, stored):
    if stored["torch"] != torch.__version__:  # another torch's wrappers: re-record the fixture at this one
        pytest.skip(f"the fixture is torch {stored['torch']}'s: python scripts/compiled_record_torch_fixture.py")
    (half, _), (whole, _) = readings
    powers = degrees(half, Fraction(1, 2), whole, Fraction(1))
    assert scaled(half, Fraction(1, 2), powers) == whole
    # the forward's output, tokens x hidden in bf16, grows as the square of the factor
    assert half.output and powers[half.output - 1] == 2
    assert set(powers) <= {0, 1, 2}
