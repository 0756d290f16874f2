"""Float8's forward casts in a checkpointed block's forward (planner/profiler/float8.py `forward_casts`,
planner/cost/float8.py `forward_casts`, planner/cost/fsdp2_split.py `cast_places` / `split_forward`): each converted
linear's input and weight cast at its own matmul, as torchao eab345c's Float8Linear makes them, counted by hand on a
tiny LLaMA block (hidden 64, 4 heads of 16, 2 K/V heads, MLP 160, 128 tokens)."""

from planner.cost.fsdp2_split import SCALE_BYTES, cast_places, split_forward
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.formulas import Shape
from planner.schema.profile import Float8Cast

ARCH = archs.Arch(name="tiny", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=256, tie_word_embeddings=False, max_position_embeddings=128)
T, H, KV, F = 128, 64, 32, 160  # tokens, hidden (= Q's width), K's and V's width, the MLP's width


def _block(**shape):
    return analytic.block_layer(0, ARCH, Shape(seq_len=128, micro_batch_size=1, **shape), archs.gpu("h100"))


def test_the_record_holds_each_linears_forward_casts_by_hand():
    casts = _block().float8.forward_casts
    # each input's float8 copy is tokens x in-features at 1 B, each weight's in x out; Q/K/V read the attention
    # norm's output, w1/w3 the MLP norm's; the head is no block linear
    assert [(c.linear, c.source, c.input_bytes, c.shard_bytes, c.weight_bytes) for c in casts] == [
        ("attention.wq", "attention_norm", T * H, 0, H * H),
        ("attention.wk", "attention_norm", T * H, 0, H * KV),
        ("attention.wv", "attention_norm", T * H, 0, H * KV),
        ("attention.wo", "attention.wo", T * H, 0, H * H),
        ("feed_forward.w1", "ffn_norm", T * H, 0, H * F),
        ("feed_forward.w3", "ffn_norm", T * H, 0, H * F),
        ("feed_forward.w2", "feed_forward.w2", T * F, 0, F * H)]
    # TP 2 + SP: column-parallel linears' inputs cast on the sequence shard (T/2 rows) before the gather, their
    # weights' out-features halved; the row-parallel wo and w2 cast their own T rows of their local width
    tp = _block(tp=2, sp=True).float8.forward_casts
    assert [(c.input_bytes, c.shard_bytes, c.weight_bytes) for c in tp] == [
        (T * H, T // 2 * H, H * H // 2), (T * H, T // 2 * H, H * KV // 2), (T * H, T // 2 * H, H * KV // 2),
        (T * H // 2, 0, H // 2 * H), (T * H, T // 2 * H, H * F // 2), (T * H, T // 2 * H, H * F // 2),
        (T * F // 2, 0, F // 2 * H)]


def test_each_cast_is_played_at_its_matmul_by_hand():
    record = _block().alloc_records["full"]
    codes, points = record.rerun_forward, record.rerun_points
    program = split_forward(codes, points, 0, {"float8_casts": cast_places(_block().float8.forward_casts)})
    s = SCALE_BYTES
    # ids: the rerun's own from the record (norm statistics 512 B, the norm's output 16 KiB, ...) and the casts
    assert program == (
        512, 16384, -1,                           # 1, 2: the attention norm's statistics and output
        T * H, s,                                 # 3, 4: Q/K/V's shared input cast (compiled, CSE) and its scale
        H * H, s, -5, -6, H * KV, s, -7, -8, H * KV, s, -9, -10,  # wq's, wk's, wv's weight casts at their matmuls
        -3, -4,                                   # the input's cast freed once wv has run
        16384, 8192, 8192, 2048, -14,             # 11-14: Q, K, V, logsumexp (freed as made)
        16384,                                    # 15: the output projection's input
        T * H, s, H * H, s, -18, -19,             # 16-19: wo's input and weight casts; the weight's freed
        -11, -12, -13, -15, -2,                   # the attention returns (its argument, the norm's output, last) ...
        -16, -17,                                 # ... with wo's input cast
        16384, 512, 16384, -21,                   # 20-22: h, the MLP norm's statistics and output
        T * H, s, H * F, s, -25, -26,             # 23-26: w1/w3's shared input cast; w1's weight cast
        T * F * 2, T * F * 2, -27,                # 27, 28: w1's output, SiLU's; w1's freed
        H * F, s, -29, -30,                       # 29, 30: w3's weight cast
        T * F * 2, -23, -24,                      # 31: w3's output; the shared input's cast freed
        T * F * 2, -28, -31,                      # 32: the product; SiLU's and w3's outputs freed (`*`'s operands)
        T * F, s, F * H, s, -35, -36,             # 33-36: w2's input and weight casts with the product alive
        -32, -22, -33, -34)                       # the product, the MLP input (feed_forward's argument), then w2's
    #                                               input cast at the MLP's return
    # once w2's weight cast is made, its casts are alive beside h, the MLP's input and the product: 2 x 16,384
    # + 40,960 + 20,480 + 4 + 10,240
    alive = _alive(program)
    assert alive[program.index(F * H, program.index(T * F))] == 2 * 16384 + 2 * T * F + T * F + s + F * H
    # the block's peak stays the product's making (h, the MLP input, SiLU's, w3's and the product: 155,648 B);
    # the record's charge (the largest linear's backward casts, w2's: T x (64 + 160) = 28,672 B) played at w2's
    # point instead would have stood on it
    assert max(alive) == 2 * 16384 + 3 * T * F * 2 == 155648
    charged = split_forward(codes, points, 0, {"float8": T * (H + F)})
    assert max(_alive(charged)) == 155648 + 28672


def _alive(program):
    """The bytes alive after each code of a program."""
    sizes, alive, out, made = {}, 0, [], 0
    for code in program:
        if code > 0:
            made += 1
            sizes[made] = code
            alive += code
        else:
            alive -= sizes.pop(-code)
        out.append(alive)
    return out


def test_the_setup_decides_which_casts_run():
    """Under FSDP2's float8 all-gather the weights arrive in float8 (no weight cast); under torchao's Float8 TP plan
    the column-parallel inputs arrive cast, their sequence shard's cast made before the gather and freed once the
    gathered part is made."""
    casts = [Float8Cast(linear="attention.wq", source="attention_norm", input_bytes=0, shard_bytes=40,
                        weight_bytes=0),
             Float8Cast(linear="attention.wo", source="attention.wo", input_bytes=30, weight_bytes=0)]
    places = cast_places(casts)
    assert places == (("pre:attention_gathered", "qkv", None, (40,)),
                      ("input:attention.wo", "wo", "attention_end", (30, SCALE_BYTES)))
    codes = [10, 20, -1, 30, 40, -2, -3, -4, 5, -5]
    points = {"attention": 3, "qkv": 3, "wo": 5, "w1": 8, "w3": 8, "w13_end": 8, "sdpa": 3, "sdpa_end": 5,
              "attention_end": 8, "mlp": 8, "w2": 9, "mlp_end": 10}
    program = split_forward(codes, points, 0, {"gathered": 7, "float8_casts": places})
    assert program == (10, 20, -1,
                       40, SCALE_BYTES, 7, -3,    # the shard's cast and scale, the gathered part; the copy freed
                       30, 40,                    # ids 6, 7
                       30, SCALE_BYTES,           # ids 8, 9: wo's input cast once 40 is made
                       -2, -6, -7,                # the attention returns
                       -4, -5, -8, -9,            # the gathered part with its scale, wo's cast
                       7, 5, -11, -10)            # the MLP
    # a linear that is not torchtitan's LLaMA block's: no places (the charge at w2 stands)
    assert cast_places([Float8Cast(linear="mlp.fc", source="mlp.fc", input_bytes=1, weight_bytes=1)]) == ()
    # without the points the casts need, the charge at w2 stands
    old = {name: at for name, at in points.items() if name not in ("qkv", "wo", "w1", "w3", "w13_end")}
    assert split_forward(codes, old, 0, {"float8": 9, "float8_casts": places}) == (
        10, 20, -1, 30, 40, -2, -3, -4, 5, 9, -6, -5)
