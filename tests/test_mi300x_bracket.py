"""scripts/mi300x_attention_bracket.py: the patched record reads each source's rates, hand-counted on one kernel."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import mi300x_attention_bracket as bracket  # noqa: E402

from planner.models import gpus  # noqa: E402
from planner.profiler.roofline import Kernel, kernel_ms  # noqa: E402


def test_the_patched_record_runs_a_causal_forward_at_the_sources_rate():
    # LLaMA 3 8B's attention forward, one sequence of 8,192 tokens, 32 heads of 128: torch counts 4 s^2 d h
    # = 4 x 8192^2 x 128 x 32 = 1,099,511,627,776 FLOPs; causal, half run: 549,755,813,888 at 119.4 TFLOP/s
    # = 4.60432 ms; the backward's 2.5x of it (1,374,389,534,720) at 19.9 TFLOP/s = 69.0648 ms
    gpu = bracket.patched_gpu(119.4, 19.9)
    fwd = Kernel("attention-fwd", 4 * 8192**2 * 128 * 32, run_fraction=0.5, seq_len=8192)
    bwd = Kernel("attention-bwd", 10 * 8192**2 * 128 * 32, run_fraction=0.5, seq_len=8192)
    assert kernel_ms(fwd, gpu) == pytest.approx(549_755_813_888 / 119.4e12 * 1e3, rel=1e-12)
    assert kernel_ms(bwd, gpu) == pytest.approx(1_374_389_534_720 / 19.9e12 * 1e3, rel=1e-12)
    assert kernel_ms(fwd, gpu) == pytest.approx(4.60432, abs=1e-5)
    # the record itself is untouched, and reads CK's causal-corrected figure
    assert kernel_ms(fwd, gpus.GPUS["mi300x"]) == pytest.approx(549_755_813_888 / 324.29445e12 * 1e3, rel=1e-6)


def test_the_record_reads_the_ck_causal_source_the_bracket_names_first():
    assert next(iter(bracket.SOURCES)) == "ck-causal"
    assert bracket.SOURCES["ck-causal"][:2] == pytest.approx(
        tuple(r * 1307.4 for r in gpus.GPUS["mi300x"].attention_efficiency), rel=1e-12)


def test_bad_input_is_one_sentence(capsys):
    assert bracket.main(["one", "M12", "cudnn"]) == 2
    assert capsys.readouterr().err.strip() == ("error: no source 'cudnn'; choose one of ck-causal, ck, aiter-asm, "
                                               "triton-fwd, aotriton-2024-bwd")
    assert bracket.main(["one", "M11", "ck"]) == 2
    assert "runs no MI300X profile" in capsys.readouterr().err
    assert bracket.main(["one", "NOPE", "ck"]) == 2
    assert capsys.readouterr().err.strip() == "error: no row NOPE in scripts/published_rows.toml"
