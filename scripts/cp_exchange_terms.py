"""Per block of torchtitan's CP rows (C2-C4, C6-C8): the K/V exchange's exposed time as the eager ring overlaps it
and as 9dec370's compiled ring waits for it, and the ring's memory-bound time (planner/cost/contextparallel.py;
docs/published-runs.md §16.cp8, docs/framework-facts.md §37); then the block's passes split into the attention
core, the rest, the exchange and the ring's memory-bound work (§19.cptime), and the rest as --compile times it
where the profile recorded compiled times (the 8B's, made --compiled: §21.cprows).

    PYTHONPATH=. python scripts/cp_exchange_terms.py PROFILE_DIR

PROFILE_DIR holds the rows' analytic profiles as cp_profiles.sh names them (l8_s65536_cp2.json, ...,
l405_s262144_cp8.json): `ckplan profile --arch llama3-8b | llama3.1-405b --tp 8 --sp --seq-len S --cp N
--micro-batch-size 1 --gpu h100-96g`.
"""
import json
import sys

from planner.cost import comm, contextparallel
from planner.cost.layers import ExchangeCost
from planner.models import archs
from planner.schema import TrainSetup

ROWS = [("C2", "l8_s65536_cp2", 1), ("C3", "l8_s131072_cp4", 1), ("C4", "l8_s262144_cp8", 1),
        ("C6", "l405_s65536_cp2", 8), ("C7", "l405_s131072_cp4", 8), ("C8", "l405_s262144_cp8", 8)]


def block_ms(moved, link, waited: bool) -> tuple[float, float, float]:
    """Forward, backward (its gather reused from the rerun) and a fully recomputed block's total."""
    forward = contextparallel.pass_exposed_ms(moved, "forward", "allgather", link, waited=waited)
    backward = contextparallel.pass_exposed_ms(moved, "backward", "allgather", link, False, waited)
    return forward, backward, 2 * forward + backward


def main(folder: str) -> None:
    gpu = archs.gpu("h100-96g")
    for name, profile, tp in ROWS:
        data = json.load(open(f"{folder}/{profile}.json"))
        record = next(layer["context_parallel"] for layer in data["layers"] if layer.get("context_parallel"))
        exchange = ExchangeCost(**record)
        link = comm.job_links(gpu, tp=tp, cp=exchange.ranks, pp_stride=64, gpus_per_node=8, nics_per_gpu=1)["cp"]
        setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40],
                           precision="bf16-mixed", runtime="torchtitan", runtime_version="9dec370",
                           context_parallel=exchange.ranks, cp=exchange.ranks, compile=True,
                           cp_gb_per_s=link.gb_per_s, cp_step_latency_ms=link.step_latency_ms)
        moved = contextparallel.as_exchanged(exchange, setup.training)

        rate = data["assumptions"]["membound_tbps"]["fused"] * 1e9
        ring = [contextparallel.ring_bytes(moved, which, True) / rate for which in ("forward", "backward")]
        cp = exchange.ranks
        print(f"{name}: {link.gb_per_s:.1f} GB/s; K/V {moved.kv_bytes / 2**20:.0f} MiB as exchanged, all-gather "
              f"{cp * moved.kv_bytes / 2**30:.2f} GiB, dK/dV pass {2 * moved.kv_bytes / 2**30:.2f} GiB; attention a "
              f"step {exchange.attention_fwd_ms / cp:.1f} / {exchange.attention_bwd_ms / cp:.1f} ms; exposed "
              "forward / backward / block, overlapped %.2f / %.2f / %.2f, waited %.2f / %.2f / %.2f ms; ring "
              "memory-bound %.2f / %.2f ms" % (*block_ms(moved, link, False), *block_ms(moved, link, True), *ring))
        layer = next(layer for layer in data["layers"] if layer.get("context_parallel"))
        passes = (layer["float8"]["fwd_ms"], layer["float8"]["recompute_ms"]["full"], layer["float8"]["bwd_ms"])
        attention = (exchange.attention_fwd_ms, exchange.attention_fwd_ms, exchange.attention_bwd_ms)
        waited = block_ms(moved, link, True)[2]
        total = sum(passes) + waited + 2 * ring[0] + ring[1]
        print("    a block under full AC, Float8 (the rows' setting), eager, forward / rerun / backward ms: attention "
              + " / ".join(f"{a:.1f}" for a in attention) + ", the rest " +
              " / ".join(f"{p - a:.1f}" for p, a in zip(passes, attention)) +
              f"; exchange waited {waited:.1f}, ring memory-bound {2 * ring[0] + ring[1]:.1f}: {total:.1f} ms")
        compiled = compiled_passes(data)
        if compiled is not None:  # the profile's compiled record, as --compile times the block (§21.cprows)
            print("    compiled (--compile: the rest of the block at the rank's tokens), the rest " +
                  " / ".join(f"{p - a:.1f}" for p, a in zip(compiled, attention)) +
                  f": {sum(compiled) + waited + 2 * ring[0] + ring[1]:.1f} ms")


def compiled_passes(data: dict) -> tuple[float, float, float] | None:
    """The first CP block's Float8 forward, full rerun and backward as --compile times them
    (compiled_time.timed_layers); None where the profile recorded no compiled time."""
    from planner.profiler.compiled_time import timed_layers
    from planner.schema import Profile

    profile, changed = timed_layers(Profile.model_validate(data))
    if not changed:
        return None
    fp8 = next(layer for layer in profile.layers if layer.context_parallel is not None).float8
    return fp8.fwd_ms, fp8.recompute_ms["full"], fp8.bwd_ms


if __name__ == "__main__":
    main(sys.argv[1])
