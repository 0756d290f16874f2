"""A Megatron MoE row's expert GEMMs as a rank runs them, each at the rate ckplan gives it, and (--device, on one CUDA
GPU) the same GEMMs timed as Transformer Engine issues them (docs/published-runs.md §35.e4moe, framework-facts §169).

TE v2.9's GroupedLinear in BF16 runs no grouped kernel: `general_grouped_gemm` calls `nvte_multi_tensor_gemm`, which
off Hopper's opt-in CUTLASS path (NVTE_USE_CUTLASS_GROUPED_GEMM) is `multi_stream_cublas_gemm`: one cuBLAS GEMM per
local expert, the i-th on compute stream i % 4 (transformer_engine/common/gemm/cublaslt_gemm.cu 924-977,
common/util/multi_stream.cpp 52-55). Megatron-core's TEGroupedMLP gives linear_fc1 a width of 2f under a gated unit
(megatron/core/transformer/moe/experts.py 752-765 at 92c8482e), and the wgrad GEMMs accumulate into main_grad
(beta 1). ckplan times each expert's GEMM alone by its FLOPs (roofline.matmul_efficiency); no published figure
says what four streams of these shapes reach on an H100. The table prints what ckplan charges; --device times one
expert's GEMM alone and a pass's GEMMs on four streams, in BF16 (an FP8 row's GEMMs timed in BF16 all the same:
the FP8 path's quantize kernels are not in it), with torch's cuBLAS, as TE issues them, each operand
row-major (TE's wgrad and dgrad take transposed layouts: what cuBLAS picks for those may differ).

--xla TABLE.h (an H100-family GPU) adds each GEMM read off OpenXLA's whole measured sm_90 grid at its own m, n, k
(scripts/xla_gemm_table.py; the file from ROCm/xla ea2c45f2 `xla/service/gpu/model/matmul_interpolator_data.h`),
scaled to the GPU's plateau as roofline.py scales its curve: the BF16 GEMM of the same shape. The grid's FP8 points
are counted against the FP8 peak, not read (framework-facts §586).

usage: PYTHONPATH=<checkout> python scripts/expert_gemm_check.py FLAGS.yaml GPU [--device] [--xla TABLE.h]
"""

import sys
from pathlib import Path

from planner.profiler import formulas
from planner.profiler.roofline import (
    _TABLE_PLATEAU,
    Kernel,
    kernel_ms,
    matmul_efficiency,
    peak_tflops,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_job  # noqa: E402
import xla_gemm_table  # noqa: E402

STREAMS = 4  # TE's compute streams (multi_stream.cpp get_num_compute_streams)


def expert_gemms(arch, shape) -> tuple[int, list[tuple[str, int, int, int]]]:
    """(local experts, [(name, M, N, K)]) of one local expert's GEMMs: fc1 and fc2 forward, then each one's dgrad
    and wgrad; rows its tokens, h the hidden size, f its width (2f for linear_fc1 under a gated unit)."""
    local, rows = formulas.expert_gemm_shape(arch, shape)
    h, f = arch.hidden_size, arch.moe_intermediate_size // shape.tp
    f1 = 2 * f if arch.style != "gpt" else f
    return local, [
        ("fc1 fprop", rows, f1, h),
        ("fc2 fprop", rows, h, f),
        ("fc2 dgrad", rows, f, h),
        ("fc2 wgrad", h, f, rows),
        ("fc1 dgrad", rows, h, f1),
        ("fc1 wgrad", f1, h, rows),
    ]


def charged_ms(gemm: tuple[str, int, int, int], gpu, fp8: bool) -> float:
    _, m, n, k = gemm
    return kernel_ms(Kernel("matmul-fp8" if fp8 else "matmul", 2 * m * n * k), gpu)


def timed_ms(
    gemms: list[tuple[int, int, int]], streams: int, accumulate: list[bool], iters: int = 20
) -> float:
    """One pass of `gemms` on `streams` CUDA streams, the i-th on stream i % streams after the current stream, then
    joined (multi_stream_cublas_gemm's order), in ms; a wgrad (`accumulate`) adds into its output (beta 1)."""
    import torch

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    ops = [
        (
            torch.randn(m, k, device=dev, dtype=bf16),
            torch.randn(k, n, device=dev, dtype=bf16),
            torch.zeros(m, n, device=dev, dtype=bf16),
        )
        for m, n, k in gemms
    ]
    side = [torch.cuda.Stream() for _ in range(streams)]

    def one_pass():
        main = torch.cuda.current_stream()
        for s in side:
            s.wait_stream(main)
        for i, ((a, b, c), add) in enumerate(zip(ops, accumulate)):
            with torch.cuda.stream(side[i % streams]):
                if add:
                    c.addmm_(a, b)
                else:
                    torch.mm(a, b, out=c)
        for s in side:
            main.wait_stream(s)

    for _ in range(3):
        one_pass()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        one_pass()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def xla_grid(argv: list[str]) -> tuple[list[str], str | None]:
    """(argv without `--xla PATH`, PATH or None)."""
    if "--xla" not in argv:
        return argv, None
    at = argv.index("--xla")
    if at + 1 >= len(argv):
        return argv[:at], ""
    return argv[:at] + argv[at + 2:], argv[at + 1]


def grid_rate(grid: dict, gemm: tuple[str, int, int, int], gpu) -> float:
    """TFLOP/s of `gemm` in BF16 off the sm_90 grid, scaled to `gpu`'s plateau as roofline.py scales its curve."""
    _, m, n, k = gemm
    return xla_gemm_table.rate(grid, m, n, k) * gpu.matmul_efficiency / _TABLE_PLATEAU


def main(argv: list[str]) -> int:
    device = "--device" in argv
    argv, xla = xla_grid([a for a in argv if a != "--device"])
    found = moe_job.read(argv, "expert_gemm_check.py")
    if found is None:
        return 2
    grid = {}
    if xla is not None:
        grid, why = _grid(xla, found[1])
        if why:
            sys.stderr.write(f"error: {why}\n")
            return 2
    if device and not _cuda():
        sys.stderr.write(
            "error: --device needs a CUDA GPU and torch built with CUDA; none is visible here\n"
        )
        return 2
    job, gpu, shape = found
    fp8 = bool(job.modelled.float8)
    local, gemms = expert_gemms(job.arch, shape)
    print(
        f"{argv[0]} on {gpu.name}: {local} local experts of {gemms[0][1]} rows, h {job.arch.hidden_size}, "
        f"{'FP8' if fp8 else 'BF16'} (peak {peak_tflops(gpu, fp8=fp8):.0f} TFLOP/s)"
    )
    print(
        "GEMM        M x N x K             GFLOP  ckplan eff  µs each  x local ms"
        + ("  device alone, 4 streams ms" if device else "") + ("  XLA grid TFLOP/s  µs" if grid else "")
    )
    totals, grid_totals = {"forward": 0.0, "backward": 0.0}, {"forward": 0.0, "backward": 0.0}
    for gemm in gemms:
        name, m, n, k = gemm
        each = charged_ms(gemm, gpu, fp8)
        totals["forward" if "fprop" in name else "backward"] += local * each
        line = (
            f"{name:10}  {m:>6} x {n:>6} x {k:>6}  {2 * m * n * k / 1e9:7.2f}  "
            f"{matmul_efficiency(2 * m * n * k, gpu, fp8=fp8):10.3f}  {each * 1e3:7.1f}  {local * each:10.3f}"
        )
        if device:
            add = "wgrad" in name
            line += (
                f"  {timed_ms([(m, n, k)], 1, [add]):.3f}, "
                f"{timed_ms([(m, n, k)] * local, STREAMS, [add] * local):.3f}"
            )
        if grid:
            tflops = grid_rate(grid, gemm, gpu)
            grid_totals["forward" if "fprop" in name else "backward"] += local * 2 * m * n * k / (tflops * 1e9)
            line += f"  {tflops:16.1f}  {2 * m * n * k / (tflops * 1e6):5.1f}"
        print(line)
    print(
        f"charged a block-microbatch: forward {totals['forward']:.3f} ms, backward {totals['backward']:.3f} ms "
        f"(each GEMM alone at its FLOPs' rate, one after another)"
    )
    if grid:
        over = xla_gemm_table.above(grid, xla_gemm_table.FP8, peak_tflops(gpu, fp8=True))
        print(
            f"the XLA grid's BF16 GEMMs at these shapes: forward {grid_totals['forward']:.3f} ms, backward "
            f"{grid_totals['backward']:.3f} ms; its FP8 points: {over} of {len(grid)} above the dense FP8 peak "
            f"({peak_tflops(gpu, fp8=True):.0f} TFLOP/s), not read"
        )
    return 0


def _grid(path: str, gpu) -> tuple[dict, str]:
    """The sm_90 grid of the header at `path`, or why it cannot be read for `gpu`."""
    if not path:
        return {}, "--xla needs the path of XLA's matmul_interpolator_data.h"
    if not gpu.name.startswith(("h100", "h200", "gh200")):
        return {}, f"--xla reads the table's sm_90 (H100) points; {gpu.name} is not an H100-family GPU"
    try:
        text = Path(path).read_text()
    except OSError as err:
        return {}, f"cannot read {path}: {err.strerror}"
    grid = xla_gemm_table.read(text, "sm_90")
    if not grid:
        return {}, f"{path} holds no sm_90 table (XLA's matmul_interpolator_data.h has one)"
    return grid, ""


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
