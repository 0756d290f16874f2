"""One run's time term by term, eager against compiled (docs/published-runs.md §13.ctime1): per layer the analytic
block's kernels at the roofline and its memory-bound bytes at the measured eager / fused rates (inductor's bytes from
compiled_time), per iteration terms.py's iteration (docs/published-runs.md §5) less the blocks, the profile's
embedding, norm and output layers and its loss: the step, FSDP2's copies and exposed DP. For torchtitan's LLaMA
rows under op-level SAC (the profile's blocks offer `op-sac`).

    PYTHONPATH=. python scripts/compile_decompose.py PROFILE TERMS.json ARCH SEQ MBS GPU [compiled] [loss-compiled]
"""
import json
import sys

from planner.models import archs
from planner.profiler import analytic_time, compiled_time, formulas
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms
from planner.profiler.roofline import kernel_ms


def kernels_ms(work, kind: str, gpu) -> float:
    return sum(kernel_ms(kernel, gpu) * count for kernel, count in work.kernels if kernel.kind.startswith(kind))


def passes(arch, shape, gpu, compiled: bool, layer) -> dict[str, tuple[float, float, float, int]]:
    """Per pass: (matmul ms, attention ms, memory-bound ms, memory-bound bytes)."""
    fwd, bwd, rec = analytic_time.block_work(arch, shape)
    accumulate = analytic_time.ACCUMULATE * formulas.block_params(arch, shape, moe=False) * shape.d
    mm = {name: (kernels_ms(w, "matmul", gpu), kernels_ms(w, "attention", gpu)) for name, w in (("f", fwd), ("b", bwd))}
    if not compiled:
        op_sac = next(option.recompute_ms for option in layer.recompute_options if option.name == "op-sac")
        rerun = membound_ms(fwd.bytes, gpu, "eager")
        return {"forward": (*mm["f"], rerun, fwd.bytes), "backward": (*mm["b"], membound_ms(bwd.bytes, gpu), bwd.bytes),
                "op-SAC rerun": (op_sac - rerun, 0.0, rerun, fwd.bytes)}
    found = compiled_time.compiled_block_bytes(arch, shape, moe=False)
    (fwd0, bwd0), (fwd_sac, bwd_sac) = found["none"], found["op-sac"]
    extra = fwd_sac + bwd_sac - fwd0 - bwd0
    rerun_mm = sum(kernel_ms(kernel, gpu) for kernel in compiled_time._rerun_kernels(arch, shape, "op-sac", rec))
    return {"forward": (*mm["f"], membound_ms(fwd0, gpu, "fused"), fwd0),
            "backward": (*mm["b"], membound_ms(bwd0, gpu, "fused") + membound_ms(accumulate, gpu), bwd0 + accumulate),
            "op-SAC rerun": (rerun_mm, 0.0, membound_ms(extra, gpu, "fused"), extra)}


def main():
    from planner.schema import Profile

    profile_path, terms_path, arch_name, seq, mbs, gpu_name, *flags = sys.argv[1:]
    arch, gpu = archs.arch(arch_name), archs.gpu(gpu_name)
    shape = Shape(seq_len=int(seq), micro_batch_size=int(mbs))
    profile = Profile.model_validate_json(open(profile_path).read())
    blocks = [layer for layer in profile.layers if layer.name.startswith("layers.")]
    rows = passes(arch, shape, gpu, "compiled" in flags, blocks[0])
    for name, (mm, attention, memory, num_bytes) in rows.items():
        print(f"  {name:13s} {mm + attention + memory:7.2f} ms = matmul {mm:6.2f} + attention {attention:6.2f} + "
              f"memory-bound {memory:6.2f} ({num_bytes / shape.tokens:,.0f} B/token)")
    layer_ms = sum(mm + attention + memory for mm, attention, memory, _ in rows.values())
    others = sum(layer.fwd_ms + layer.bwd_ms for layer in profile.layers if not layer.name.startswith("layers.")) / 1e3
    loss = (profile.compiled_loss_ms if "loss-compiled" in flags else profile.loss_ms) / 1e3
    iteration = json.load(open(terms_path))["iteration_s"]
    total = len(blocks) * layer_ms / 1e3
    print(f"  iteration {iteration:.3f} s = {len(blocks)} blocks {total:.3f} (matmul+attention "
          f"{len(blocks) * sum(r[0] + r[1] for r in rows.values()) / 1e3:.3f}, memory-bound "
          f"{len(blocks) * sum(r[2] for r in rows.values()) / 1e3:.3f}) + embedding/norm/output {others:.3f} + loss "
          f"{loss:.3f} + step, FSDP2 copies, exposed DP {iteration - total - others - loss:.3f}")


if __name__ == "__main__":
    main()
