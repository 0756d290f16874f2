"""A config's iteration term by term (docs/published-runs.md §18.megtime): the busiest rank's compute (its
tensor-parallel collectives, the "time" quantity's terms, in it), its sends and schedule actions, and the bubble, from the schedule's simulation without the
data-parallel collectives; what Megatron-LM's DDP adds beside the schedule (planner/cost/megatron_dp.py,
under runtime megatron); and the slowest rank's optimizer step (its exposed gathers included). With --terms, the
busiest rank's "time" and "comm" per term (docs/published-runs.md §19.megfunc): each layer row of the cost model's
TERMS summed over the rank's layers, and each stage row over its stages (the loss's on the last stage's rank),
x the microbatches, and the "step" rows once, in seconds a step. With --published S, the gap to a published step
and its share a block-microbatch on the critical path (docs/published-runs.md §29.grows). With --host-split, a
block-microbatch of the busiest rank's first block, device against host, pass by pass (docs/published-runs.md §35.tehost).
usage: PYTHONPATH=. python scripts/decompose_megatron.py CONFIG.yaml --gpus N --gpu G [--gpus-per-node K] [--nvlink-domain D] [--terms]
       [--published S] [--host-split]"""

import argparse
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import hosttime, schedule_time, splittime, stagesends, terms
from planner.cost.assembly import stage_sums
from planner.cost.chunked import schedule_of, stages_view
from planner.cost.score import placed_chunks

try:  # a tree before megatron_dp.py (the "before" of §18.megtime): its DP terms are all in the step
    from planner.cost import megatron_dp
    from planner.cost.dataparallel import ddp_buckets
except ImportError:
    megatron_dp, ddp_buckets = None, lambda setup: False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--gpus-per-node", type=int, default=None)
    parser.add_argument("--nvlink-domain", type=int, default=None)
    parser.add_argument("--terms", action="store_true", help="the busiest rank's time and comm, term by term")
    parser.add_argument("--published", type=float, default=None,
                        help="the published step (s): print the gap and its share a block pass on the critical path")
    parser.add_argument("--host-split", action="store_true",
                        help="a block-microbatch of the busiest rank's first block: device and host, pass by pass")
    args = parser.parse_args()
    found = predict(read_job(args.config, None), gpus=args.gpus, gpu_name=args.gpu, gpus_per_node=args.gpus_per_node,
                    nvlink_domain=args.nvlink_domain)
    profile, setup = found.profile, found.setup
    order = schedule_of(setup)
    chunks = placed_chunks(found.stages, profile, order)
    view = stages_view(setup, order)
    sums = [stage_sums(layers, options, stage=k, profile=profile, setup=view) for k, (layers, options) in enumerate(chunks)]
    # the sends the runtime runs beside the compute leave the passes and are the receivers' wait (stagesends.py)
    beside = stagesends.beside_ms(order, [layers for layers, _ in chunks], view)
    times = splittime.stage_times(sums, splits=None, beside=beside)
    bare = schedule_time.makespan_ms(order, stage_times=times, stage_sends=beside)
    with_dp = bare
    if ddp_buckets(setup) and order.actions:
        windows = [sum(sums[k].step_ms for k in order.stages_of(r)[1:]) for r in range(order.num_ranks)]
        with_dp = megatron_dp.makespan_ms(order, times, [layers for layers, _ in chunks], setup, profile=profile,
                                          step_window_ms=windows, stage_sends=beside)
    steps = [sum(sums[k].step_ms for k in order.stages_of(r)) for r in range(order.num_ranks)]
    m = setup.pipeline.microbatches
    busy = [m * sum(sums[k].busy_ms for k in order.stages_of(r)) for r in range(order.num_ranks)]
    rank = max(range(order.num_ranks), key=lambda r: busy[r])
    compute = m * sum(sums[k].time_ms for k in order.stages_of(rank))
    comm = m * sum(sums[k].comm_ms for k in order.stages_of(rank))
    print(f"iteration {found.cost.iteration_ms / 1e3:.3f} s; busiest rank {rank}: compute (TP collectives in it) {compute / 1e3:.3f}, "
          f"sends and actions {comm / 1e3:.3f}, bubble {(bare - busy[rank]) / 1e3:.3f}, DP beside the schedule "
          f"{(with_dp - bare) / 1e3:.3f}, step (exposed gathers in it) {max(steps) / 1e3:.3f}")
    if args.terms:
        for name, seconds in rank_terms(chunks, order.stages_of(rank), profile, view, m):
            print(f"  {seconds:8.4f}  {name}")
    if args.host_split:
        for line in host_split(chunks, order.stages_of(rank), profile, view):
            print(line)
    if args.published is not None:
        gap_s = args.published - found.cost.iteration_ms / 1e3
        passes = critical_block_passes(chunks, order, m)
        print(f"published {args.published:.4f} s: gap {gap_s:.4f} s a step over {passes} block-microbatches on the "
              f"critical path, {gap_s / passes * 1e3:.2f} ms each" if passes else f"gap {gap_s:.4f} s (no blocks)")


BLOCKS = ("decoder_block", "moe_block")


def critical_block_passes(chunks, order, microbatches: int) -> int:
    """Block-microbatches on a pipeline's critical path, as a one-chunk 1F1B or an interleaved schedule's closed form
    counts them: (m x V + P - 1) x the blocks of the fullest chunk (P ranks, V chunks a rank); m x blocks with no
    pipeline."""
    blocks = [sum(layer.kind in BLOCKS for layer in layers) for layers, _ in chunks]
    per_rank = max(len(order.stages_of(r)) for r in range(order.num_ranks))
    return (microbatches * per_rank + order.num_ranks - 1) * max(blocks, default=0)


def host_split(chunks, stages, profile, view) -> list[str]:
    """The rank's first block, a microbatch: its forward's and backward's device time (the profile's pass, as
    hosttime.host_bound_ms compares it) beside the host's (the record's block, its DDP hooks, its collectives' issue,
    the pre-hooks), and what the pass is charged, max(device, host); no lines where the rank has no block."""
    for k in stages:
        for layer, ckpt in zip(*chunks[k]):
            if layer.kind not in BLOCKS:
                continue
            fwd_host, bwd_host, _ = hosttime._block_host(layer, profile, view)
            rows = [("forward", layer.fwd_ms, fwd_host), ("backward", layer.bwd_ms, bwd_host)]
            lines = [f"a block-microbatch ({layer.name}, recompute option {int(ckpt)}): device / host / charged ms"]
            lines += [f"  {name:9s} {dev:.3f} / {host:.3f} / {max(dev, host):.3f}" for name, dev, host in rows]
            dev, host = layer.fwd_ms + layer.bwd_ms, fwd_host + bwd_host
            charged = sum(max(d, h) for _, d, h in rows)
            lines.append(f"  both      {dev:.3f} / {host:.3f} / {charged:.3f}")
            return lines
    return []


def rank_terms(chunks, stages, profile, view, microbatches: int) -> list[tuple[str, float]]:
    """(term, seconds a step) for the rank's chunks `stages`: each "time" and "comm" layer row of TERMS over
    their layers and options, and each such stage row over the stages, x the microbatches; each "step" layer row
    once; rows that charge the rank nothing left out."""
    ctx = terms.Context(profile, view)
    found = []
    for term in terms.TERMS:
        if term.where != "layer" or term.quantity not in ("time", "comm"):
            continue
        total = sum(term.value(layer, ckpt, ctx) for k in stages for layer, ckpt in zip(*chunks[k]))
        if total:
            found.append((f"[{term.quantity}] {term.name}", microbatches * total / 1e3))
    for term in terms.TERMS:  # the step's rows, once a step
        if term.where != "layer" or term.quantity != "step":
            continue
        total = sum(term.value(layer, ckpt, ctx) for k in stages for layer, ckpt in zip(*chunks[k]))
        if total:
            found.append((f"[step] {term.name}", total / 1e3))
    for term in terms.TERMS:  # the stage rows (the loss's, on the last stage's rank)
        if term.where != "stage" or term.quantity not in ("time", "comm"):
            continue
        total = sum(term.value(k, ctx) for k in stages)
        if total:
            found.append((f"[{term.quantity}, stage] {term.name}", microbatches * total / 1e3))
    return found


if __name__ == "__main__":
    main()
