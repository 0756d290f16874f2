"""The MI300X record's attention rate: CK's non-causal FlashAttention-2 figure x the causal mask's cost AMD
publishes on MI300X at 8,192 tokens (AITER's nine pairs' median), hand-counted (docs/published-runs.md §68.mi300x)."""

import pytest

from planner.models import gpus
from planner.models.attention_published import (
    AITER_MI300X_8192,
    MI300X_CAUSAL_RATIO,
    MI300X_FLASH_CAUSAL_TFLOPS,
)
from planner.profiler.roofline import Kernel, kernel_ms


def test_the_mask_costs_the_median_of_the_nine_pairs():
    # forward causal / non-causal, sorted: 518.29/591.37 0.8764, 519.32/591.77 0.8776, 540.515/592.16 0.9128,
    # 540.935/590.93 0.9154, 537.36/585.29 0.9181 (the fifth of nine), 522.68/558.17 0.9364, 552.78/583.23 0.9478,
    # 547.09/574.62 0.9521, 550.67/577.45 0.9536
    assert MI300X_CAUSAL_RATIO[0] == pytest.approx(537.36 / 585.29, rel=1e-12)
    # backward (a32): 388.235/481.28 0.8067, 432.715/475.07 0.9108, 434.51/475.68 0.9135, 430.95/469.72 0.9175,
    # 422.835/458.72 0.9218 (the fifth), 434.645/468.71 0.9273, 441.4/475.56 0.9282, 433.285/441.82 0.9807,
    # 442.955/439.94 1.0069
    assert MI300X_CAUSAL_RATIO[1] == pytest.approx(422.835 / 458.72, rel=1e-12)
    assert len(AITER_MI300X_8192) == 9


def test_the_record_runs_llama3_8b_causal_attention_at_the_corrected_rate():
    # 353.22 x 537.36 / 585.29 = 324.2945 TFLOP/s forward; 194.43 x 422.835 / 458.72 = 179.2200 backward
    assert MI300X_FLASH_CAUSAL_TFLOPS == pytest.approx((324.2945, 179.2200), abs=1e-4)
    gpu = gpus.GPUS["mi300x"]
    # 4 s^2 d h = 4 x 8192^2 x 128 x 32 FLOPs, half run under the mask: 549,755,813,888 at 324.2945 TFLOP/s
    # = 1.69524 ms (1.55641 at CK's non-causal 353.22); the backward's 1,374,389,534,720 at 179.2200 = 7.66873 ms
    # (7.06881 at 194.43): 0.73875 ms more a layer, 23.64 ms over LLaMA 3 8B's 32 layers
    fwd = Kernel("attention-fwd", 4 * 8192**2 * 128 * 32, run_fraction=0.5, seq_len=8192)
    bwd = Kernel("attention-bwd", 10 * 8192**2 * 128 * 32, run_fraction=0.5, seq_len=8192)
    assert kernel_ms(fwd, gpu) == pytest.approx(1.69524, abs=1e-5)
    assert kernel_ms(bwd, gpu) == pytest.approx(7.66873, abs=1e-5)
    assert "AITER" in gpu.attention_source and "non-causal" in gpu.attention_source
