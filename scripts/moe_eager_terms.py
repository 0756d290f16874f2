"""One MoE block's Transformer Engine record (te_fused.te_time) for a Megatron-LM flags file with and without the
eager pieces Megatron-core runs around TE's kernels (planner/profiler/te_moe_eager.py: GPT-OSS's clamp, linear_fc2's
weighted bias, FP8's row padding, YaRN's unfused rotary), their bytes, and the block-microbatch difference (docs/published-runs.md
§29.moegemm).

usage: PYTHONPATH=<checkout> python scripts/moe_eager_terms.py configs/megatron-bridge/FILE.yaml GPU
"""
import dataclasses
import sys
from pathlib import Path

from planner.profiler import analytic_time, te_fused, te_moe_eager

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_job  # noqa: E402


def _record(arch, shape, gpu, padding: bool):
    saved = te_moe_eager.fp8_padding_bytes
    if not padding:
        te_moe_eager.fp8_padding_bytes = lambda arch, shape: (0, 0)
    try:
        return te_fused.te_time(arch, shape, gpu, analytic_time.block_work(arch, shape, moe=True), moe=True)
    finally:
        te_moe_eager.fp8_padding_bytes = saved


def _passes(record, fp8: bool) -> tuple[float, float, float]:
    if fp8 and record.float8 is not None:
        return record.float8.fwd_ms, record.float8.bwd_ms, record.recompute_ms.get("mlp-act", 0.0)
    return record.fwd_ms, record.bwd_ms, record.recompute_ms.get("mlp-act", 0.0)


def main(argv: list[str]) -> int:
    found = moe_job.read(argv, "moe_eager_terms.py")
    if found is None:
        return 2
    job, gpu, shape = found
    fp8 = job.modelled.float8  # --fp8-format: the record's Float8 passes are the block's
    plain = dataclasses.replace(job.arch, swiglu_limit=None, expert_bias=False, rope_scaling=None)
    before, after = _passes(_record(plain, shape, gpu, False), fp8), _passes(_record(job.arch, shape, gpu, True), fp8)
    eager, pad = te_moe_eager.eager_bytes(job.arch, shape), te_moe_eager.fp8_padding_bytes(job.arch, shape)
    print(f"{argv[0]} on {gpu.name}: {shape.tokens} tokens a microbatch x top-{job.arch.num_experts_per_tok}, ep "
          f"{shape.ep}; clamp {job.arch.swiglu_limit}, experts' biases {job.arch.expert_bias}, FP8 record read: {fp8}")
    print(f"eager bytes (clamp + weighted bias): {eager[0] / 1e9:.3f} GB forward, {eager[1] / 1e9:.3f} backward; "
          f"the eager profile's repeated biases taken out: "
          f"{te_moe_eager.eager_expert_bias_bytes(job.arch, shape)[0] / 1e9:.3f} / "
          f"{te_moe_eager.eager_expert_bias_bytes(job.arch, shape)[1] / 1e9:.3f} GB")
    if fp8:
        print(f"FP8 padding: {pad[0] / 1e9:.3f} GB each way (fused rate)")
    for name, b, a in zip(("forward", "backward", "moe_act rerun"), before, after):
        print(f"{name}: {b:.3f} -> {a:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
