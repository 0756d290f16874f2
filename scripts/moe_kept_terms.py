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


def main(argv: list[str]) -> int:
    job = evaluate_config.read_job(Path(argv[0]), None)
    profile = evaluate_config._profile(job, archs.gpu(argv[1]))
    found = te_moe_kept.mixtures(profile)
    if found is None:
        print("no mixture te_moe_kept rewrites in this profile")
        return 1
    print("analytic (eager) mixture, MiB:", [round(b / MIB, 1) for b in found["generic"]],
          f"= {sum(found['generic']) / MIB:.1f}")
    print("Megatron-core MoE layer, MiB:", [round(b / MIB, 1) for b in found["mcore"]],
          f"= {sum(found['mcore']) / MIB:.1f}")
    print(f"activation recompute frees: analytic {found['act_generic'] / MIB:.1f}, "
          f"Megatron moe_act {found['act_mcore'] / MIB:.1f} MiB")
    after = te_moe_kept.megatron_moe_profile(profile, runtimes._of("megatron", None, False))
    old = next(layer for layer in profile.layers if layer.kind == "moe_block")
    new = next(layer for layer in after.layers if layer.name == old.name)
    for a, b in zip(old.recompute_options, new.recompute_options, strict=True):
        print(f"  {a.name:28s} {a.kept_bytes / MIB:10.1f} -> {b.kept_bytes / MIB:10.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
