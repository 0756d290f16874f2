"""The runtime's NaN check after every forward (planner/runtime/timedstage.py _finite) by the least and greatest
element: it finds a NaN or an infinity where it is, never calls finite values otherwise, and allocates two scalars,
where `isfinite(value).all()` made |value| and three boolean masks beside the stage's output — tests/fixtures/
shared_input.py's stage 0 measured 448 B over its prediction at that check (48,152 / 47,704) — and a float64 sum a
float64 copy of the output inside the reduction (docs/framework-facts.md §655)."""

from __future__ import annotations

import pytest
import torch

from planner.runtime.timedstage import _finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_nan_or_an_infinity_anywhere_is_found(dtype):
    value = torch.ones(4, 8, 16, dtype=dtype)
    assert _finite(value) and _finite((value, [value]))
    for bad in (float("nan"), float("inf"), float("-inf")):
        broken = value.clone()
        broken[3, 7, 15] = bad
        assert not _finite(broken) and not _finite((value, [broken]))
    both = value.clone()
    both[0, 0, 0], both[1, 1, 1] = float("inf"), float("-inf")  # their sum NaN: still found
    assert not _finite(both)


def test_finite_values_whose_own_dtype_would_overflow_are_finite():
    assert _finite(torch.full((1024,), 65504.0, dtype=torch.float16))  # float16's largest: 6.7e7 in float64
    assert _finite(torch.full((1024,), 3.0e38, dtype=torch.float32))
    assert _finite(torch.zeros(3, dtype=torch.long)) and _finite("not a tensor")


def _largest_allocation(check, value) -> int:
    """The largest allocation torch's CPU allocator made inside check(value), as its profiler records them: it sees
    what an op allocates inside its kernel (sum's float64 copy), which MemTracker's dispatch mode does not."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        check(value)
    return max((event.cpu_memory_usage for event in prof.events()), default=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_allocates_scalars_only(dtype):
    value = torch.randn(4, 8, 16).to(dtype)  # 2,048 B fp32, 1,024 B bf16
    assert _largest_allocation(_finite, value) <= 8
    # the two checks before: |value| (the input's bytes), and a float64 copy of it (8 B an element)
    assert _largest_allocation(lambda v: torch.isfinite(v).all(), value) == value.nbytes
    assert _largest_allocation(lambda v: torch.isfinite(v.sum(dtype=torch.float64)), value) == 8 * value.numel()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_a_float8_value_is_checked(dtype):
    """torch has no aminmax for float8 (NotImplementedError on CPU, torch 2.13): read through bf16."""
    value = torch.ones(4, 8).to(dtype)
    assert _finite(value)
    broken = torch.ones(4, 8)
    broken[2, 3] = float("nan")
    assert not _finite(broken.to(dtype))


def test_an_empty_tensor_and_a_scalar_are_checked():
    assert _finite(torch.empty(0)) and _finite(torch.tensor(2.0))
    assert not _finite(torch.tensor(float("nan"))) and not _finite(torch.ones(3, 5).t() / 0)  # non-contiguous, infinite


# ckplan's own run of tests/fixtures/shared_input.py with the check in place, stage 0 (and the last) exactly their
# prediction under 1F1B and GPipe: tests/test_warmupsend.py's test_the_shared_input_models_stages_peak_at_their_prediction
