"""A Megatron-FSDP job's caching-allocator replay (planner/cost/reserve_megatron_fsdp.py), step by step: each step's
allocated and reserved peaks, the request that took the last new segment and what was allocated then; and, as a
the same events under the card's cap less NCCL's buffers with torch's out-of-memory path
(CachingAllocator(cap_bytes=...), planner/cost/allocator_segments.py: release_cached_blocks frees every cached
segment no live block is in, and the request is retried; num_alloc_retries counts it): the reserved peak such a run
would log, the retries it would make, and the first request no release makes room for (an OutOfMemoryError in
torch; the cost model's fit, planner/cost/capped_reserve.py, plays the same path). GiB.
--wgrads-late: each layer's unfused bf16 gradients made at its post-backward, after its recorded backward's frees (the
replay makes them as its record makes its last tensor, an upper bound): the other end of where autograd makes them.
--record-order: each layer's backward in its record's own order (every saved tensor held to the layer's last gradient,
the unfused gradients made together) in place of Transformer Engine's nodes (planner/cost/te_block_backward.py);
--no-queue-capacity: the reduce queue's element capacity (wait_for_previous_grad_reduce) not applied.
usage: python scripts/fsdp_replay_terms.py --from-megatron FILE --gpus N --gpu KIND [--wgrads-late] [--record-order]
       [--no-queue-capacity]"""

import argparse
import dataclasses
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import allocator, reserve_megatron_fsdp
from planner.cost.allocator import Alloc, Free
from planner.cost.reserve import records_for
from planner.cost.reserve_megatron import MAX_STEPS, _output_bytes, last_stage_loss

GIB = 1 << 30


def wgrads_late(events: list) -> list:
    """The events with each layer's ("wgrad", ...) allocations moved to its post-backward: just before its bucket's
    request where it has one of its own (an edge module), else just before the first of them is freed."""
    made = {}
    for event in events:
        if isinstance(event, Alloc) and event.key[0] == "wgrad":
            made.setdefault(event.key[1:3], []).append(event)
    out = [e for e in events if not (isinstance(e, Alloc) and e.key[0] == "wgrad")]
    for layer, allocs in made.items():
        at = out.index(Free(("wgrad", *layer, 0)))
        if isinstance(out[at - 1], Alloc) and out[at - 1].key == ("gbucket", *layer):
            at -= 1
        out[at:at] = allocs
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-megatron", type=Path, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--wgrads-late", action="store_true")
    parser.add_argument("--record-order", action="store_true",
                        help="each layer's record's own backward order (every saved tensor to its last gradient)")
    parser.add_argument("--no-queue-capacity", action="store_true",
                        help="the reduce queue's element capacity not applied (two buckets queued alone)")
    args = parser.parse_args()
    prediction = predict(read_job(args.from_megatron, None), gpus=args.gpus, gpu_name=args.gpu)
    profile, setup, plan, cost = prediction.profile, prediction.setup, prediction.stages[0], prediction.cost.stages[0]
    if not reserve_megatron_fsdp.replays(setup):
        raise SystemExit("this job's step is not Megatron-FSDP's double buffer on one stage: no replay here")
    by_name = {layer.name: layer for layer in profile.layers}
    layers = [by_name[name] for name in plan.layers]
    options = [plan.option(name) for name in plan.layers]
    records = records_for(layers, options)
    loss, keeps_logits = last_stage_loss(profile, setup, _output_bytes(records[-1]))
    static = reserve_megatron_fsdp.static_of(layers, cost, profile=profile, setup=setup)
    if args.no_queue_capacity:
        static = dataclasses.replace(static, queue_capacity=None)
    programs = None if args.record_order else reserve_megatron_fsdp.backward_programs(layers, records, profile)
    events, one_step = reserve_megatron_fsdp.step_player(layers, options, records, static=static,
                                                         num_microbatches=setup.pipeline.microbatches, loss=loss,
                                                         keeps_logits=keeps_logits, programs=programs)
    nccl = sum(cost.nccl_buffers.values())
    print(f"{args.from_megatron.name}: cost model allocated peak {cost.peak_bytes / GIB:.2f}, reserved "
          f"{cost.reserved_bytes / GIB:.2f} ({cost.reserved_by}), NCCL {nccl / GIB:.2f}, cap {cost.cap_bytes / GIB:.2f}")
    state, capped = allocator.CachingAllocator(), allocator.CachingAllocator(cap_bytes=int(cost.cap_bytes - nccl))
    for target in (state, capped):
        allocator.play(target, events)
    for index in range(MAX_STEPS):
        step = wgrads_late(one_step(index)) if args.wgrads_late else one_step(index)
        before = (state.allocated_peak, state.reserved_peak)
        grew = None
        for event in step:
            reserved = state.reserved
            allocator.play(state, [event])
            allocator.play(capped, [event])
            if state.reserved > reserved:
                grew = (event, state.allocated)
        print(f"  step {index}: allocated peak {state.allocated_peak / GIB:.2f}, reserved peak "
              f"{state.reserved_peak / GIB:.2f}" + (f"; last new segment for {grew[0].key} ({grew[0].nbytes / GIB:.2f}),"
                                                   f" allocated then {grew[1] / GIB:.2f}" if grew else ""))
        if index >= 1 and (state.allocated_peak, state.reserved_peak) == before:
            break
    oom = capped.oom
    print(f"  under the cap less NCCL ({capped.cap / GIB:.2f}) with torch's retry: reserved peak "
          f"{capped.reserved_peak / GIB:.2f}, retries {capped.retries}, allocated peak {capped.allocated_peak / GIB:.2f}; "
          "the first request past the cap after the release (torch's OutOfMemoryError): " +
          (f"{oom.key} ({oom.nbytes / GIB:.2f}; reserved then {oom.reserved / GIB:.2f}, allocated "
           f"{oom.allocated / GIB:.2f})" if oom else "none"))


if __name__ == "__main__":
    main()
