"""GPT-OSS 120B's Megatron-Bridge rows side by side a block and a microbatch (docs/published-runs.md §33.e3moe):
for each config, its tokens a microbatch, the rank's local experts and the rows each expert's grouped GEMM takes with
the efficiency ckplan reads for linear_fc1's and linear_fc2's shapes (planner/profiler/roofline.py
matmul_efficiency), a windowed and a full block's forward, backward and the selective recompute's rerun on
Transformer Engine's kernels (the Megatron runtime's profile times), and one token exchange (bytes, rate, ms); the
iteration as ckplan scores it (scripts/decompose_megatron.py --terms gives its step terms). A third field, EP,
scores a config at another expert parallelism (E3 at the 25.11 table's EP 8).
usage: PYTHONPATH=. python scripts/gptoss_side_by_side.py CONFIG.yaml:GPU[:EP] ... [--gpus 64]"""

import argparse
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import ep_exchange
from planner.models import archs
from planner.profiler.formulas import Shape, expert_gemm_shape
from planner.profiler.roofline import matmul_efficiency


def block_rows(found, gpu_name: str) -> list[str]:
    job, profile, dp = found.job, found.profile, found.setup.data_parallel
    shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                  ep=job.ep)
    gpu = archs.gpu(gpu_name)
    local, rows = expert_gemm_shape(job.arch, shape)
    h, f = job.arch.hidden_size, job.arch.moe_intermediate_size
    fc1, fc2 = matmul_efficiency(2 * rows * h * 2 * f, gpu), matmul_efficiency(2 * rows * f * h, gpu)
    out = [f"  tokens a microbatch {shape.tokens:,}; {local} local experts x {rows:,} rows; grouped GEMM efficiency "
           f"fc1 {fc1:.3f}, fc2 {fc2:.3f} of {gpu.bf16_tflops:g} TFLOP/s"]
    blocks = [layer for layer in profile.layers if layer.a2a_bytes]
    for label, layer in (("windowed", blocks[0]), ("full", blocks[1])):
        option = job.recompute.option  # the recipe's selective modules as ckplan's option (layernorm, moe_act)
        rerun = next(o.recompute_ms for o in layer.recompute_options if o.name == option)
        out.append(f"  {label} block ({layer.name}): fwd {layer.fwd_ms:.3f} ms, bwd {layer.bwd_ms:.3f} ms, "
                   f"rerun of {option} {rerun:.3f} ms")
    one = ep_exchange.exchange_ms(blocks[0].a2a_bytes, dp)
    out.append(f"  one exchange: {blocks[0].a2a_bytes:,} B over EP {dp.ep} at {dp.ep_gb_per_s:.1f} GB/s: {one:.3f} ms "
               f"(x4 a block-microbatch: {4 * one:.3f} ms)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rows", nargs="+", help="CONFIG.yaml:GPU[:EP]")
    parser.add_argument("--gpus", type=int, default=64)
    args = parser.parse_args()
    for spec in args.rows:
        path, gpu, *ep = spec.split(":")
        job = read_job(Path(path), None)
        if ep:
            job.ep = int(ep[0])
        found = predict(job, gpus=args.gpus, gpu_name=gpu)
        print(f"{path} on {args.gpus} x {gpu}, EP {job.ep}, MBS {job.micro_batch_size}, PP {job.pp}: iteration "
              f"{found.cost.iteration_ms / 1e3:.3f} s ({found.tokens_per_s_per_gpu:,.0f} tok/s/GPU)")
        print("\n".join(block_rows(found, gpu)))


if __name__ == "__main__":
    main()
