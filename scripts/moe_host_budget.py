"""A Megatron MoE block's host issue against its device time, per pass, under Transformer Engine's FP8 (current
scaling): the record's MoE block (scripts/bench_host.py's replica, BF16) plus the per-expert host calls TE v2.9's
GroupedLinear makes under FP8, counted from its code, each at one torch Linear forward of the GPU's host
(GPU.host_call_us) -- an upper bound, no figure of a C++ launch being held (docs/published-runs.md §29.e2host,
docs/framework-facts.md §135). Prints whether the host could bind the pass.

usage: PYTHONPATH=<checkout> python scripts/moe_host_budget.py configs/megatron-bridge/FILE.yaml GPU
"""
import sys
from pathlib import Path

from planner.cost.runtime_megatron import HOST_BLOCK_LINEARS
from planner.profiler import analytic_time, te_fused

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_job  # noqa: E402

GROUPED_LINEARS = 2  # linear_fc1 and linear_fc2 (TEGroupedMLP, experts.py at megatron-core 92c8482e)
# per local expert (one split) and GroupedLinear, TE v2.9 grouped_linear.py and csrc/extensions/cast.cpp
# split_quantize: a Float8 tensor created from C++ (create_tensor: no bulk allocation under current scaling) and its
# four kernels, one after the other on the stream (Float8CurrentScalingQuantizer::quantize_impl, csrc/quantizer.cpp
# 516-535: nvte_compute_amax, whose launch_amax_kernel first launches zero_amax_kernel<<<1, 1>>> and then the amax
# reduction, common/recipe/current_scaling.cu 72-107; compute_scale_from_amax_kernel<<<1, 1>>>, 258; nvte_quantize_v2's
# cast); one GEMM of general_grouped_gemm per split
QUANTIZE_KERNELS = {"zero_amax_kernel (1 thread)": 1, "amax_kernel": 1, "compute_scale_from_amax_kernel (1 thread)": 1,
                    "cast (and Hopper's transpose)": 1}
FORWARD_CALLS = {"quantize: Float8Tensor made": 1, "quantize: kernels": sum(QUANTIZE_KERNELS.values()),
                 "fprop GEMM": 1, "get_weight_workspace (Python, per weight)": 1}
# backward: grad_output's split_quantize (1 + 4), dgrad and wgrad GEMMs (wgrad delayed under --delay-wgrad-compute,
# still issued), handle_custom_ddp_from_mcore's torch.empty per weight
BACKWARD_CALLS = {"quantize: Float8Tensor made": 1, "quantize: kernels": sum(QUANTIZE_KERNELS.values()),
                  "dgrad GEMM": 1, "wgrad GEMM": 1, "wgrad buffer (torch.empty)": 1}
# the device kernels among them, per split: the quantize's four and the pass's GEMMs
FORWARD_KERNELS = sum(QUANTIZE_KERNELS.values()) + 1
BACKWARD_KERNELS = sum(QUANTIZE_KERNELS.values()) + 2


def per_split_calls(backward: bool) -> int:
    """Host calls a GroupedLinear makes per split in one pass under FP8 current scaling (the tables above)."""
    return sum((BACKWARD_CALLS if backward else FORWARD_CALLS).values())


def fp8_calls(local_experts: int) -> tuple[int, int]:
    """(forward, backward) per-expert host calls of a block's two GroupedLinears under FP8 current scaling."""
    return (GROUPED_LINEARS * local_experts * per_split_calls(False),
            GROUPED_LINEARS * local_experts * per_split_calls(True))


def fp8_kernels(local_experts: int) -> tuple[int, int]:
    """(forward, backward) device kernels the two GroupedLinears launch per block-microbatch under FP8 current
    scaling: per split the quantize's four and the GEMMs (one forward, dgrad and wgrad backward)."""
    return GROUPED_LINEARS * local_experts * FORWARD_KERNELS, GROUPED_LINEARS * local_experts * BACKWARD_KERNELS


def main(argv: list[str]) -> int:
    found = moe_job.read(argv, "moe_host_budget.py")
    if found is None:
        return 2
    job, gpu, shape = found
    record = te_fused.te_time(job.arch, shape, gpu, analytic_time.block_work(job.arch, shape, moe=True), moe=True)
    fp8 = job.modelled.float8 and record.float8 is not None
    device = (record.float8.fwd_ms, record.float8.bwd_ms) if fp8 else (record.fwd_ms, record.bwd_ms)
    local = job.arch.num_experts // max(1, job.ep)
    linear_ms = gpu.host_call_us / 1e3
    moe = next((fwd, bwd) for name, fwd, bwd in HOST_BLOCK_LINEARS if name == "moe")
    extra = fp8_calls(local) if fp8 else (0, 0)
    kernels = fp8_kernels(local) if fp8 else (GROUPED_LINEARS * local, 2 * GROUPED_LINEARS * local)
    print(f"{argv[0]} on {gpu.name}: {local} local experts, FP8 {fp8}, one torch Linear forward "
          f"{gpu.host_call_us} µs on its host")
    for name, dev, linears, calls, launched in zip(("forward", "backward"), device, moe, extra, kernels):
        host = (linears + calls) * linear_ms
        print(f"{name}: device {dev:.3f} ms (exchanges not in it); host: record {linears} + FP8 per-split {calls} "
              f"calls = {host:.3f} ms at most -> {'may bind' if host > dev else 'cannot bind'} "
              f"(host / device {host / dev:.2f}); the experts' GroupedLinears launch {launched} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
