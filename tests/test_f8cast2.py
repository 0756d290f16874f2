"""What an analytic checkpointed block's forward holds around its MLP and its gathered inputs, checked against torch:
the MLP's input (feed_forward's argument) outlives the product and w2's casts, as the fake recorder's record of the
real block under torch.utils.checkpoint frees it; under TP + SP, PrepareModuleInput leaves the caller's sequence
shard alive beside the gathered input the module runs on (torch's fake process group), so the split forward plays
the gathered tensor whole beside the record's shard (docs/framework-facts.md §144)."""

import weakref

import torch
from fixtures import (
    llama_style as llama,  # the package path: tests/fixtures on sys.path would hide scripts/
)
from fixtures.fake_records import llama_block_records

from planner.cost.cpring import peak
from planner.cost.fsdp2_split import split_forward

X = llama.SEQ * llama.DIM * 2  # a block's input, bf16: 4,096 B
GATE = llama.SEQ * llama.HIDDEN * 2  # an f-wide tensor: 11,008 B


def _ids(codes):
    """(id, size) made and id freed, in order."""
    out, made = [], 0
    for code in codes:
        if code > 0:
            made += 1
            out.append(("+", made, code))
        else:
            out.append(("-", -code, 0))
    return out


def _mlp_order(codes):
    """The MLP input's id (the tensor made last before w1's output), the product's (the fourth f-wide tensor), and
    the positions of their frees and of SiLU's and w3's (the second and third)."""
    events = _ids(codes)
    made = [(ident, size) for sign, ident, size in events if sign == "+"]
    wide = [ident for ident, size in made if size == GATE]
    w1, silu, w3, product = wide[-4:]
    mlp_input = max(ident for ident, size in made if ident < w1 and size == X)
    freed = {ident: at for at, (sign, ident, _) in enumerate(events) if sign == "-"}
    return {name: freed[ident] for name, ident in
            (("input", mlp_input), ("silu", silu), ("w3", w3), ("product", product))}


def test_the_mlps_input_outlives_the_product_in_torch_and_in_the_analytic_block():
    fake = llama_block_records()["full"].forward
    torch_order = _mlp_order(fake)
    # torch: `*` drops SiLU's and w3's outputs before w2 runs; the product dies when w2 returns, the MLP's input
    # (the caller's argument) after it
    assert torch_order["silu"] < torch_order["w3"] < torch_order["product"] < torch_order["input"]

    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.formulas import Shape

    arch = archs.Arch(name="tiny", hidden_size=llama.DIM, intermediate_size=llama.HIDDEN, num_layers=2,
                      num_heads=llama.HEADS, num_kv_heads=llama.KV_HEADS, vocab_size=llama.VOCAB,
                      tie_word_embeddings=False, max_position_embeddings=llama.SEQ)
    record = analytic.block_layer(0, arch, Shape(seq_len=llama.SEQ, micro_batch_size=1),
                                  archs.gpu("h100")).alloc_records["full"]
    ours = _mlp_order(record.rerun_forward)
    assert ours["silu"] < ours["w3"] < ours["product"] < ours["input"]
    # w2's point, where its casts go (fsdp2_split's `w2_input`: the product's own free), falls with the MLP's input
    # alive: after the product's making and SiLU's and w3's frees, before the product's and the input's
    codes = record.rerun_forward
    w2 = record.rerun_points["w2"]
    assert codes[w2 - 1] == GATE and codes[w2:w2 + 4] == [-12, -13, -14, -10]
    program = split_forward(codes, record.rerun_points, 0,
                            {"float8_casts": (("input:feed_forward.w2", "w2_input", "mlp_end", (100, 4)),)})
    at = program.index(100)
    assert program[at - 2:at] == (-12, -13) and program[at + 1:] == (4, -14, -10, -15, -16)


def test_prepare_module_input_keeps_the_callers_shard_beside_the_gathered_input():
    """torch's PrepareModuleInput (Shard(1) -> Replicate(), as torchtitan 9dec370 parallelize_llama.py wraps
    feed_forward) hands the module the gathered input while the caller's call still holds the norm's sequence shard:
    at w2's matmul both are alive; the shard dies once the module returns."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)

        def forward(self, x):
            return self.w2(self.w1(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn_norm, self.feed_forward = nn.LayerNorm(8), FeedForward()

        def forward(self, h):
            return h + self.feed_forward(self.ffn_norm(h))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        block = parallelize_module(Block(), mesh, {
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
        seen = {}
        block.ffn_norm.register_forward_hook(lambda mod, args, out: seen.update(shard=weakref.ref(out)))
        block.feed_forward.register_forward_pre_hook(
            lambda mod, args: seen.update(x=weakref.ref(args[0]), x_shape=tuple(args[0].to_local().shape)))
        block.feed_forward.w2.register_forward_pre_hook(
            lambda mod, args: seen.update(at_w2=(seen["shard"]() is not None, seen["x"]() is not None)))
        block(distribute_tensor(torch.randn(1, 4, 8), mesh, [Shard(1)]))
        assert seen["x_shape"] == (1, 4, 8)  # the module runs on the gathered input
        assert seen["at_w2"] == (True, True)  # the shard (1, 2, 8) and the gathered input, both alive
        assert seen["shard"]() is None  # the shard dies with the call
    finally:
        dist.destroy_process_group()


def test_a_gathered_input_is_played_whole_beside_its_shard_by_hand():
    # the rerun: the norm's output (the shard, 10) made, 20 then 30 inside the sub-block, the shard freed last
    codes = [10, 20, 30, -2, -3, -1]
    points = {"attention": 1, "sdpa": 2, "sdpa_end": 2, "attention_end": 6, "mlp": 6, "w2": 6, "mlp_end": 6}
    # the extra counts 7 for each gathered input beyond its shard of 10: the forward makes the gathered 17 whole
    # beside the shard; the residual 2 x 7 holds nothing beyond the parts
    program = split_forward(codes, points, 14, {"gathered": 7, "shard": 10})
    assert program == (10, 17, 20, 30, -3, -4, -1, -2, 17, -5)
    assert peak(program) == 10 + 17 + 20 + 30
    # the shard's Float8 copy before the gather (TP + SP's Float8 plan), freed once the gathered float8 tensor is made
    places = (("pre:attention_gathered", "attention", None, (5,)),)
    cast = split_forward(codes, points, 14, {"gathered": 7, "shard": 10, "float8_casts": places})
    assert cast[:5] == (10, 5, 4, 17, -2)
