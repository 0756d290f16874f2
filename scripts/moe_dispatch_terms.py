"""A Megatron config's MoE block, one microbatch on the busiest layout, term by term for the dispatch and the host
floor (docs/published-runs.md §27.e1hybrid): the block's device forward and backward, its dispatch + combine a pass
(at the flex backend's rates where the config names one, else NCCL's all-to-all), the host's issue time of each
pass, and the host-bound time charged beyond them.

usage: PYTHONPATH=<checkout> python scripts/moe_dispatch_terms.py CONFIG.yaml GPUS GPU
"""
import sys
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import hosttime, rules
from planner.cost.layers import layer_costs


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    job = read_job(Path(argv[0]), None)
    prediction = predict(job, gpus=int(argv[1]), gpu_name=argv[2])
    setup, profile = prediction.setup, prediction.profile
    backend = setup.data_parallel.ep_dispatch
    print(f"exchange: {backend.source + f', {backend.rank_copies:.4f} of the copies a rank' if backend else 'NCCL all-to-all'}"
          f"; EP link {setup.data_parallel.ep_gb_per_s} GB/s")
    block = next((layer for layer in layer_costs(profile) if layer.kind == "moe_block"), None)
    if block is None:
        print("no MoE block")
        return 1
    exchange = rules.all_to_all_ms(block, 0, setup) / 2
    fwd_host, bwd_host, _ = hosttime._block_host(block, profile, setup)
    print(f"per microbatch, ms: device forward {block.fwd_ms:.3f}, backward {block.bwd_ms:.3f}; dispatch + combine "
          f"a pass {exchange:.3f}; host forward {fwd_host:.3f}, backward {bwd_host:.3f}; host-bound charged "
          f"{hosttime.host_bound_ms(block, 0, profile, setup):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
