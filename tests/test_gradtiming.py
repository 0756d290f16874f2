"""What a pipeline stage's gradients hold while a layer runs its backward (planner/cost/gradtiming.py):
beside torch's pipelining FSDP2 runs with gradient sync off, so each backward's gradients are made in
the weights' dtype and added into the kept reduce-dtype gradients only at the unit's post-backward
(torch 2.6.0 fsdp/_fully_shard/_fsdp_param.py 629-648): a layer's own gradients, bf16, beside its
backward's scratch."""

from planner.cost import costmodel, gradtiming, reserve_fsdp2
from planner.cost.layers import layer_costs
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

GIB = 2**30
MIB = 2**20


def _titan(**fields) -> TrainSetup:
    base = dict(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2, precision="bf16-mixed",
                runtime="torchtitan", runtime_version="9dec370", dp=4, zero=3, zero_gather="per-iteration")
    return TrainSetup(**(base | fields))


def test_a_layers_backward_holds_its_own_gradients_in_bf16_beside_a_pipeline():
    """uniform_blocks(4): embedding 50M parameters, four blocks of 12.6M, head 50M; scratch 24 MiB a block,
    100 MiB the head. Stage 0 (embedding, blocks 0-2), stage 1 (block 3, head)."""
    profile = uniform_blocks(4)
    layers = layer_costs(profile)
    setup = _titan()
    assert [gradtiming.layer_grad_in_flight_bytes(layer, setup) for layer in layers] == \
        [100_000_000] + [25_200_000] * 4 + [100_000_000]  # 2 B a parameter, each layer its own
    stages = costmodel.split_to_stages([0, 4], [False] * len(profile.layers), profile)
    cost = costmodel.evaluate(stages, profile, setup)
    # stage 0 peaks in a block's backward (24 MiB of scratch beside its 25.2 MB of gradients; the embedding's
    # comes once the blocks' activations are freed), stage 1 in the head's (100 MiB beside 100 MB)
    assert cost.stages[0].transient_bytes == 24 * MIB + 25_200_000
    assert cost.stages[1].transient_bytes == 100 * MIB + 100_000_000
    # the replay makes each layer's gradients itself: its layers' scratch is the profile's alone
    for index, (stage, plan) in enumerate(zip(cost.stages, stages)):
        replayed = reserve_fsdp2.stage_of(plan, stage, stage=index, profile=profile, setup=setup).chunks[0]
        assert [layer.extra_bytes for layer in replayed.layers] == \
            [known.transient_bytes for known in layers if known.name in plan.layers]


def test_none_where_gradients_are_reduced_every_microbatch_or_held_all_iteration():
    profile = uniform_blocks(4)
    block = layer_costs(profile)[1]
    # FSDP2 resharding every microbatch: its unsharded gradient is dataparallel.unsharded_bytes' (a buffer)
    assert gradtiming.layer_grad_in_flight_bytes(block, _titan(zero_gather="per-microbatch")) == 0
    # Megatron-LM's main_grad buffers, allocated once, and ckplan's runtime: held all iteration
    for runtime in ("megatron", "ckplan"):
        assert gradtiming.layer_grad_in_flight_bytes(block, _titan(runtime=runtime, runtime_version=None)) == 0


def test_an_interleaved_rank_holds_one_layers_gradients_at_a_time():
    """P = 2 x V = 2: rank 0 holds stages 0 (embedding, block 0) and 2 (blocks 2, 3), rank 1 stages 1
    (block 1) and 3 (the head): a rank runs one backward at a time, so it holds one layer's gradients
    beside that layer's scratch, whichever chunk the layer is in, not one a chunk."""
    profile = uniform_blocks(4)
    layers = layer_costs(profile)
    setup = _titan(schedule="interleaved-1F1B", chunks=2)
    names = [layer.name for layer in layers]
    chunks = [[names[0], names[1]], [names[2]], [names[3], names[4]], [names[5]]]
    ranks = [costmodel.StagePlan(index=r, layers=chunks[r] + chunks[r + 2], chunks=[chunks[r], chunks[r + 2]])
             for r in range(2)]
    cost = costmodel.evaluate(ranks, profile, setup)
    assert cost.stages[0].transient_bytes == 24 * MIB + 25_200_000  # a block's
    assert cost.stages[1].transient_bytes == 100 * MIB + 100_000_000  # the head's
