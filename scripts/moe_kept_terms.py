"""Print a Megatron flags file's MoE block kept bytes: the analytic profile's eager mixture and what Megatron-core's
MoE layer keeps (planner/cost/te_moe_kept.py, docs/framework-facts.md §95), and each recompute option's kept bytes
before and after (docs/published-runs.md §23.moemem).

usage: PYTHONPATH=<checkout> python scripts/moe_kept_terms.py configs/megatron-bridge/FILE.yaml GPU
"""
import sys
from pathlib import Path

from planner.commands import evaluate_config
from planner.cost import runtimes, te_moe_kept
from planner.models import archs

MIB = 2**20
GENERIC = ("router fp32 probabilities T·E", "top-k indices int64 T·k", "top-k weights fp32 T·k",
           "dispatched tokens S·h", "dispatch/combine indices int64 S", "SwiGLU (or clamped) S·f tensors ...",
           "weighted outputs S·h")
MEGATRON = ("fused router fp32 scores T·E", "routing map bool T·E", "permuted probs fp32 S",
            "linear_fc1 input S·h", "linear_fc1 output S·2f", "(clamped) the cat S·2f / linear_fc2 input S·f",
            "linear_fc2 input S·f")


def main(argv: list[str]) -> int:
    job = evaluate_config.read_job(Path(argv[0]), None)
    profile = evaluate_config._profile(job, archs.gpu(argv[1]))
    found = te_moe_kept.mixtures(profile)
    if found is None:
        print("no mixture te_moe_kept rewrites in this profile")
        return 1
    print("analytic (eager) mixture, MiB:", [round(b / MIB, 1) for b in found["generic"]],
          f"= {sum(found['generic']) / MIB:.1f}")
    print("Megatron-core MoE layer, MiB:", [round(b / MIB, 1) for b in found["megatron"]],
          f"= {sum(found['megatron']) / MIB:.1f}")
    print(f"activation recompute frees: analytic {found['act_generic'] / MIB:.1f}, "
          f"Megatron moe_act {found['act_megatron'] / MIB:.1f} MiB")
    after = te_moe_kept.megatron_moe_profile(profile, runtimes._of("megatron", None, False))
    old = next(layer for layer in profile.layers if layer.kind == "moe_block")
    new = next(layer for layer in after.layers if layer.name == old.name)
    for a, b in zip(old.recompute_options, new.recompute_options, strict=True):
        print(f"  {a.name:28s} {a.kept_bytes / MIB:10.1f} -> {b.kept_bytes / MIB:10.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
