"""Memory-bound kernels at their measured rate (planner/profiler/membound.py): the bytes of one of
Liger-Kernel's benchmark ops as ckplan counts them, by hand, and the time charged for them; the
eager/fused split of a pass; GPUs without published kernel data."""

import pytest
import torch
from fixtures.scripts import load_script

from planner.models import archs
from planner.models.gpus import (
    GPUS,
    MEMBOUND_A100,
    MEMBOUND_B200,
    MEMBOUND_CLASSES_A100,
    MEMBOUND_CLASSES_B200,
    MEMBOUND_CLASSES_H100,
    MEMBOUND_CLASSES_MI300X,
    MEMBOUND_H100,
    MEMBOUND_MI300X,
)
from planner.profiler import analytic_time
from planner.profiler.fake import OpBytes, counting, new_mode
from planner.profiler.formulas import Shape
from planner.profiler.membound import OP_CLASSES, achieved_tbps, membound_ms
from planner.profiler.opclass import op_class
from planner.profiler.roofline import Work, roofline_ms, work


def _benchmark_script():
    """scripts/membound_rates.py, whose LlamaRMSNorm is the module Liger-Kernel's benchmark times."""
    return load_script("membound_rates")


LlamaRMSNorm = _benchmark_script().LlamaRMSNorm


def rms_norm_forward_bytes(rows: int, hidden: int) -> int:
    """By hand, per element of x (bf16 in): to fp32 2+4, pow 4+4, mean reads 4, x * rsqrt 4+4,
    to bf16 4+2, fp32 weight * bf16 2+4 out fp32 = 38; per row: mean's write 4, + eps 4+4, rsqrt 4+4,
    the multiply's read 4 = 24; the weight read once, 4 a column."""
    return 38 * rows * hidden + 24 * rows + 4 * hidden


def test_rms_norm_benchmark_bytes_are_the_fake_profilers_count():
    with new_mode():
        norm = LlamaRMSNorm(4)
        x = torch.randn(2, 4, dtype=torch.bfloat16)
        with OpBytes() as counted:
            norm(x)
    assert counted.bytes == rms_norm_forward_bytes(2, 4) == 368


def test_rms_norm_benchmark_time_at_the_measured_eager_rate():
    """Liger's H100 NVL row at M 2048, H 32768 (1.2193 ms published): 2,550 MB at the H100's eager rate."""
    moved = rms_norm_forward_bytes(2048, 32768)
    assert moved == 2_550_317_056
    h100 = GPUS["h100-sxm"]
    assert achieved_tbps(h100) == pytest.approx(3.35 * MEMBOUND_H100[0])
    assert membound_ms(moved, h100) == pytest.approx(moved / (3.35e12 * MEMBOUND_H100[0]) * 1e3)


def test_a_pass_charges_eager_and_fused_bytes_each_at_its_rate():
    gpu = GPUS["h100-sxm"]
    done = Work(0, 1_000_000, (), 400_000)
    eager_s = 600_000 / (gpu.hbm_tbps * 1e12 * gpu.membound_eager_efficiency)
    fused_s = 400_000 / (gpu.hbm_tbps * 1e12 * gpu.membound_fused_efficiency)
    assert roofline_ms(done, gpu) == pytest.approx((eager_s + fused_s) * 1e3)
    assert (done + done).fused_bytes == 800_000
    assert (done - Work(0, 500_000, (), 0)).fused_bytes == 400_000
    assert (done - Work(0, 900_000, (), 0)).fused_bytes == 100_000  # never more than the bytes left


def test_measured_fractions_are_the_harmonic_means_of_the_sweeps_in_the_docs():
    """docs/gpus.md "Memory-bound kernels": each architecture's sweeps, forward+backward, as fractions of
    their GPU's datasheet bandwidth (scripts/membound_rates.py's summary)."""
    def harmonic(*fractions):
        return len(fractions) / sum(1 / f for f in fractions)

    assert MEMBOUND_H100 == (round(harmonic(0.633, 0.422, 0.464, 0.391, 0.429, 0.633), 3),
                             round(harmonic(0.426, 0.598, 0.400, 0.418), 3))
    assert MEMBOUND_A100 == (round(harmonic(0.733, 0.416, 0.583, 0.426, 0.757, 0.432, 0.589, 0.446), 3),
                             round(harmonic(0.433, 0.536, 0.502, 0.344), 3))


@pytest.mark.parametrize(("name", "nearest", "fractions"), [
    ("h200", "H100", MEMBOUND_H100), ("gh200", "H100", MEMBOUND_H100),
    ("l4", "A100", MEMBOUND_A100)])
def test_a_gpu_without_kernel_data_takes_its_nearest_architectures_fractions_and_says_so(name, nearest, fractions):
    gpu = GPUS[name]
    assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == fractions
    assert "no memory-bound kernel benchmark published" in gpu.membound_source
    assert f"the {nearest}'s fractions assumed" in gpu.membound_source
    assert gpu.membound_class_efficiency == (MEMBOUND_CLASSES_H100 if nearest == "H100" else MEMBOUND_CLASSES_A100)


@pytest.mark.parametrize(("name", "fractions"), [("h100-sxm", MEMBOUND_H100), ("a100-80g", MEMBOUND_A100)])
def test_gpus_with_kernel_data_carry_their_measured_fractions(name, fractions):
    gpu = GPUS[name]
    assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == fractions
    assert gpu.membound_source.startswith("measured on")


def test_the_b200_reads_its_own_published_kernel_data_and_the_gb200_the_b200s():
    """Liger-Kernel's B200 rows (7a12e092): every class but SwiGLU measured; fused: the H100's, assumed."""
    for name in ("b200", "gb200"):
        gpu = GPUS[name]
        assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == MEMBOUND_B200
        assert gpu.membound_class_efficiency == MEMBOUND_CLASSES_B200
    assert GPUS["b200"].membound_source.startswith("eager measured on B200")
    assert "the B200's fractions (the same chip" in GPUS["gb200"].membound_source
    harmonic = 5 / sum(1 / f for f in (0.165, 0.557, 0.224, 0.471, 0.555))
    assert MEMBOUND_B200[0] == round(harmonic, 3)
    # activation has no B200 sweep: it reads the eager mean
    assert achieved_tbps(GPUS["b200"], "eager", "activation") == pytest.approx(8.0 * MEMBOUND_B200[0])


def test_the_mi300x_reads_its_own_published_kernel_data():
    """Liger-Kernel's MI300X rows (a054fafd): HF RMSNorm, LayerNorm, HF rotary and cross entropy measured;
    SwiGLU reads the eager mean (their harmonic mean), elementwise ops BabelStream's Add (3,956,389.991 MB/s,
    AMD's MI300X acceptance guide); fused: the H100's, assumed."""
    gpu = GPUS["mi300x"]
    assert dict(gpu.membound_class_efficiency) == dict(MEMBOUND_CLASSES_MI300X) == {
        "norm": 0.478, "layer_norm": 0.251, "attention": 0.475, "loss": 0.330, "elementwise": 0.746}
    assert round(3_956_389.991e6 / 5.3e12, 3) == 0.746
    assert MEMBOUND_MI300X[0] == round(4 / (1 / 0.478 + 1 / 0.251 + 1 / 0.475 + 1 / 0.330), 3) == 0.357
    assert (gpu.membound_eager_efficiency, gpu.membound_fused_efficiency) == (0.357, MEMBOUND_H100[1])
    assert gpu.membound_source.startswith("eager measured on MI300X") and "a054fafd" in gpu.membound_source
    # 1 GB of each: RMSNorm's chain at 0.478 x 5.3 TB/s, a residual add at BabelStream's Add, SwiGLU (no MI300X
    # sweep) at the eager mean
    assert membound_ms(10**9, gpu, "eager", "norm") == pytest.approx(1 / (5.3 * 0.478))
    assert membound_ms(10**9, gpu, "eager", "elementwise") == pytest.approx(1 / (5.3 * 0.746))
    assert membound_ms(10**9, gpu, "eager", "activation") == pytest.approx(1 / (5.3 * 0.357))
    assert membound_ms(10**9, gpu, "fused") == pytest.approx(1 / (5.3 * 0.449))


def test_the_mi300x_norm_fraction_is_its_liger_rows_rate_between_the_two_largest_sizes():
    """Liger-Kernel a054fafd, rms_norm / huggingface / full on the AMD Instinct MI300X at M 2048: 1.927377 ms at
    H 16384, 3.915212 ms at H 32768 (all_benchmark_data.csv lines 988-989); the bytes as the fake profiler counts
    them (scripts/membound_rates.py), their difference over the time's, of the datasheet's 5.3 TB/s."""
    config = {"M": 2048, "dtype": "torch.bfloat16", "eps": 1e-06}
    count = _benchmark_script().count
    small, large = count("rms_norm", 16384, config, "full")[0], count("rms_norm", 32768, config, "full")[0]
    # the forward by hand (rms_norm_forward_bytes), the backward as the fake profiler counts it
    assert large - rms_norm_forward_bytes(2048, 32768) == 7_516_528_640
    assert (large - small) / ((3.915212 - 1.927377) * 1e-3) / 5.3e12 == pytest.approx(0.478, abs=5e-4)


def test_each_op_class_is_charged_at_its_own_measured_fraction():
    """A pass of 1 GB in each class on an H100 SXM (3.35 TB/s): each at its class's sweep (membound_rates.py's
    per-class summary: HF RMSNorm 0.633, LayerNorm 0.425, HF rotary 0.464, SwiGLU 0.633, cross entropy 0.391,
    relu then square 0.922), and eager bytes no class claims at the eager mean (0.477)."""
    gpu = GPUS["h100-sxm"]
    assert dict(MEMBOUND_CLASSES_H100) == {"norm": 0.633, "layer_norm": 0.425, "attention": 0.464,
                                           "activation": 0.633, "loss": 0.391, "elementwise": 0.922}
    assert set(dict(MEMBOUND_CLASSES_H100)) == set(OP_CLASSES)
    classed = {name: 10**9 for name in OP_CLASSES}
    done = work(0, 7 * 10**9, [], classed=classed)
    expected = sum(1 / (3.35 * fraction) for fraction in dict(MEMBOUND_CLASSES_H100).values()) + 1 / (3.35 * 0.477)
    assert roofline_ms(done, gpu) == pytest.approx(expected)
    assert membound_ms(10**9, gpu, "eager", "elementwise") == pytest.approx(1 / (3.35 * 0.922))
    assert membound_ms(10**9, GPUS["a100-80g"], "eager", "elementwise") == pytest.approx(1 / (2.039 * 0.519))


def test_relu_squared_benchmark_bytes_by_hand():
    """Liger's relu_squared torch row (the elementwise class's sweep), per element of x in bf16:
    relu 2+2, square 2+2; backward pow's gradient (x * 2: 2+2, then * grad: 2+2+2) and relu's
    (threshold_backward: 2+2+2) = 28 B."""
    with new_mode():
        x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
        with OpBytes() as counted:
            y = torch.square(torch.nn.functional.relu(x))
        grad = torch.randn_like(y)
        with counted:
            y.backward(grad)
    assert counted.bytes == 28 * 32


def test_classes_add_and_subtract_and_never_exceed_the_eager_bytes():
    a = work(0, 1000, [], fused_bytes=200, classed={"norm": 500, "elementwise": 300})
    b = work(0, 300, [], classed={"norm": 300})
    assert (a + b).classed == (("elementwise", 300), ("norm", 800))
    assert (a - b).classed == (("elementwise", 300), ("norm", 200)) and (a - b).unclassed_bytes == 0
    # b's 100 unclassed bytes taken from a's classes: the 400 eager bytes left keep the classes' shares
    assert (a - work(0, 400, [], classed={"norm": 300})).classed == (("elementwise", 240), ("norm", 160))
    assert work(0, 100, [], classed={"norm": 300}).classed == (("norm", 100),)  # clipped to the bytes
    assert Work(0, 1000, (), 200).unclassed_bytes == 800  # a record without classes: the eager mean


@pytest.mark.parametrize(("module_type", "expected"), [
    ("LlamaRMSNorm", "norm"), ("RMSNorm", "norm"), ("LayerNorm", "layer_norm"), ("LlamaAttention", "attention"),
    ("GPT2Attention", "attention"), ("LlamaMLP", "activation"), ("SiLU", "activation"),
    ("NewGELUActivation", "activation"), ("LlamaDecoderLayer", "elementwise"), ("Linear", "elementwise"),
    ("Dropout", "elementwise")])
def test_the_fake_profiler_classes_an_op_by_the_module_running_it(module_type, expected):
    assert op_class(module_type) == expected


def test_an_rms_norm_modules_bytes_are_classed_norm_forward_and_backward_and_its_grad_elementwise():
    """The benchmark's LlamaRMSNorm as a module: forward 38 B an element etc. (rms_norm_forward_bytes), all
    `norm`; its weight's gradient added into .grad (3 x 4 B a column): elementwise."""
    with new_mode():
        norm = LlamaRMSNorm(4)
        norm.weight.grad = torch.zeros_like(norm.weight)
        x = torch.randn(2, 4, dtype=torch.bfloat16, requires_grad=True)
        with counting() as done:
            out = norm(x)
            forward = done()
            out.backward(torch.zeros_like(out))
            backward = done() - forward
    assert forward.classed == (("norm", rms_norm_forward_bytes(2, 4)),)
    assert dict(backward.classed)["elementwise"] == 3 * 4 * 4
    assert sum(dict(backward.classed).values()) == backward.bytes


def test_the_analytic_blocks_bytes_by_class_by_hand():
    """LLaMA 3 8B, 8,192 tokens: forward norms 2 x (36 B x h + 28) a token, rotary 20 B an element of Q and K
    plus 8 a token and head dim, SwiGLU 10 B an element of f, the two residual adds 6 B an element of h."""
    arch, shape = archs.arch("llama3-8b"), Shape(seq_len=8192, micro_batch_size=1)
    T, h, f, kv = 8192, 4096, 14336, 1024
    fwd, bwd, _ = analytic_time.block_work(arch, shape)
    assert dict(fwd.classed) == {"norm": 2 * (36 * h + 28) * T, "attention": 20 * (h + kv) * T + 8 * 128 * T,
                                 "activation": 10 * f * T, "elementwise": 2 * 6 * h * T}
    assert fwd.unclassed_bytes == 0 and bwd.unclassed_bytes == 0
    # backward: the residual stream's gradient sums in the norms' (where autograd adds them), Q/K/V's and
    # gate/up's input-gradient sums and the .grad accumulation elementwise
    params = 218_112_000
    assert dict(bwd.classed) == {"norm": 2 * (96 * h + 44) * T + 2 * 6 * h * T,
                                 "attention": 32 * (h + kv) * T + 8 * 128 * T, "activation": 18 * f * T,
                                 "elementwise": 2 * 6 * h * T + 6 * h * T + 3 * 2 * params}
