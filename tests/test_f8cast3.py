"""TP + SP's row-parallel linears in an analytic checkpointed block's forward: wo's and w2's matmul makes the whole
[tokens, hidden] partial sum, DTensor reduce-scatters it into a new sequence shard and the partial dies once that
shard is made (torch's fake process group, RowwiseParallel(output_layouts=Shard(1)) as torchtitan 9dec370 wraps wo
and w2); the split forward plays both after the linear's casts, wo's shard to the residual sum that reads it
(docs/framework-facts.md §149)."""

import weakref

import torch

from planner.cost.cpring import peak
from planner.cost.fsdp2_split import split_forward


def test_rowwise_parallel_frees_the_partial_sum_once_its_shard_is_made():
    """On 2 ranks a (1, 4, 8) input's partial sum is (1, 4, 8), the reduce-scattered output (1, 2, 8), a new
    tensor; the partial is dead when wo's call returns (on the fake group; NCCL's work may hold it to the wait, which
the shard's first reader, the residual sum, makes before it allocates), the shard alive."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        wo = parallelize_module(nn.Linear(16, 8, bias=False), mesh,
                                RowwiseParallel(output_layouts=Shard(1), use_local_output=False))
        seen = {}

        def partial_hook(mod, args, out):  # before RowwiseParallel's output hook: the matmul's own output
            seen.update(partial=weakref.ref(out._local_tensor), placements=out.placements,
                        shape=tuple(out._local_tensor.shape))
        wo.register_forward_hook(partial_hook, prepend=True)
        x = distribute_tensor(torch.randn(1, 4, 16), mesh, [Replicate()])
        x = x.redistribute(mesh, [Shard(2)])  # the rank's half of the inner dimension, as w2's input is
        out = wo(x)
        dead = seen["partial"]() is None  # at wo's return, the reduce-scatter issued
        local = torch.ops._c10d_functional.wait_tensor(out.to_local())  # as the residual sum's use waits on it
        assert seen["placements"][0].is_partial()
        assert seen["shape"] == (1, 4, 8)  # the whole sequence, the hidden width: t x the shard
        assert tuple(local.shape) == (1, 2, 8)  # the rank's sequence shard
        assert dead and local.numel() == 16  # the partial freed when wo returns, its shard alive
    finally:
        dist.destroy_process_group()


def test_the_partial_sums_are_played_after_the_casts_by_hand():
    # a tiny TP 2 block's forward: the norm output (the shard, 10), the attention's output projection input (20),
    # freed, h (the residual sum, 10), the product (30) freed
    codes = [10, 20, -2, -1, 10, 30, -4]
    points = {"attention": 1, "qkv": 1, "sdpa": 1, "sdpa_end": 1, "wo": 2, "attention_end": 4,
              "attention_sum": 5, "mlp": 5, "w1": 5, "w3": 5, "w13_end": 5, "w2": 6, "mlp_end": 7}
    casts = (("input:attention.wo", "wo", "attention_end", (9, 4)),
             ("input:feed_forward.w2", "w2_input", "mlp_end", (15, 4)))
    program = split_forward(codes, points, 0, {"float8_casts": casts, "row_partial": 20, "shard": 10,
                                               "gathered": 0})
    # ids: 1 the shard, 2 wo's input, 3-4 its cast, 5 wo's partial, 6 its shard, 7 h, 8 the product, 9-10 w2's
    # cast, 11 w2's partial, 12 its shard
    assert program == (10, 20, 9, 4, 20, 10, -5, -2, -1, -3, -4, 10, -6,
                       30, 15, 4, 20, 10, -11, -8, -9, -10, -12)
    # the block's peak: w2's partial (20) and shard (10) beside h (10), the product (30) and its cast (15 + 4)
    assert peak(program) == 10 + 30 + 15 + 4 + 20 + 10
    # without the partial sums the peak is the product's casts: 60 less
    assert peak(split_forward(codes, points, 0, {"float8_casts": casts, "gathered": 0})) == 10 + 30 + 15 + 4
    # a record without `attention_sum` (an older profile) plays none
    old = {name: at for name, at in points.items() if name != "attention_sum"}
    assert split_forward(codes, old, 0, {"float8_casts": casts, "row_partial": 20, "shard": 10}) == \
        split_forward(codes, old, 0, {"float8_casts": casts})


def test_the_analytic_block_marks_the_attentions_residual_sum():
    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.formulas import Shape

    arch = archs.Arch(name="tiny", hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                      num_kv_heads=1, vocab_size=32, tie_word_embeddings=False, max_position_embeddings=4)
    record = analytic.block_layer(0, arch, Shape(seq_len=4, micro_batch_size=1),
                                  archs.gpu("h100")).alloc_records["full"]
    codes, points = record.rerun_forward, record.rerun_points
    h = 4 * 8 * 2  # h = x + attention(...): the MLP norm's input, bf16
    # the point falls right after h is made, after the attention's frees
    assert codes[points["attention_sum"] - 1] == h and points["attention_end"] == points["attention_sum"] - 1
    assert all(code < 0 for code in codes[points["wo"]:points["attention_end"]])
