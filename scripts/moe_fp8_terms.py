"""Print a Megatron-LM MoE job's step split term by term as ckplan charges it (docs/published-runs.md §25.moefp8):
one MoE block-microbatch on Transformer Engine's kernels in bf16 and under the job's FP8 (TE current scaling:
planner/profiler/te_moe_float8.py), its FP8 quantizes' bytes by linear, the all-to-all, the host's floor, and the
iteration's compute over the ranks' block-microbatches.

usage: PYTHONPATH=<checkout> python scripts/moe_fp8_terms.py configs/megatron-bridge/FILE.yaml --gpus N --gpu GPU
"""
import argparse
import sys
from pathlib import Path

from planner.errors import UserError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("flags", type=Path)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    args = parser.parse_args(argv)
    from planner.commands import evaluate_config
    from planner.cost import dataparallel, hosttime
    from planner.models import archs
    from planner.profiler import analytic_time, float8, te_fused, te_moe_float8
    from planner.profiler.formulas import Shape

    try:
        job = evaluate_config.read_job(args.flags, None)
        prediction = evaluate_config.predict(job, gpus=args.gpus, gpu_name=args.gpu)
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    profile, setup = prediction.profile, prediction.setup
    blocks = [layer for layer in profile.layers if layer.kind == "moe_block"]
    if not blocks:
        sys.stderr.write(f"{args.flags}: no MoE blocks\n")
        return 2
    arch, gpu = job.arch, archs.gpu(args.gpu)
    shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                  ep=job.ep)
    passes = analytic_time.block_work(arch, shape, moe=True)
    timed = te_fused.te_time(arch, shape, gpu, passes, moe=True)
    block = blocks[0]
    print(f"{args.flags} on {args.gpu}: {shape.tokens} tokens a microbatch, ep {shape.ep}, "
          f"FP8 scored: {setup.training.float8}")
    if timed is not None:
        print(f"one MoE block on TE's kernels, bf16: forward {timed.fwd_ms:.3f} ms, backward {timed.bwd_ms:.3f} ms")
        if timed.float8 is not None:
            print(f"  under FP8 (current scaling): forward {timed.float8.fwd_ms:.3f} ms, backward "
                  f"{timed.float8.bwd_ms:.3f} ms")
    transpose = te_moe_float8.transpose_bytes(gpu)
    for linear in te_moe_float8.moe_linears(arch, shape, block.name)[:4]:
        print(f"  {linear.fqn}: {linear.tokens} rows x {linear.k} -> {linear.n}; input quantize "
              f"{float8.te_input_bytes(linear, gpu) / 1e6:.1f} MB, grad_output quantize "
              f"{float8.te_grad_bytes(linear, gpu) / 1e6:.1f} MB (transpose {transpose} B an element)")
    dp = setup.data_parallel
    a2a = 4 * dataparallel.all_to_all_ms(block.a2a_bytes, dp.ep, dp.ep_gb_per_s) if dp.ep > 1 and dp.ep_gb_per_s else 0.0
    host = hosttime.host_block_ms(profile, setup, moe=True)
    print(f"the block as charged: forward {block.fwd_ms:.3f} ms, backward {block.bwd_ms:.3f} ms, all-to-all "
          f"4 x {block.a2a_bytes / 1e6:.1f} MB x {dp.ep - 1}/{dp.ep} at {dp.ep_gb_per_s} GB/s = {a2a:.3f} ms, "
          f"host floor {host[0]:.3f} / {host[1]:.3f} ms")
    names = {b.name for b in blocks}
    per_rank = [0] * job.pp  # stage s (of P x V) runs on rank s mod P (Megatron's interleaved placement)
    for index, stage in enumerate(prediction.stages):
        per_rank[index % job.pp] += sum(1 for name in stage.layers if name in names)
    microbatches = setup.pipeline.microbatches
    worst = max(per_rank)
    each = (max(block.fwd_ms, host[0]) + max(block.bwd_ms, host[1]) + a2a) / 1e3
    print(f"block-microbatches on the busiest rank: {microbatches} microbatches x {worst} blocks = "
          f"{microbatches * worst}; x {each * 1e3:.3f} ms = {microbatches * worst * each:.2f} s "
          f"(of which all-to-all {microbatches * worst * a2a / 1e3:.2f} s)")
    print(f"iteration: {prediction.cost.iteration_ms / 1e3:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
