"""One time model for the fake and the analytic profiles (planner/profiler/roofline.py): matmuls
at the efficiency published for their size, attention at its kernel's published throughput,
float8 at its own peak, memory-bound bytes over HBM; the two profilers agree on a full-width
LLaMA layer; the GPU table covers the GPUs users train on, each figure with its source."""

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.errors import UserError
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.roofline import (
    Kernel,
    Work,
    attention_efficiency,
    kernel_ms,
    matmul_efficiency,
    roofline_ms,
    work,
)

H100, A100, B200, MI300X = archs.gpu("h100"), archs.gpu("a100-80g"), archs.gpu("b200"), archs.gpu("mi300x")


# the H100's sustained plateau (MSMF, the H200's row) over the burst one the XLA table's largest shapes sit at (MAMF)
SETTLED = 708.5 / 794.5


def test_matmul_efficiency_follows_the_published_h100_table():
    # the table's own points, each at the settled clock: 1x1024x4096x4096 and 1x2048x2048x4096 at 742.3 TFLOP/s
    assert matmul_efficiency(2 * 1024 * 4096 * 4096, H100) == pytest.approx(742.3 / 989.4 * SETTLED)
    assert matmul_efficiency(2 * 2048 * 4096 * 1024, H100) == pytest.approx(593.9 / 989.4 * SETTLED)
    # the two 4.3 GFLOP shapes (340.7 and 368.7 TFLOP/s) averaged
    assert matmul_efficiency(2 * 1024 * 4096 * 512, H100) == pytest.approx((340.7 + 368.7) / 2 / 989.4 * SETTLED)
    # past the largest shapes: the MSMF plateau; far below the smallest: a constant time (latency-bound)
    assert matmul_efficiency(2 * 8192**3, H100) == H100.matmul_efficiency == pytest.approx(708.5 / 989.4)
    tiny = 2 * 64 * 64 * 64
    assert kernel_ms(Kernel("matmul", tiny), H100) == pytest.approx(kernel_ms(Kernel("matmul", tiny // 8), H100))
    sizes = [2 * n**3 for n in (128, 256, 512, 1024, 2048, 4096, 8192)]
    efficiencies = [matmul_efficiency(flops, H100) for flops in sizes]
    assert efficiencies == sorted(efficiencies) and efficiencies[0] < 0.01 < 0.71 < efficiencies[-1]


def test_another_gpu_reads_the_curve_at_its_own_peak_and_plateau():
    # the B200 point published beside the H100 table (1x256x4096x4096, 651.4 TFLOP/s = 29% of 2,250, a burst): 31.3%
    # at the B200's burst plateau (MAMF 1,745.0), its sustained one (MSMF 1,456.3) scaling it
    assert matmul_efficiency(2 * 256 * 4096 * 4096, B200) == pytest.approx(0.313 * 1456.3 / 1745.0, abs=0.002)
    # each GPU's plateau is its own MSMF where measured (stas00/ml-engineering 082816f: H100's chip, B200), else a
    # soaked figure (the A100's) or one derived from it (the GB200's, framework-facts §190), else its MAMF (744d01e),
    # over the peak ckplan reads
    assert matmul_efficiency(2 * 8192**3, A100) == A100.matmul_efficiency == pytest.approx(256.5 / 312)
    assert matmul_efficiency(2 * 8192**3, B200) == pytest.approx(1456.3 / 2250)
    assert matmul_efficiency(2 * 8192**3, archs.gpu("gb200")) == pytest.approx(1505.18 / 2500, abs=1e-5)
    assert matmul_efficiency(2 * 8192**3, MI300X) == pytest.approx(668.4 / 1307.4)
    # the H100 reads the H200's MSMF (the same chip at 700 W), the GH200 (900 W, no MSMF) its own MAMF
    assert archs.gpu("h200").matmul_efficiency == H100.matmul_efficiency
    assert archs.gpu("gh200-144g").matmul_efficiency == pytest.approx(828.6 / 989.4)


def test_a_gpu_with_its_own_measurement_at_a_tiny_and_a_large_shape():
    """The MI300X: its tiny matmuls on the H100 table read at its own peak (a kernel of equal time at
    peak runs at the same fraction), scaled to its own MAMF; its large ones at that MAMF exactly."""
    tiny = 2 * 256 * 1024 * 256  # the table's smallest FLOP count: 1x256x1024x256 and 1x512x256x512, 25.7 and 21.0
    assert matmul_efficiency(tiny, H100) == pytest.approx((25.7 + 21.0) / 2 / 989.4 * SETTLED)
    at_h100_time = tiny * MI300X.bf16_tflops / H100.bf16_tflops  # the same time at peak on the MI300X
    scale = (668.4 / 1307.4) / (794.5 / 989.4)
    assert matmul_efficiency(at_h100_time, MI300X) == pytest.approx((25.7 + 21.0) / 2 / 989.4 * scale)
    assert matmul_efficiency(2 * 16384 * 8192 * 8192, MI300X) == 668.4 / 1307.4


def test_float8_runs_at_its_own_peak_or_is_refused():
    big = 2 * 8192**3
    # at the plateau: the H100's FP8 MSMF (1,288.7 TFLOP/s, the H200's FP8 row, 082816f) against its BF16 one
    assert kernel_ms(Kernel("matmul-fp8", big), H100) == pytest.approx(big / 1288.7e12 * 1e3)
    assert kernel_ms(Kernel("matmul", big), H100) == pytest.approx(big / 708.5e12 * 1e3)
    # the MI300X (no FP8 MAMF row): AMD's own FP8 MAF, 1,273 TFLOP/s (ROCm/rocm-blogs 8e011952), not its BF16 fraction
    assert kernel_ms(Kernel("matmul-fp8", big), MI300X) == pytest.approx(big / 1273e12 * 1e3)
    assert kernel_ms(Kernel("matmul", big), MI300X) == pytest.approx(big / 668.4e12 * 1e3)
    # a GPU with no FP8 measurement of either kind (the L4): its FP8 peak at its BF16 fraction
    L4 = archs.gpu("l4")
    assert L4.fp8_matmul_efficiency == 0.0
    assert kernel_ms(Kernel("matmul-fp8", big), L4) == pytest.approx(big / (242.5e12 * L4.matmul_efficiency) * 1e3)
    with pytest.raises(UserError, match="a100-80g has no tensor cores for"):
        kernel_ms(Kernel("matmul-fp8", big), A100)


def test_attention_at_its_kernels_throughput_causal_half():
    flops = 4 * 4096 * 4096 * 4096
    full = kernel_ms(Kernel("attention-fwd", flops), H100)
    assert kernel_ms(Kernel("attention-fwd", flops, 0.5), H100) == pytest.approx(full / 2)
    assert kernel_ms(Kernel("attention-bwd", flops), A100) == pytest.approx(flops / (312e12 * 0.63) * 1e3)  # FA2 §1


def test_torchs_flash_attention_on_h100_takes_its_published_time():
    """pytorch/benchmark c0409aaf timed torch's SDPA (flash backend) on H100 at batch 2, 16 heads, 8192
    tokens, head dim 128, causal: 1.84317 ms forward, 5.28237 ms backward. The same call, as torch's
    FLOP counter counts it (4·s²·d·heads·batch forward, 2.5x backward) and the causal kernel runs it
    (half its blocks), takes those times here."""
    counted = 4 * 8192**2 * 128 * 16 * 2
    assert kernel_ms(Kernel("attention-fwd", counted, 0.5), H100) == pytest.approx(1.84317)
    assert kernel_ms(Kernel("attention-bwd", int(2.5 * counted), 0.5), H100) == pytest.approx(5.28237)
    assert kernel_ms(Kernel("attention-fwd", counted, 0.5, 8192), H100) == pytest.approx(1.84317)
    # the same commit at 2048 tokens (8 sequences a batch): 0.51504 ms forward, 1.97437 ms backward; at
    # 16384 tokens and past them, that length's rate; between lengths, log-linear in the length
    short = 4 * 2048**2 * 128 * 16 * 8
    assert kernel_ms(Kernel("attention-fwd", short, 0.5, 2048), H100) == pytest.approx(0.51504)
    assert kernel_ms(Kernel("attention-bwd", int(2.5 * short), 0.5, 2048), H100) == pytest.approx(1.97437)
    assert kernel_ms(Kernel("attention-fwd", counted, 0.5, 32768), H100) == \
        pytest.approx(kernel_ms(Kernel("attention-fwd", counted, 0.5, 16384), H100))
    between = attention_efficiency(H100, 2896)  # ~ the geometric mean of 2048 and 4096: the midpoint
    assert between[0] == pytest.approx(sum(attention_efficiency(H100, n)[0] for n in (2048, 4096)) / 2, rel=1e-3)
    assert attention_efficiency(A100, 2048) == A100.attention_efficiency  # no lengths published: one figure
    # MI300X: FlashAttention-2 (CK) at its published non-causal 194.43 TFLOP/s backward x the causal mask's cost
    # there (AITER's median, 422.835 / 458.72: tests/test_mi300x_causal.py)
    assert kernel_ms(Kernel("attention-bwd", counted), MI300X) == \
        pytest.approx(counted / (194.43e12 * 422.835 / 458.72) * 1e3)


def test_torchs_flash_attention_on_blackwell_takes_the_b200_s_published_time():
    # cudnn-frontend's B200 file (torch 2.9.0, pyt_flash_attention): 128 heads of 128, batch 1, causal,
    # 8192 tokens 5.889 / 18.395 ms, 2048 tokens 0.567 / 1.844 ms; GB200 reads the B200's fractions (same chip)
    counted = 4 * 8192 * 8192 * 128 * 128
    assert kernel_ms(Kernel("attention-fwd", counted, 0.5, 8192), B200) == pytest.approx(5.889)
    assert kernel_ms(Kernel("attention-bwd", int(2.5 * counted), 0.5, 8192), B200) == pytest.approx(18.395)
    short = 4 * 2048 * 2048 * 128 * 128
    assert kernel_ms(Kernel("attention-bwd", int(2.5 * short), 0.5, 2048), B200) == pytest.approx(1.844)
    gb200 = archs.gpu("gb200")
    assert attention_efficiency(gb200, 8192) == pytest.approx(attention_efficiency(B200, 8192))
    assert kernel_ms(Kernel("attention-fwd", counted, 0.5, 8192), gb200) == pytest.approx(5.889 * 2250 / 2500)


def test_work_adds_and_subtracts_kernel_by_kernel():
    a, b = Kernel("matmul", 10**9), Kernel("matmul", 2 * 10**9)
    plain = work(3 * 10**9, 100, [a, b])
    rerun = work(4 * 10**9, 150, [a, b, a]) - plain
    assert rerun == Work(10**9, 50, ((a, 1),))
    assert (plain + rerun).kernels == ((a, 2), (b, 1))
    # memory-bound bytes at the HBM bandwidth eager kernels reach (membound.py); FLOPs no kernel carries
    # at the plateau
    assert roofline_ms(Work(10**9, 3_350_000), H100) == pytest.approx(1e-3 / H100.membound_eager_efficiency
                                                                     + 1e9 / 708.5e12 * 1e3)


def _config(tmp_path, name, **dims):
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "vocab_size": 128256,
                                "max_position_embeddings": 8192, **dims}))
    return path


@pytest.mark.xdist_group("llama3_8b_layer_fake")  # one worker: the shared 8B profile once (conftest.py)
@pytest.mark.parametrize("name, dims", [
    ("llama3-8b", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)),
    ("llama3-70b", dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8)),
])
def test_analytic_and_fake_profiles_agree_on_every_layers_time(tmp_path, request, name, dims):
    """LLaMA 3 8B and 70B at full width, one decoder layer, 4096 tokens: the analytic profile
    (formulas) and the fake one (Hugging Face's code under FakeTensorMode) within 5% on every
    layer's forward, backward and recompute time, and on the loss. The 8B's fake profile is test_fake's
    too (conftest.py's llama3_8b_layer_fake: this config, these shapes)."""
    pytest.importorskip("transformers")
    shape = ("--seq-len", "4096", "--micro-batch-size", "1")
    if name == "llama3-8b":
        config, fake_path = request.getfixturevalue("llama3_8b_layer_fake")
        assert json.loads(config.read_text()) == json.loads(_config(tmp_path, name, **dims).read_text())
    else:
        config, fake_path = _config(tmp_path, name, **dims), tmp_path / "f.json"
        run_ok("profile", "--hf-config", config.parent, "--fake", *shape, "--out", fake_path)
    run_ok("profile", "--arch-config", config, *shape, "--out", tmp_path / "a.json")
    ours, fake = io.load_profile(tmp_path / "a.json"), io.load_profile(fake_path)
    for mine, theirs in zip(ours.layers, fake.layers, strict=True):
        assert mine.fwd_ms == pytest.approx(theirs.fwd_ms, rel=0.05), mine.name
        assert mine.bwd_ms == pytest.approx(theirs.bwd_ms, rel=0.05), mine.name
        assert mine.recompute_ms == pytest.approx(theirs.recompute_ms or 0.0, rel=0.05, abs=1e-6), mine.name
        # Float8's records (planner/profiler/float8.py): the same linears converted, the same times
        assert (mine.float8 is None) == (theirs.float8 is None), mine.name
        if mine.float8 is not None:
            assert mine.float8.param_count == theirs.float8.param_count
            for field in ("fwd_ms", "bwd_ms", "weight_cast_ms", "transient_bytes"):
                assert getattr(mine.float8, field) == pytest.approx(getattr(theirs.float8, field), rel=0.05), field
            assert mine.float8.recompute_ms["full"] == pytest.approx(theirs.float8.recompute_ms["full"], rel=0.05)
        # the block on Transformer Engine's fused kernels (--runtime megatron): the same record on both
        assert (mine.te_time is None) == (theirs.te_time is None), mine.name
        if mine.te_time is not None:
            assert theirs.te_time == mine.te_time
    assert sum(layer.te_time is not None for layer in fake.layers) == 1
    assert ours.loss_ms == pytest.approx(fake.loss_ms, rel=0.05)  # eager cross-entropy: 36 B per logit
    assert ours.assumptions["mfu"] is None and 0.5 < ours.assumptions["mfu_implied"] < 0.8


def test_a_gpt_2_layer_agrees_with_its_fake_profile_forward_and_backward(tmp_path):
    """GPT-2 XL's widths (LayerNorm, fused Q/K/V with biases, gelu_new, learned positions), one
    layer, 1024 tokens x 4: forward and backward within 5%. Its recompute is not compared: the
    analytic GPT block is charged its whole forward (analytic_time.block_work's rerun)."""
    pytest.importorskip("transformers")
    config = tmp_path / "gpt2" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 1600, "n_layer": 1, "n_head": 25,
                                  "vocab_size": 50257, "n_positions": 1024, "attn_pdrop": 0.0, "resid_pdrop": 0.0,
                                  "embd_pdrop": 0.0}))
    shape = ("--seq-len", "1024", "--micro-batch-size", "4")
    run_ok("profile", "--arch-config", config, *shape, "--out", tmp_path / "a.json")
    run_ok("profile", "--hf-config", config.parent, "--fake", *shape, "--out", tmp_path / "f.json")
    ours, fake = io.load_profile(tmp_path / "a.json"), io.load_profile(tmp_path / "f.json")
    for mine, theirs in zip(ours.layers, fake.layers, strict=True):
        assert mine.fwd_ms == pytest.approx(theirs.fwd_ms, rel=0.05), mine.name
        assert mine.bwd_ms == pytest.approx(theirs.bwd_ms, rel=0.05), mine.name


def test_mfu_is_printed_as_an_output_and_given_only_as_an_override(tmp_path):
    args = ("profile", "--arch", "llama3-8b", "--seq-len", "4096", "--micro-batch-size", "1")
    result = run_ok(*args, "--out", tmp_path / "r.json")
    implied = io.load_profile(tmp_path / "r.json").assumptions["mfu_implied"]
    assert f"imply MFU {implied:.3f}" in " ".join(result.output.split())
    run_ok(*args, "--mfu", "0.5", "--out", tmp_path / "m.json")
    forced = io.load_profile(tmp_path / "m.json")
    arch, shape = archs.arch("llama3-8b"), analytic.Shape(seq_len=4096, micro_batch_size=1)
    assert forced.layers[1].fwd_ms == pytest.approx(analytic.block_flops(arch, shape) / (989.4e12 * 0.5) * 1e3)
    assert forced.assumptions["mfu"] == 0.5


REQUIRED_GPUS = ("h100-sxm", "h100-pcie", "h200", "b200", "gb200", "a100-40g", "a100-80g", "mi300x", "l4", "gh200")


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_every_gpu_has_each_figure_with_a_source_and_profiles(tmp_path, name):
    gpu = archs.gpu(name)
    assert gpu.bf16_tflops > 0 and gpu.hbm_tbps > 0 and gpu.node_link_gb_per_s > 0 and gpu.network_gb_per_s > 0
    assert gpu.fp8_tflops == (0.0 if name.startswith("a100") else pytest.approx(2 * gpu.bf16_tflops, rel=0.01))
    assert gpu.usable_bytes > 0.85 * gpu.memory_bytes
    assert all((gpu.source, gpu.link_source, gpu.total_source, gpu.matmul_source, gpu.attention_source))
    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "256", "--gpu", name, "--out", tmp_path / "p.json")
    assert io.load_profile(tmp_path / "p.json").assumptions["gpu"] == name


def test_an_unknown_gpu_names_every_known_one(tmp_path):
    result = run("profile", "--arch", "llama3-8b", "--seq-len", "256", "--gpu", "v100", "--out", tmp_path / "p.json")
    assert result.exit_code == 1 and all(name in result.output for name in REQUIRED_GPUS)


def test_the_fake_profiler_reads_float8_and_causal_kernels_off_their_arguments():
    import torch

    from planner.profiler import fake

    a, b = torch.empty(4, 8, dtype=torch.float8_e4m3fn), torch.empty(8, 4, dtype=torch.float8_e4m3fn)
    assert fake._kernel(torch.ops.aten.mm.default, 256, (a, b), {}) == Kernel("matmul-fp8", 256)
    assert fake._kernel(torch.ops.aten.mm.default, 256, (a.bfloat16(), b.bfloat16()), {}) == Kernel("matmul", 256)
    q = torch.empty(1, 2, 8, 4)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert fake._kernel(flash, 512, (q, q, q, 0.0, True), {}) == Kernel("attention-fwd", 512, 0.5, 8)
    assert fake._kernel(flash, 512, (q, q, q), {"is_causal": False}) == Kernel("attention-fwd", 512, 1.0, 8)
