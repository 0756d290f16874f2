"""A Megatron-LM config's pipeline time in Megatron's own interleaved order against torch's, the one ckplan reads
(docs/framework-facts.md §77, docs/published-runs.md §21.megspeed): the busiest stage times the cost model gives,
run through ckplan's simulator (planner/cost/schedule_time.py) in both orders, without the data-parallel collectives.

Megatron-LM 6e091e1b's forward_backward_pipelining_with_interleaving: virtual microbatch k runs chunk
(k mod P·V) // P forward (V - 1 - that backward) of microbatch (k // (P·V))·P + k mod P (its schedule table at
microbatch_group_size_per_vp_stage = P, the default); a rank runs min((P - r - 1)·2 + (V - 1)·P, M·V) forwards
first, and all M·V where M == P (all_warmup_microbatches); then one forward and one backward in turn; then the
remaining backwards.
usage: PYTHONPATH=. python scripts/megatron_order.py CONFIG.yaml --gpus N --gpu G [--gpus-per-node K] [--nvlink-domain D]"""

import argparse
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import schedule_time, schedules
from planner.cost.assembly import stage_sums
from planner.cost.chunked import schedule_of, stages_view
from planner.cost.score import placed_chunks


def megatron_order(order: schedules.Schedule) -> schedules.Schedule:
    """`order`'s ranks, chunks and microbatches in Megatron-LM's interleaved order (the module's docstring)."""
    P, V, M = order.num_ranks, order.num_chunks, order.num_microbatches
    total = M * V

    def action(rank: int, k: int, kind: str, unit: int) -> schedules.Action:
        chunk = (k % (P * V)) // P
        chunk = chunk if kind == "F" else V - 1 - chunk
        return schedules.Action(order.stages_of(rank)[chunk], chunk, kind, (k // (P * V)) * P + k % P, unit)

    ranks = []
    for rank in range(P):
        warmup = total if M == P else min((P - rank - 1) * 2 + (V - 1) * P, total)
        kinds = ["F"] * warmup
        for _ in range(total - warmup):
            kinds += ["F", "B"]
        kinds += ["B"] * (total - kinds.count("B"))
        counts = {"F": 0, "B": 0}
        acts = []
        for unit, kind in enumerate(kinds):
            acts.append(action(rank, counts[kind], kind, unit))
            counts[kind] += 1
        ranks.append(tuple(acts))
    return schedules.Schedule(order.name, P, V, M, order.stage_to_rank, tuple(ranks))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", type=Path)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--gpus-per-node", type=int, default=None)
    parser.add_argument("--nvlink-domain", type=int, default=None)
    args = parser.parse_args()
    found = predict(read_job(args.config, None), gpus=args.gpus, gpu_name=args.gpu, gpus_per_node=args.gpus_per_node,
                    nvlink_domain=args.nvlink_domain)
    profile, setup = found.profile, found.setup
    order = schedule_of(setup)
    if not order.actions or order.num_chunks == 1:
        raise SystemExit(f"{args.config}: not an interleaved pipeline (P {order.num_ranks}, V {order.num_chunks})")
    chunks = placed_chunks(found.stages, profile, order)
    view = stages_view(setup, order)
    times = []
    for k, (layers, options) in enumerate(chunks):
        sums = stage_sums(layers, options, stage=k, profile=profile, setup=view)
        forward = sums.forward_ms + sums.comm_ms / 2
        backward = max(sums.busy_ms - forward, 0.0)
        times.append(schedule_time.StageTimes(forward, backward / 2, backward / 2))
    mine = megatron_order(order)
    for name, sched in (("torch's order (ckplan's)", order), ("Megatron-LM's order", mine)):
        first_backward = [next(i for i, a in enumerate(sched.actions[r]) if a.kind == "B") for r in range(sched.num_ranks)]
        print(f"{name}: {schedule_time.makespan_ms(sched, stage_times=times):.3f} ms; forwards before the first "
              f"backward per rank {first_backward}")


if __name__ == "__main__":
    main()
