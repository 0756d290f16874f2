"""The checkpointed forward's parts beyond the record (fsdp2_split.split_forward, fsdp2_layers.forward_program): each
made and freed at the point torchtitan 9dec370's block code makes and frees it (analytic_lifetimes.LLAMA_FORWARD_POINTS,
held by allocseq.synthesised as `rerun_points`), by hand on hand-made records and on the tiny LLaMA block's
analytic record."""

from planner.cost.cpring import peak
from planner.cost.fsdp2_layers import forward_program
from planner.cost.fsdp2_split import split_forward
from planner.profiler.allocseq import synthesised
from planner.schema import LayerProfile

# a rerun of five tensors: 10, 20 (10 freed once 20 is made), then 30, 40 (20, 30 and 40 freed together: the
# attention's return), then 5 freed as made (the MLP)
CODES = [10, 20, -1, 30, 40, -2, -3, -4, 5, -5]
POINTS = {"attention": 3, "sdpa": 3, "sdpa_end": 5, "attention_end": 8, "mlp": 8, "w2": 9, "mlp_end": 10}


def test_each_part_is_made_and_freed_at_its_points_by_hand():
    parts = {"gathered": 7, "repeated_kv": 3, "cp": (50, 60, -1, 70, -3, -2), "cp_charge": 1, "float8": 2}
    # 100 beyond the record: 2 x 7 gathered, 3 repeated, 1 charged for the ring, 2 of casts; 80 unnamed, first
    program = split_forward(CODES, POINTS, 100, parts)
    assert program == (80,                       # id 1: the rest, alive to the end
                       10, 20, -2,               # ids 2, 3; 10 freed
                       7, 3,                     # ids 4, 5: the attention's gathered input, repeat_kv's copies
                       50, 60, -6, 70, -8, -7,   # ids 6-8: the ring's forward, all freed in the SDPA call
                       30, 40, -3, -9, -10,      # ids 9, 10; the attention returns
                       -4, -5,                   # its gathered input and repeat_kv's copies with it
                       7, 5,                     # id 11: the MLP's gathered input; id 12
                       2, -13,                   # id 13: w2's cast, freed after its matmul
                       -12, -11)                 # the MLP returns
    # peak in the ring once 50 is freed and 70 made: 80 + 20 + 7 + 3 + 60 + 70 = 240 (above 80 + 20 + 7 + 3 + 30
    # + 40 = 180 after it)
    assert peak(program) == 240
    # the parts beyond the residual: no rest tensor
    assert split_forward(CODES, POINTS, 10, parts)[:3] == (10, 20, -1)
    # a point missing (a family not read): nothing
    assert split_forward(CODES, {"attention": 3}, 100, parts) == ()


def _layer(**update) -> LayerProfile:
    fields = dict(name="b", kind="block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2, bwd_ms_max=2,
                  act_bytes=1000, input_bytes=100, output_bytes=100, input_in_act_bytes=100, param_count=10,
                  param_bytes=20, transient_bytes=400)
    return LayerProfile(**{**fields, **update})


def test_synthesised_holds_the_points_and_forward_program_plays_the_parts():
    # kept terms: the input (100, left out), 200, 400, 300; 200 dies once 400 is made, 400 as made
    points = {"attention": (1, "after"), "sdpa": (2, "before"), "sdpa_end": (2, "after"),
              "attention_end": (2, "after"), "mlp": (3, "before"), "w2": (3, "made"), "mlp_end": (3, "after")}
    layer = synthesised(_layer(), [100, 200, 400, 300], scratch_terms=[150, 150], last_uses=(None, 2, 2, None),
                        points=points)
    record = layer.alloc_records["full"]
    assert record.rerun_forward == [200, 400, -1, -2, 300]
    assert record.rerun_points == {"attention": 1, "sdpa": 1, "sdpa_end": 4, "attention_end": 4, "mlp": 4,
                                   "w2": 5, "mlp_end": 5}
    # extra 1350: 50 beyond the record, now 2 x 10 gathered, 5 repeated, the rest 25 unnamed
    parts = {"gathered": 10, "repeated_kv": 5, "cp": (), "cp_charge": 0}
    # ids: 25 (1), 200 (2), the attention's gathered 10 (3) and repeated 5 (4) before SDPA, 400 (5); 200 and 400
    # freed, then at the attention's return 3 and 4; the MLP's gathered 10 (6), 300 (7), 6 freed at the MLP's return
    assert forward_program(layer, "full", 1350, parts) == (25, 200, 10, 5, 400, -2, -5, -3, -4, 10, 300, -6)
    # without parts: the one tensor, as before
    assert forward_program(layer, "full", 1350) == (50, 200, 400, -2, -3, 300)


def test_the_tiny_llama_blocks_points_fall_at_its_terms():
    """A tiny LLaMA block (GQA under flash, SwiGLU): its record's points fall where LLAMA_FORWARD_POINTS reads them
    (hidden 64, 4 heads, 2 K/V heads, 128 tokens at 2 B: the norm's output 16 KiB; logsumexp 4 x 4 x 128 B)."""
    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.formulas import Shape

    arch = archs.Arch(name="tiny", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                      vocab_size=256, tie_word_embeddings=False, max_position_embeddings=128)
    record = analytic.block_layer(0, arch, Shape(seq_len=128, micro_batch_size=1), archs.gpu("h100")).alloc_records["full"]
    codes, points = record.rerun_forward, record.rerun_points
    x, lse, f = 128 * 64 * 2, 4 * 4 * 128, 128 * 160 * 2
    # the attention's gathered input after the norm's output is made and its statistics freed
    assert codes[points["attention"] - 1] < 0 and x in codes[:points["attention"]]
    # SDPA: just before logsumexp is made; its end after logsumexp is freed as made
    assert codes[points["sdpa"]] == lse and points["sdpa_end"] == points["sdpa"] + 2
    # the attention returns: its frees end there and the MLP norm's input (the residual stream) comes next
    assert codes[points["attention_end"] - 1] < 0 and codes[points["attention_end"]] == x
    # w2: after the product is made (f wide), before its frees; the MLP's end is the rerun's end
    assert codes[points["w2"] - 1] == f and codes[points["w2"]] < 0
    assert points["mlp_end"] == len(codes) and points["mlp"] < points["w2"]
