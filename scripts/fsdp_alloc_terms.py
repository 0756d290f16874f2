"""A Megatron-FSDP job's allocated peak two ways, term by term (docs/published-runs.md §31.fsdpalloc): the cost
model's (static, the stage constant of buffers, the layers' kept bytes, the transient and the layer it comes from with
that layer's extra and kept) and the caching allocator's replay (planner/cost/reserve_megatron_fsdp.py) at its own
peak: what is alive then, by kind, summed as requested (the allocator's 512 B rounding left out). GiB.
usage: python scripts/fsdp_alloc_terms.py --from-megatron FILE --gpus N --gpu KIND"""

import argparse
import collections
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import assembly, reserve_megatron_fsdp
from planner.cost.allocator import Alloc
from planner.cost.reserve import plan_records
from planner.cost.reserve_megatron import _output_bytes, last_stage_loss

GIB = 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-megatron", type=Path, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    args = parser.parse_args()
    seen = []
    net = assembly.net_extra_bytes

    def spy(extra_and_kept, *floor):  # the stage's (extra, kept) per layer, as the transient nets them
        seen.append(list(extra_and_kept))
        return net(extra_and_kept, *floor)

    assembly.net_extra_bytes = spy
    prediction = predict(read_job(args.from_megatron, None), gpus=args.gpus, gpu_name=args.gpu)
    assembly.net_extra_bytes = net
    profile, setup, plan, cost = prediction.profile, prediction.setup, prediction.stages[0], prediction.cost.stages[0]
    print(f"cost model: allocated peak {cost.peak_bytes / GIB:.3f} = static {cost.static_bytes / GIB:.3f} + buffers "
          f"{cost.buffer_bytes / GIB:.3f} + kept {cost.kept_bytes / GIB:.3f} x {cost.in_flight} + transient "
          f"{cost.transient_bytes / GIB:.3f} (+ the workspaces)")
    pairs, later, best = seen[-1], 0.0, None
    for i in range(len(pairs) - 1, -1, -1):
        extra, kept = pairs[i]
        if best is None or extra - later > best[0]:
            best = (extra - later, i, extra, kept, later)
        later += kept
    names = plan.layers + ["(the loss)"]
    print(f"  the transient from {names[best[1]]}: its extra {best[2] / GIB:.3f} (kept {best[3] / GIB:.3f}) less the "
          f"later layers' kept {best[4] / GIB:.3f}")
    if not reserve_megatron_fsdp.replays(setup):
        raise SystemExit("this job's step is not Megatron-FSDP's double buffer on one stage: no replay here")
    layers, options, records = plan_records(plan, profile)
    loss, keeps = last_stage_loss(profile, setup, _output_bytes(records[-1]))
    events, one_step = reserve_megatron_fsdp.step_player(
        layers, options, records, static=reserve_megatron_fsdp.static_of(layers, cost, profile=profile, setup=setup),
        num_microbatches=setup.pipeline.microbatches, loss=loss, keeps_logits=keeps,
        programs=reserve_megatron_fsdp.backward_programs(layers, records, profile))
    live, now, peak = {}, 0, (0, {}, None)
    for step, batch in [("static", events), *((index, one_step(index)) for index in range(3))]:
        for event in batch:
            if isinstance(event, Alloc):
                live[event.key] = event.nbytes
                now += event.nbytes
                if now > peak[0]:
                    peak = (now, dict(live), (step, event.key))
            else:
                now -= live.pop(event.key, 0)
    total, alive, at = peak
    print(f"replay: allocated peak {total / GIB:.3f} at step {at[0]}'s {at[1]}")
    kinds = collections.defaultdict(int)
    last = len(layers) - 1
    for key, size in alive.items():
        if isinstance(key[0], str):
            kind = key[0] if key[0] != "wgrad" else f"wgrad of layer {key[2]}"
        else:
            kind = f"layer {key[1]}" if key[1] in (last, last - 1, "loss") else "the other layers"
        kinds[kind] += size
    for kind, size in sorted(kinds.items()):
        print(f"  {kind:24s} {size / GIB:8.3f}")


if __name__ == "__main__":
    main()
