"""The last pipeline rank of a Megatron-LM job, term by term (docs/published-runs.md §18.megce): static, buffers,
the in-flight microbatches' kept bytes, the transient and the layer that sets it, the loss region's kept and
scratch, each layer's extra at its backward beyond what later layers keep; the cost model's allocated peak beside
the caching allocator replay's own (reserve_megatron). GiB; MiB for the loss terms.
usage: python scripts/megatron_last_stage_terms.py --from-megatron FILE --gpus N --gpu KIND [--gpus-per-node N] [--nvlink-domain D]"""

import argparse
from pathlib import Path

from planner.commands.evaluate_config import predict, read_job
from planner.cost import reserve_megatron, reserve_megatron_chunks
from planner.cost.assembly import option_indices
from planner.cost.layers import layer_costs
from planner.cost.terms import Context, layer_value, stage_value

GIB, MIB = 1 << 30, 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-megatron", type=Path, required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu", required=True)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--nvlink-domain", type=int)
    args = parser.parse_args()
    prediction = predict(read_job(args.from_megatron, None), gpus=args.gpus, gpu_name=args.gpu,
                         gpus_per_node=args.gpus_per_node, nvlink_domain=args.nvlink_domain)
    profile, setup, stages, cost = prediction.profile, prediction.setup, prediction.stages, prediction.cost
    rank = len(stages) - 1
    plan, stage = stages[rank], cost.stages[rank]
    ctx = Context(profile, setup)
    by_name = {layer.name: layer for layer in layer_costs(profile)}
    print(f"{args.from_megatron.name} rank {rank}: static {stage.static_bytes / GIB:.3f}, buffers "
          f"{stage.buffer_bytes / GIB:.3f}, kept {stage.kept_bytes / GIB:.3f} x {stage.in_flight} in flight, "
          f"transient {stage.transient_bytes / GIB:.3f}, step scratch {stage.step_scratch_bytes / GIB:.3f}; "
          f"allocated peak {stage.peak_bytes / GIB:.3f}")
    last_stage = setup.pipeline.stages - 1  # the model's last pipeline stage (its last chunk on this rank)
    print(f"  loss kept {stage_value('kept', last_stage, ctx) / MIB:.1f} MiB, loss scratch "
          f"{stage_value('extra', last_stage, ctx) / MIB:.1f} MiB, logits {profile.layers[-1].output_bytes / MIB:.1f} MiB")
    later = stage_value("kept", last_stage, ctx)
    layers = [by_name[name] for name in plan.layers]
    for layer, index in list(zip(layers, option_indices(plan, layers)))[::-1][:3]:
        name, option = layer.name, plan.option(layer.name)
        extra, kept = layer_value("extra", layer, index, ctx), layer_value("kept", layer, index, ctx)
        print(f"  {name} ({option}): extra {extra / MIB:.1f} MiB, beyond later kept {(extra - later) / MIB:.1f} MiB")
        later += kept
    replayed = (reserve_megatron_chunks.replay_rank(plan, stage, rank=rank, profile=profile, setup=setup)
                if setup.pipeline.chunks > 1 else
                reserve_megatron.replay_stage(plan, stage, stage=rank, profile=profile, setup=setup))
    if replayed is not None:
        print(f"  replay: allocated peak {replayed.allocated_peak_bytes / GIB:.3f}, reserved "
              f"{replayed.reserved_peak_bytes / GIB:.3f}")


if __name__ == "__main__":
    main()
