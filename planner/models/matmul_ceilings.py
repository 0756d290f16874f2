"""The matmul ceilings a GPU record's plateau is read from (planner/models/gpus.py's records, `matmul_fields`): the maximum achievable
(MAMF, a burst) and the maximum sustainable (MSMF, power-saturated) matmul FLOP/s per GPU, BF16 and FP8, each with its
source; the roofline (planner/profiler/roofline.py) scales its shape curve to the record's plateau."""

from __future__ import annotations

# Matmul ceilings: MAMF (maximum achievable matmul FLOP/s, the mean of 100 timed iterations of the best
# shape of a sweep) from stas00/ml-engineering compute/accelerator/README.md at 744d01e (2026-08-22),
# "Maximum Achievable Matmul FLOPS comparison table", BF16, in TFLOP/s and the torch it ran
_MAMF = "stas00/ml-engineering 744d01e, compute/accelerator/README.md, MAMF table (BF16, mean of 100 iterations)"
MAMF_TFLOPS = {
    "h100-sxm": 794.5,  # 2048x2048x13312, torch 2.7.0+cu126; the table's note: "H200 is the same"
    "gh200": 828.6,  # 1024x15360x4096, torch 2.6.0+cu126, "900W 141GiB HBM3e version"
    "a100": 271.2,  # A100 SXM, 1024x10240x5120, torch 2.6.0+cu126
    "b200": 1745.0,  # 1792x16128x3072, torch 2.7.1+cu128
    "gb200": 1822.0,  # 4096x9728x2048, torch 2.10.0.dev20250916+cu130
    "mi300x": 668.4,  # 10240x15360x8192, torch 2.5.1 ROCm 6.3, PYTORCH_TUNABLEOP_ENABLED=1
}


# The same table's FP8 rows (e4m3, TFLOP/s): the float8 matmuls' ceiling (planner/profiler/float8.py's
# GEMMs under --float8). The H200 has its own FP8 row; no FP8 row is published for the MI300X (AMD's own
# figure below) or L4.
MAMF_FP8_TFLOPS = {"h100-sxm": 1402.6, "h200": 1453.4, "gh200": 1535.0, "b200": 3432.5, "gb200": 3615.6}

# Matmul ceilings a training step holds: MSMF (maximum sustainable matmul FLOP/s), the same author's later
# protocol (stas00/ml-engineering 082816f, 2026-08-10, branch fast-mamf, compute/accelerator/README.md "Maximum
# Achievable Matmul FLOPS comparison table" and benchmarks/README.md): the chip thermally soaked, then the best shape
# of a power-saturated confirm, "the number that matches sustained training throughput — a dense training step keeps
# the SMs busy, draws full power, and lives at the settled clock, not the boost clock". The same run's MAMF is the
# boost-clock burst of a low-power shape (H200: 841.9 at ~176 W and 1,980 MHz; MSMF 708.5 at 8192x8448x20480, ~693 W,
# 1,465 MHz; B200: 1,770.9 at ~295 W, 1,965 MHz; MSMF 1,456.3 at 9472x8192x20480, ~994 W, 1,339 MHz), torch
# 2.13.0+cu130, one GPU with its siblings idle (all 8 busy: H200 -0.6%, B200 -2.0% on average). Where a GPU has an
# MSMF row its record's plateau is it; the GB200 and A100 read soaked figures of another protocol (below); the rest
# keep MAMF (none measured: GH200 at 900 W, MI300X, whose AMD figure is already at a median clock under load). The H100 SXM reads the H200's rows: the same
# GH100 at the same 700 W (the table's H100 row said "H200 is the same" until this one) — docs/framework-facts.md §151
_MSMF = "stas00/ml-engineering 082816f (branch fast-mamf), MSMF: power-saturated, soaked, torch 2.13.0+cu130"
MSMF_TFLOPS = {"h100-sxm": 708.5, "b200": 1456.3}  # H200 SXM's row (1,465 MHz); B200 SXM's (1,339 MHz)
MSMF_FP8_TFLOPS = {"h100-sxm": 1288.7, "h200": 1288.7, "b200": 2795.7}  # H200's FP8 row (1,374 MHz); B200's (1,331)

# Where no MSMF row is published, a figure measured soaked by another protocol (docs/framework-facts.md §190):
# Azure/AI-benchmarking-guide's "GEMM CuBLASLt" (Benchmarks/NVIDIA/GEMMCublasLt.py cd84f36a runs gitaumark/
# superbenchmark's cublaslt_gemm, 0012abc: operands uniform in [-1, 1] by curand, 10,000 warm-up calls then 1,000
# timed by CUDA events, batch 1; FP8 e4m3 in, FP16 out, FP32 compute, fast accumulation on), the best of its fixed
# shapes, as MSMF takes the best saturated one. The warm-up is the soak: 16384^3 FP8 on a GB200 ~3 ms a call (30 s),
# FP16 on an A100 ~34 ms (5.7 min). The same protocol on an H200 (ND H200 v5, FP8, 7f20e5fa): 8192^3 1,300.6 and
# 16384^3 1,366.3 against its MSMF 1,288.7 (+0.9%, +6.0%); no power limit or clock is published with them
_AZURE_GB200 = ("Azure/AI-benchmarking-guide 2a370be6 ND_GB200_v6_results.md, GEMM CuBLASLt FP8 16384^3 (uniform "
                "random, 10,000 warm-up calls; CUDA 12.8, driver 570.133.20)")
_AZURE_A100 = ("Azure/AI-benchmarking-guide 3bb66cac ND_A100_v4_results.md, GEMM CuBLASLt FP16 16384^3 (uniform "
               "random, 10,000 warm-up calls; A100-SXM4-80GB, CUDA 12.5, driver 550.90.07; FP16: the A100's BF16 "
               "runs at the same rate a clock, 312 dense both)")
SOAKED_FP8_TFLOPS = {"gb200": 2906.9}  # 8192^3 2,876.6; 6144x12288x12288 2,895.6; 32768^3 2,825.6
SOAKED_TFLOPS = {"a100": 256.5}  # 8192^3 253.7; 6144x12288x12288 250.8

# The GB200's BF16 plateau, derived (§190; no BF16 figure is published for it): the B200's MSMF rows run at a rate per
# SM and clock (BF16 1,456.3 on 148 SMs at 1,339 MHz; FP8 2,795.7 at 1,331); the GB200's soaked FP8 at the FP8 rate
# puts its settled clock at 1,347.5 MHz, and BF16 settles at the FP8 clock (on the B200 1,339 against 1,331 MHz at
# ~994 and ~990 W): BF16 on the GB200's 152 SMs at 1,347.5 MHz. Not below 1,495.7 (the B200's rate and clock on 152
# SMs, which draw at most 1,021 W of the GB200's 1,200), nor above its burst 1,822.0 (§164)
B200_SMS, GB200_SMS = 148, 152  # gpus.py's records read these (their sources there)
_B200_MSMF_MHZ, _B200_MSMF_FP8_MHZ = 1339.0, 1331.0


def flop_per_sm_clock(tflops: float, sms: int, mhz: float) -> float:
    """A matmul rate per streaming multiprocessor and clock (FLOP)."""
    return tflops * 1e12 / (sms * mhz * 1e6)


GB200_SETTLED_MHZ = SOAKED_FP8_TFLOPS["gb200"] * 1e12 / (
    GB200_SMS * flop_per_sm_clock(MSMF_FP8_TFLOPS["b200"], B200_SMS, _B200_MSMF_FP8_MHZ)) / 1e6
GB200_BF16_TFLOPS = flop_per_sm_clock(MSMF_TFLOPS["b200"], B200_SMS, _B200_MSMF_MHZ) * GB200_SMS * GB200_SETTLED_MHZ / 1e6
_GB200_DERIVED = (f"the B200's MSMF rate a SM and clock on the GB200's {GB200_SMS} SMs at its settled "
                  f"{GB200_SETTLED_MHZ:.1f} MHz, read from its soaked FP8 ({_AZURE_GB200}) at the B200's FP8 MSMF rate; "
                  f"{_MSMF}")

# Each sustained ceiling: (TFLOP/s, what it is, its source)
SUSTAINED = {**{key: (tflops, "MSMF", _MSMF) for key, tflops in MSMF_TFLOPS.items()},
             "a100": (SOAKED_TFLOPS["a100"], "soaked", _AZURE_A100),
             "gb200": (GB200_BF16_TFLOPS, "derived", _GB200_DERIVED)}
SUSTAINED_FP8 = {**{key: (tflops, "MSMF", _MSMF) for key, tflops in MSMF_FP8_TFLOPS.items()},
                 "gb200": (SOAKED_FP8_TFLOPS["gb200"], "soaked", _AZURE_GB200)}

# The MI300X's FP8 ceiling, AMD's own: "Measuring Max-Achievable FLOPs - Part 2" (ROCm/rocm-blogs 8e011952,
# blogs/software-tools-optimization/measuring-max-achievable-flops-part2/README.md, 2025-02-28), Table 1: MAF FP8
# 1,273 TFLOP/s at a median clock of 1,230 MHz on the 750 W MI300X (hipblaslt-bench 4096 x 3648 x 32896,
# f8_fnuz_r in and out, f32 compute, trig_float data, cold caches by a 512 MB rotating buffer, hipBLASLt db8e93b4,
# ROCm 6.3.0). Its footnote 4 prints "1223.6 TFLOPs ... at 1273MHz" for the same run; the table's pair is read: at
# 304 CUs x 4,096 FP8 FLOP a clock, 1,273 at 1,230 MHz is 83.1% of the clock's peak, the MI325X's row beside it
# (1,519 at 1,464 MHz) 83.3%; the footnote's pair would be 77.2% (docs/framework-facts.md §90)
MAF_FP8_MI300X_TFLOPS = 1273.0
_MAF_MI300X = ("AMD MAF FP8 1273 of 2614.9 (ROCm/rocm-blogs 8e011952 measuring-max-achievable-flops-part2, Table 1: "
               "hipblaslt-bench f8_fnuz, hipBLASLt db8e93b4, 1,230 MHz median)")


def matmul_fields(key: str, peak: float, note: str = "", *, fp8_key: str | None = None, fp8_peak: float = 0.0,
          fp8_maf: tuple[float, str] | None = None) -> dict:
    """A GPU record's matmul ceilings (GPU.matmul_efficiency, fp8_matmul_efficiency, matmul_source): its sustained
    figure where one is measured or derived (`SUSTAINED`), else its MAMF, over the datasheet peak ckplan reads, with its source; the FP8 one where the table has
    the GPU's FP8 row (`fp8_key`) and the GPU an FP8 peak, or where another measurement gives it (`fp8_maf`: the
    fraction of the FP8 peak, its source)."""
    if key in SUSTAINED:
        tflops, kind, source = SUSTAINED[key]
        found = {"matmul_efficiency": tflops / peak,
                 "matmul_source": f"{kind} {tflops:.1f} of {peak:g} TFLOP/s ({key}{note}; {source}; its burst "
                                  f"MAMF {MAMF_TFLOPS[key]:g}, {_MAMF})"}
    else:
        found = {"matmul_efficiency": MAMF_TFLOPS[key] / peak,
                 "matmul_source": f"MAMF {MAMF_TFLOPS[key]:g} of {peak:g} TFLOP/s ({key}{note}; {_MAMF}; no "
                                  f"sustained figure measured)"}
    if fp8_key is not None and fp8_peak:
        fp8, kind, _ = SUSTAINED_FP8.get(fp8_key, (MAMF_FP8_TFLOPS[fp8_key], "MAMF", _MAMF))
        found["fp8_matmul_efficiency"] = fp8 / fp8_peak
        found["matmul_source"] += f"; FP8 {kind} {fp8:g} of {fp8_peak:g} ({fp8_key}'s FP8 row)"
    elif fp8_maf is not None:
        found["fp8_matmul_efficiency"], source = fp8_maf
        found["matmul_source"] += f"; FP8: {source}"
    return found
