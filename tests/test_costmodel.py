"""The cost model against numbers worked out by hand.

Every expectation below is written out from DESIGN.md's cost model (with the
measured refinements documented in planner/cost/costmodel.py), not computed by calling
the code under test. Sizes are in MiB so the arithmetic stays readable.

The transient term refines DESIGN.md's max_C(act - input) + max_S transient: while a
layer runs (its forward, its backward, its recompute) the stage's later layers hold
nothing of that microbatch, so its extra is net of what they keep:
    transient_s = max_{l in S} (transient_l + [l in C](act_l - input_l) - sum_{m after l in S} kept_m)+
The optimizer step's scratch (Adam: sqrt(v) as a new tensor; cpu two of the largest
layer's, cuda every layer's) meets only static + buffers:
    peak_s = static + max(k * kept + transient, step scratch) + buffers
"""

import pytest

from planner.cost import costmodel
from planner.models.synthetic import layer, profile_of
from planner.schema import StagePlan, TrainSetup

MIB = 2**20
LOSS_VALUES = 5 * 4  # the last of 2 stages at M = 4, k = 1: M - k + 2 loss values of 4 B held (lossvalues.py)
HUGE = 2**50  # a cap nothing reaches


def four_layers():
    """embed -> blocks.0 -> blocks.1 -> head. Adam fp32 is 16 B/param, so
    65536 params = 1 MiB of static memory. bwd = 2 x fwd (synthetic default).
    input_in_act = min(input, act) (synthetic.layer's rule)."""
    layers = [
        #                                 fwd  bwd   act  in  out  static(adam fp32)  transient
        layer("embed", "Embed", fwd_ms=1, act_mib=2, input_mib=1, output_mib=4,
              param_count=65536, transient_mib=3),      # 1, 2, 2, 1, 4, 1 MiB, 3
        layer("blocks.0", "Block", fwd_ms=2, act_mib=10, input_mib=4,
              param_count=131072, transient_mib=1),     # 2, 4, 10, 4, 4, 2 MiB, 1
        layer("blocks.1", "Block", fwd_ms=2, act_mib=10, input_mib=4,
              param_count=131072, transient_mib=1),     # 2, 4, 10, 4, 4, 2 MiB, 1
        layer("head", "Head", fwd_ms=3, act_mib=6, input_mib=4, output_mib=1,
              param_count=32768, transient_mib=5),      # 3, 6, 6, 4, 1, 0.5 MiB, 5
    ]
    return profile_of(layers, name="four").model_copy(
        update={"batch_input_bytes": MIB // 2, "loss_bytes": MIB // 4, "loss_ms": 0.5}
    )


def setup(stages, microbatches=4, schedule="1F1B", caps=None, **changes):
    return TrainSetup(
        stages=stages, microbatches=microbatches, micro_batch_size=1, schedule=schedule,
        mem_caps_bytes=caps or [HUGE] * stages, **changes,
    )


def plan(*stages):
    """plan((layers, checkpointed), ...) -> StagePlans."""
    return [StagePlan(index=i, layers=list(names), checkpointed=list(ckpt)) for i, (names, ckpt) in enumerate(stages)]


def stage_of(profile, setup_, stage, names, ckpt):
    costs = {c.name: c for c in costmodel.layer_costs(profile)}
    layers = [costs[name] for name in names]
    return costmodel.stage_cost(layers, [name in ckpt for name in names], stage=stage, profile=profile, setup=setup_)


# ---------------------------------------------------------------- bytes per parameter


@pytest.mark.parametrize(
    "precision, optimizer, expected",
    [
        ("fp32", "adam", 16),  # 4 weights + 4 grads + 8 (m, v)
        ("fp32", "sgd", 12),  # 4 + 4 + 4 momentum
        ("bf16-mixed", "adam", 16),  # 2 + 2 + 12 (fp32 master, m, v)
        ("bf16-mixed", "sgd", 12),  # 2 + 2 + 8 (fp32 master, momentum)
    ],
)
def test_bytes_per_param_plain(precision, optimizer, expected):
    s = setup(1, precision=precision, optimizer=optimizer)
    assert costmodel.bytes_per_param(s) == expected


@pytest.mark.parametrize(
    "precision, optimizer, zero, offload, expected",
    [
        # dp = 4 throughout. ZeRO-1 shards optimizer state, 2 also grads, 3 also weights;
        # where the weights stay gathered (ZeRO 2) FSDP2 keeps its 1/4 shard of them too.
        ("fp32", "adam", 0, False, 16),  # ZeRO 0 with dp=4: nothing sharded
        ("fp32", "adam", 1, False, 4 + 4 + 8 / 4),  # 10
        ("fp32", "adam", 2, False, 4 + 4 / 4 + 4 / 4 + 8 / 4),  # 8: FSDP2's weight shard beside the gathered weights
        ("fp32", "adam", 3, False, 4 / 4 + 4 / 4 + 8 / 4),  # 4
        ("bf16-mixed", "adam", 1, False, 2 + 2 + 12 / 4),  # 7
        ("bf16-mixed", "adam", 2, False, 2 + 2 / 4 + 2 / 4 + 12 / 4),  # 6
        ("bf16-mixed", "adam", 3, False, 2 / 4 + 2 / 4 + 12 / 4),  # 4
        ("fp32", "sgd", 3, False, 1 + 1 + 1),  # 3
        ("bf16-mixed", "sgd", 2, False, 2 + 0.5 + 0.5 + 2),  # 5
        # offload: optimizer state lives in host memory
        ("fp32", "adam", 0, True, 4 + 4),  # 8
        ("bf16-mixed", "adam", 0, True, 2 + 2),  # 4
        ("fp32", "adam", 3, True, 1 + 1 + 0),  # 2
        ("bf16-mixed", "sgd", 2, True, 2 + 0.5 + 0.5 + 0),  # 3
    ],
)
def test_bytes_per_param_zero_and_offload(precision, optimizer, zero, offload, expected):
    s = setup(1, precision=precision, optimizer=optimizer, dp=4, zero=zero, offload=offload)
    assert costmodel.bytes_per_param(s) == pytest.approx(expected, rel=0, abs=1e-12)


def test_zero_with_one_replica_shards_nothing():
    assert costmodel.bytes_per_param(setup(1, dp=1, zero=3)) == 16


def test_static_bytes_of_a_stage_follow_zero():
    # embed + blocks.0 = 196608 params; ZeRO-3, dp=4, adam fp32: 4 B/param -> 786432 B = 0.75 MiB
    p = four_layers()
    s = setup(2, dp=4, zero=3)
    cost = stage_of(p, s, 0, ["embed", "blocks.0"], [])
    assert cost.static_bytes == 196608 * 4 == 3 * MIB // 4


# ---------------------------------------------------------------- in flight


@pytest.mark.parametrize(
    "stages, microbatches, expected",
    [
        (4, 8, [4, 3, 2, 1]),  # min(P - s, M) = P - s
        (4, 2, [2, 2, 2, 1]),  # capped by M
        (3, 1, [1, 1, 1]),
        (1, 5, [1]),
    ],
)
def test_in_flight_1f1b(stages, microbatches, expected):
    s = setup(stages, microbatches)
    assert [costmodel.in_flight(s.pipeline, i) for i in range(stages)] == expected


@pytest.mark.parametrize("stages, microbatches", [(4, 8), (4, 2), (3, 1), (1, 5)])
def test_in_flight_gpipe_holds_every_microbatch(stages, microbatches):
    s = setup(stages, microbatches, schedule="GPipe")
    assert [costmodel.in_flight(s.pipeline, i) for i in range(stages)] == [microbatches] * stages


# ---------------------------------------------------------------- stage cost, two stages


def test_first_stage_with_a_checkpointed_layer():
    # P=2, M=4, 1F1B: stage 0 holds k = min(2 - 0, 4) = 2 microbatches.
    # stage 0 = [embed, blocks.0], blocks.0 checkpointed
    #   static    = (65536 + 131072) * 16 B           = 3 MiB
    #   kept      = act(embed) 2 + input(blocks.0) 4  (checkpointed keeps its input)
    #               - input_in_act(embed) 1           (its saved input is a slice of the
    #                                                  batch held in buffers below)
    #               + output(blocks.0) 4              (stage output waits in fwd_cache)
    #               no loss (not last)                                   = 9 MiB
    #   buffers   = M * output(blocks.0) = 4 * 4 = 16 (grad recv, stage < P-1)
    #               + M * batch_input = 4 * 0.5 = 2    (stage 0)
    #               + output(blocks.0) 4: microbatch 0's, held by the last warm-up send's Work through the
    #                 steady phase (w = 2, M - w = 2 >= w - 1: warmupsend.py)      = 22 MiB
    #   transient = blocks.0, the stage's last layer: its transient 1 + recompute
    #               (10 - 4), nothing after it: 7; embed: 3 - input(blocks.0) 4 < 0
    #               (its weight gradient comes after blocks.0 freed it)  = 7 MiB
    #   scratch   = Adam on cpu: 2 * 4 B * 131072 (blocks.0)              = 1 MiB (< 2 * 9 + 7)
    #   peak      = 3 + max(2 * 9 + 7, 1) + 22                           = 50 MiB
    #   time      = (1 + 2) + (2 + 4) + 2 (recompute forward)           = 11 ms
    p = four_layers()
    cost = stage_of(p, setup(2), 0, ["embed", "blocks.0"], ["blocks.0"])
    assert cost.static_bytes == 3 * MIB
    assert cost.in_flight == 2
    assert cost.kept_bytes == 9 * MIB
    assert cost.activation_bytes == 18 * MIB
    assert cost.buffer_bytes == 22 * MIB
    assert cost.transient_bytes == 7 * MIB
    assert cost.step_scratch_bytes == 1 * MIB
    assert cost.peak_bytes == 50 * MIB
    assert cost.time_ms == pytest.approx(11.0)


def test_first_stage_without_checkpointing():
    # same stage, nothing checkpointed:
    #   kept = 2 + 10 - input_in_act(embed) 1 + 4 (output) = 15 MiB
    #   transient = max(embed 3 - act(blocks.0) 10, blocks.0 1) = 1 MiB (the old model's
    #   max_S transient charged embed's 3 on top of every in-flight microbatch)
    #   buffers = 18 + the warm-up send's held output 4 = 22 MiB (test_first_stage_with_a_checkpointed_layer)
    #   peak = 3 + 2 * 15 + 22 + 1 = 56 MiB; time = 3 + 6 = 9 ms
    p = four_layers()
    cost = stage_of(p, setup(2), 0, ["embed", "blocks.0"], [])
    assert cost.kept_bytes == 15 * MIB
    assert cost.buffer_bytes == 22 * MIB
    assert cost.transient_bytes == 1 * MIB
    assert cost.peak_bytes == 56 * MIB
    assert cost.time_ms == pytest.approx(9.0)


def test_stage_zero_does_not_keep_its_first_input_twice():
    # The first layer's saved input is, on stage 0, a slice (a view) of the whole input batch
    # the schedule holds all step long (M * batch_input in buffers), as past stage 0 it is a
    # receive buffer: either way kept loses input_in_act(first) once, on every stage.
    p = four_layers()
    costs = {c.name: c for c in costmodel.layer_costs(p)}
    assert costmodel.first_layer_kept_bytes(costs["embed"], setup(2)) == -1 * MIB  # min(1, 2)
    assert costmodel.first_layer_kept_bytes(costs["blocks.0"], setup(2)) == -4 * MIB  # min(4, 10)
    # [embed, blocks.0] on stage 0 of 2 (k = 2): kept 15, peak 56 (test_first_stage_without_checkpointing).
    # With embed's input_in_act set to 0 (its saved tensors do not hold its input), nothing
    # is shared: kept = 2 + 10 + 4 = 16, buffers still 22 (the batch is held either way),
    # peak = 3 + 2 * 16 + 22 + 1 = 58 = 56 + k * 1
    unshared = p.model_copy(update={"layers": [p.layers[0].model_copy(update={"input_in_act_bytes": 0}),
                                               *p.layers[1:]]})
    cost = stage_of(unshared, setup(2), 0, ["embed", "blocks.0"], [])
    assert (cost.kept_bytes, cost.buffer_bytes, cost.peak_bytes) == (16 * MIB, 22 * MIB, 58 * MIB)
    # blocks.0 opening stage 0 of 2 (k = 2): kept = 10 - input_in_act 4 + output 4 = 10
    #   static 2; buffers = M * output 4 * 4 + M * batch_input 4 * 0.5 + the held send's output 4 = 22;
    #   transient 1; peak = 2 + 2 * 10 + 22 + 1 = 45 MiB
    cost = stage_of(p, setup(2), 0, ["blocks.0"], [])
    assert (cost.kept_bytes, cost.buffer_bytes, cost.peak_bytes) == (10 * MIB, 22 * MIB, 45 * MIB)


def test_last_stage_without_checkpointing():
    # P=2, M=4: last stage k = min(2 - 1, 4) = 1. stage 1 = [blocks.1, head]
    #   static    = (131072 + 32768) * 16 B = 2.5 MiB
    #   kept      = act 10 + act 6
    #               - input_in_act(blocks.1) 4  (received input lives in a recv buffer)
    #               + output(head) 1 + loss_bytes 0.25                   = 13.25 MiB
    #   buffers   = (M + 1) * input(blocks.1): recv buffers + the input gradient being sent
    #             = 5 * 4 (no grad-recv buffer on the last stage)        = 20 MiB
    #               + the loss values held to the step's end beyond the in-flight one's,
    #                 M - k + 2 = 5 of 4 B (lossvalues.py)                = 20 MiB + 20 B
    #   transient = max(1 - 6 - 0.25, 5 - 0.25): the head's, net of the loss's kept bytes,
    #               freed before the head's backward (measured, tests/test_recompute_options.py) = 4.75 MiB
    #   peak      = 2.5 + 1 * 13.25 + 20 + 4.75                          = 40.5 MiB + 20 B
    #   time      = (2 + 4) + (3 + 6) + loss 0.5                         = 15.5 ms
    p = four_layers()
    cost = stage_of(p, setup(2), 1, ["blocks.1", "head"], [])
    assert cost.static_bytes == 5 * MIB // 2
    assert cost.in_flight == 1
    assert cost.kept_bytes == 53 * MIB // 4
    assert cost.buffer_bytes == 20 * MIB + LOSS_VALUES
    assert cost.transient_bytes == 19 * MIB // 4
    assert cost.peak_bytes == 162 * MIB // 4 + LOSS_VALUES
    assert cost.time_ms == pytest.approx(15.5)


@pytest.mark.parametrize("loss_scratch_mib, transient_mib, with_head_ckpt_mib", [(8, 8, 8), (2, 4.75, 6.75),
                                                                                  (0, 4.75, 6.75)])
def test_loss_scratch_is_a_last_stage_transient(loss_scratch_mib, transient_mib, with_head_ckpt_mib):
    # the loss's scratch (e.g. cross-entropy's gradients) exists on the last stage only, and
    # is freed before the first layer's backward, so before any recompute:
    #   transient = max(recompute + max_S transient, loss scratch)
    #   stage 1 = [blocks.1, head]: max(max(1, 5) - 0.25 (the loss's kept bytes, freed first), loss)
    #   -> 8 with an 8 MiB loss scratch, else 4.75;
    #   peak = 2.5 + 13.25 + 20 + transient + the loss values (test_last_stage_without_checkpointing)
    # stage 0 = [embed, blocks.0] keeps max(3 - 10, 1) = 1 whatever the loss needs
    p = four_layers().model_copy(update={"loss_transient_bytes": loss_scratch_mib * MIB})
    last = stage_of(p, setup(2), 1, ["blocks.1", "head"], [])
    assert last.transient_bytes == int(transient_mib * MIB)
    assert last.peak_bytes == int((2.5 + 13.25 + 20 + transient_mib) * MIB) + LOSS_VALUES
    assert stage_of(p, setup(2), 0, ["embed", "blocks.0"], []).transient_bytes == 1 * MIB
    # head checkpointed: recompute (6 - 4) - 0 = 2 on top of the layers' 5, against the loss's
    ckpt = stage_of(p, setup(2), 1, ["blocks.1", "head"], ["head"])
    assert ckpt.transient_bytes == int(with_head_ckpt_mib * MIB)


def test_last_stage_all_checkpointed():
    # stage 1 = [blocks.1, head], both checkpointed:
    #   kept      = input 4 + input 4 - input_in_act(blocks.1) 4 + 1 + 0.25 = 5.25 MiB
    #   recompute = head: (6 - 4) - 0 = 2; blocks.1: (10 - 4) - kept(head) 4 = 2  -> 2
    #   transient = 2 + max(1, 5) - 0.25 (the loss's kept bytes, freed first) = 6.75 MiB
    #   peak      = 2.5 + 5.25 + 20 + 6.75                                   = 34.5 MiB + the loss values 20 B
    #   time      = 15.5 + 2 + 3 (two recompute forwards)                    = 20.5 ms
    p = four_layers()
    cost = stage_of(p, setup(2), 1, ["blocks.1", "head"], ["blocks.1", "head"])
    assert cost.kept_bytes == 21 * MIB // 4
    assert cost.transient_bytes == 27 * MIB // 4
    assert cost.peak_bytes == 138 * MIB // 4 + LOSS_VALUES
    assert cost.time_ms == pytest.approx(20.5)


def test_transient_is_net_of_what_later_layers_keep():
    # blocks.0, blocks.1, head in one stage (act 10, 10, 6; input 4, 4, 4; transient 1, 1, 5)
    profile = four_layers()
    costs = {c.name: c for c in costmodel.layer_costs(profile)}
    layers = [costs["blocks.0"], costs["blocks.1"], costs["head"]]
    ctx = costmodel.Context(profile, setup(1))

    def extra(layers, flags):
        return costmodel.transient_extra_bytes(layers, flags, ctx)
    # nothing checkpointed: head 5; blocks.1 1 - 6 < 0; blocks.0 1 - 16 < 0 -> 5
    assert extra(layers, [False, False, False]) == 5 * MIB
    # head checkpointed (last): 5 + (6 - 4) = 7
    assert extra(layers, [False, False, True]) == 7 * MIB
    # blocks.1 alone: 1 + 6 - act(head) 6 = 1; head 5 -> 5
    assert extra(layers, [False, True, False]) == 5 * MIB
    # blocks.1 and head: head 7; blocks.1 7 - input(head) 4 = 3 -> 7
    assert extra(layers, [False, True, True]) == 7 * MIB
    # blocks.0 alone: 7 - (10 + 6) < 0; head 5 -> 5
    assert extra(layers, [True, False, False]) == 5 * MIB
    # blocks.0, blocks.1 only: blocks.1 7 - 6 = 1; blocks.0 7 - (4 + 6) < 0; head 5 -> 5
    assert extra(layers, [True, True, False]) == 5 * MIB
    # blocks.1 last in its stage: 1 + 6 = 7
    assert extra(layers[:2], [True, True]) == 7 * MIB
    # the embedding (transient 3: its weight gradient) opening a stage of two blocks meets only
    # what blocks.0 and blocks.1 no longer hold: 3 - 20 < 0; blocks.1 (last) 1 -> 1
    assert extra([costs["embed"], *layers[:2]], [False, False, False]) == 1 * MIB


def test_optimizer_step_scratch():
    # Adam: 4 B per parameter per layer; cpu steps one tensor at a time (two temporaries of the
    # largest, bounded by the largest layer), cuda all at once (foreach); SGD updates in place.
    costs = {c.name: c for c in costmodel.layer_costs(four_layers())}
    layers = [costs["embed"], costs["blocks.0"], costs["head"]]  # 65536, 131072, 32768 params
    per_layer = [costmodel.layer_step_scratch_bytes(layer, setup(2), "cpu") for layer in layers]
    assert per_layer == [MIB // 4, MIB // 2, MIB // 8]
    assert costmodel.step_scratch_bytes(per_layer, "cpu") == 2 * MIB // 2
    assert costmodel.step_scratch_bytes(per_layer, "cuda") == MIB // 4 + MIB // 2 + MIB // 8
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, optimizer="sgd"), "cpu") == 0
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, dp=4, zero=1), "cuda") == MIB // 8
    # ZeroRedundancyOptimizer steps whole tensors: on cpu a rank may step the largest
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, dp=4, zero=1), "cpu") == MIB // 2
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, offload=True), "cpu") == 0
    # sqrt(v) takes the state's dtype: 2 B a parameter in bf16, 4 in bf16-mixed's fp32 state
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, precision="bf16"), "cuda") == MIB // 4
    assert costmodel.layer_step_scratch_bytes(costs["blocks.0"], setup(2, precision="bf16-mixed"), "cuda") == MIB // 2


def test_a_large_embedding_peaks_at_the_optimizer_step():
    # embed with 4 Mi params (Adam fp32 static 64 MiB) alone on stage 0 of 2, k = 2:
    #   kept = 2 - 1 + 4 = 5; buffers 18 + the warm-up send's held output 4 = 22; transient 3
    #   -> training peak 64 + 2 * 5 + 3 + 22 = 99
    #   step scratch (cpu): 2 * 4 B * 4 Mi = 32 MiB -> peak 64 + max(13, 32) + 22 = 118 MiB
    p = four_layers()
    big = p.model_copy(update={"layers": [p.layers[0].model_copy(update={"param_count": 4 * MIB}), *p.layers[1:]]})
    cost = stage_of(big, setup(2), 0, ["embed"], [])
    assert (cost.static_bytes, cost.transient_bytes, cost.step_scratch_bytes) == (64 * MIB, 3 * MIB, 32 * MIB)
    assert cost.peak_bytes == 118 * MIB
    assert stage_of(big, setup(2, optimizer="sgd"), 0, ["embed"], []).peak_bytes == 48 * MIB + 13 * MIB + 22 * MIB


# ---------------------------------------------------------------- stage cost, three stages


def test_middle_stage():
    # P=3, M=4, 1F1B: stage 1 holds k = min(3 - 1, 4) = 2. stage 1 = [blocks.0, blocks.1]
    #   static  = 2 * 131072 * 16 B = 4 MiB
    #   buffers = (M + 1) * input(blocks.0) 5 * 4 + M * output(blocks.1) 4 * 4
    #             + the warm-up send's held output 4 (w = 2, M - w = 2 >= w - 1: warmupsend.py) = 40 MiB
    # no checkpointing:
    #   kept = 10 + 10 - input_in_act(blocks.0) 4 + output(blocks.1) 4      = 20 MiB
    #   transient = 0 + 1; peak = 4 + 2 * 20 + 40 + 1                        = 85 MiB
    #   time = 6 + 6 = 12 ms
    # blocks.1 (last) checkpointed:
    #   kept = 10 + 4 - 4 + 4 = 14; transient = (10 - 4) + 1 = 7
    #   peak = 4 + 28 + 40 + 7 = 79 MiB; time = 12 + 2 = 14 ms
    # blocks.0 (the stage's first layer) checkpointed: kept = 4 + 10 - 4 + 4 = 14;
    #   recompute (10 - 4) - act(blocks.1) 10 < 0 -> 0; transient = 1
    #   peak = 4 + 28 + 40 + 1 = 73 MiB; time 14 ms
    p = four_layers()
    s = setup(3)
    plain = stage_of(p, s, 1, ["blocks.0", "blocks.1"], [])
    assert (plain.in_flight, plain.static_bytes, plain.buffer_bytes) == (2, 4 * MIB, 40 * MIB)
    assert (plain.kept_bytes, plain.transient_bytes, plain.peak_bytes) == (20 * MIB, 1 * MIB, 85 * MIB)
    assert plain.time_ms == pytest.approx(12.0)
    for ckpt, transient, peak in ((["blocks.1"], 7, 79), (["blocks.0"], 1, 73)):
        cost = stage_of(p, s, 1, ["blocks.0", "blocks.1"], ckpt)
        assert cost.kept_bytes == 14 * MIB
        assert (cost.transient_bytes, cost.peak_bytes) == (transient * MIB, peak * MIB)
        assert cost.time_ms == pytest.approx(14.0)


def test_three_stage_plan_end_to_end():
    # P=3, M=4, 1F1B; [embed] | [blocks.0, blocks.1] | [head], nothing checkpointed.
    # stage 0: k=3; static 1; kept = 2 - input_in_act(embed) 1 + output 4 = 5;
    #          buffers = 4 * 4 + 4 * 0.5 = 18 (w = 3, M - w = 1 < w - 1: no warm-up send held);
    #          transient 3; peak = 1 + 15 + 18 + 3 = 37 MiB; time 3 ms
    # stage 1: 85 MiB, 12 ms (test_middle_stage)
    # stage 2: k=1; static 0.5; kept = 6 - 4 + 1 + 0.25 = 3.25; buffers = 5 * 4 = 20 + the loss values 20 B;
    #          transient 5 - loss 0.25 = 4.75; peak = 0.5 + 3.25 + 20 + 4.75 = 28.5 MiB + 20 B; time 9 + 0.5 = 9.5 ms
    # T = (3 + 12 + 9.5) + (4 - 1) * 12 = 60.5 ms
    p = four_layers()
    margin = costmodel.FIT_MARGIN_BYTES  # a plan fits when its peak stays this far below the cap
    s = setup(3, caps=[37 * MIB + margin, 85 * MIB + margin - 1, 29 * MIB])
    cost = costmodel.evaluate(plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], [])), p, s)
    assert cost.peak_bytes_per_stage == [37 * MIB, 85 * MIB, 114 * MIB // 4 + LOSS_VALUES]
    assert [c.time_ms for c in cost.stages] == pytest.approx([3.0, 12.0, 9.5])
    assert [c.in_flight for c in cost.stages] == [3, 2, 1]
    assert cost.iteration_ms == pytest.approx(60.5)
    # peak + margin == cap fits; one byte less room does not
    assert [c.fits for c in cost.stages] == [True, False, True]
    assert not cost.feasible


def test_megatrons_pipeline_keeps_no_receive_buffers_and_frees_sent_outputs():
    # The three stages of test_three_stage_plan_end_to_end scored for Megatron-LM's runtime:
    # the received input is the first layer's saved input, kept (no correction, no buffers);
    # a sent output is freed (deallocate_pipeline_outputs); one gradient at a time each way;
    # one microbatch of data per forward.
    # stage 0: kept = 2 (embed, its token ids) = 2; buffers = 1 output gradient 4;
    #          peak = 1 + 3 * 2 + 4 + 3 = 14 MiB (torch's pipelining: 37)
    # stage 1: kept = 10 + 10 = 20; buffers = 1 input gradient 4 + 1 output gradient 4 = 8;
    #          peak = 4 + 2 * 20 + 8 + 1 = 53 MiB (81)
    # stage 2: kept = 6 + output 1 (the logits stay for the loss) + loss 0.25 = 7.25;
    #          buffers = 1 input gradient 4; peak = 0.5 + 7.25 + 4 + 4.75 = 16.5 MiB (28.5)
    p = four_layers()
    cost = costmodel.evaluate(plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], [])), p,
                              setup(3, runtime="megatron"))
    assert [c.kept_bytes for c in cost.stages] == [2 * MIB, 20 * MIB, 29 * MIB // 4]
    assert [c.buffer_bytes for c in cost.stages] == [4 * MIB, 8 * MIB, 4 * MIB]
    assert cost.peak_bytes_per_stage == [14 * MIB, 53 * MIB, 66 * MIB // 4]
    assert cost.iteration_ms == pytest.approx(60.5)  # the same compute


def test_colossalai_and_deepspeed_pipelines_hold_what_their_code_holds():
    # The same three stages (k = 3, 2, 1; M = 4; batch input 0.5 MiB, no targets).
    # ColossalAI: the received input is the layer's own (no correction, no receive buffers),
    # outputs kept, one gradient at a time, the whole batch on every stage (4 x 0.5 = 2):
    #   stage 0: kept 2 + 4 = 6; buffers 4 + 2 = 6; peak 1 + 3 * 6 + 6 + 3 = 28
    #   stage 1: kept 24; buffers 4 + 4 + 2 = 10; peak 4 + 48 + 10 + 1 = 63
    #   stage 2: kept 6 + 1 + 0.25 = 7.25; buffers 4 + 2 = 6; peak 0.5 + 7.25 + 6 + 4.75 = 18.5
    #   (the head's transient 5 net of the loss's 0.25, freed before the head's backward)
    # DeepSpeed: max(2, min(P - s, M)) = 3, 2, 2 pipe buffers, each with a received input, plus
    # the receive buffer; one gradient buffer; a microbatch loaded per buffer:
    #   stage 0: kept 6; buffers 4 + 3 * 0.5 = 5.5; peak 1 + 18 + 5.5 + 3 = 27.5
    #   stage 1: kept 24; buffers 3 * 4 + 4 = 16; peak 4 + 48 + 16 + 1 = 69
    #   stage 2: kept 7.25; buffers 3 * 4 = 12; peak 0.5 + 7.25 + 12 + 4.75 = 24.5
    p = four_layers()
    stages = plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], []))
    colossal = costmodel.evaluate(stages, p, setup(3, runtime="colossalai"))
    assert colossal.peak_bytes_per_stage == [28 * MIB, 63 * MIB, 74 * MIB // 4]
    deep = costmodel.evaluate(stages, p, setup(3, runtime="deepspeed"))
    assert [c.buffer_bytes for c in deep.stages] == [11 * MIB // 2, 16 * MIB, 12 * MIB]
    assert deep.peak_bytes_per_stage == [55 * MIB // 2, 69 * MIB, 98 * MIB // 4]
    # torchtitan runs torch's pipelining: ckplan's own figures (37, 85, 28.5 MiB + 20 B), but its trainer puts the
    # whole batch on every stage, b5bcd76c's positions beside the inputs (M x 0.5 x 2 = 4 MiB: rules.batch_bytes),
    # where ckplan's runtime holds the inputs on stage 0 only (2 MiB): +2, +4, +4
    assert costmodel.evaluate(stages, p, setup(3, runtime="torchtitan")).peak_bytes_per_stage == \
        [39 * MIB, 89 * MIB, 130 * MIB // 4 + LOSS_VALUES]


@pytest.mark.parametrize("room, fits", [(4096, True), (4095, False), (0, False), (2**20, True)])
def test_a_stage_fits_when_its_peak_stays_the_margin_below_its_cap(room, fits):
    # [embed] alone on stage 0 of 3 peaks at 37 MiB (test_three_stage_plan_end_to_end);
    # FIT_MARGIN_BYTES = 4 KiB of room is required (the MILP's caps carry the same margin)
    assert costmodel.FIT_MARGIN_BYTES == 4096
    p = four_layers()
    s = setup(3, caps=[37 * MIB + room, HUGE, HUGE])
    cost = costmodel.evaluate(plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], [])), p, s)
    assert cost.stages[0].peak_bytes == 37 * MIB
    assert cost.stages[0].fits is fits
    assert cost.feasible is fits


def test_gpipe_holds_every_microbatch_on_every_stage():
    # same plan under GPipe: k = 4 everywhere.
    # stage 0: 1 + 4 * 5 + 18 + 3 = 42; stage 1: 4 + 4 * 20 + 32 + 1 = 117;
    # stage 2: 0.5 + 4 * 3.25 + 16 + 4.75 = 34.25 MiB (the head's 5 net of the loss's 0.25). Buffers: 4 receive
    # buffers of the input and, before the last, 4 of the output's gradient; no input gradient being sent: GPipe
    # peaks at its first backward, before any is made (rules.held_input_grads); no warm-up send held (GPipe); the
    # last stage holds M - k + 2 = 2 loss values of 4 B (lossvalues.py). But each backward's input gradient send
    # (4 MiB) and loss value (4 B) stay to the step's end (gpipeheld): the head alone keeps 3.25 MiB a microbatch,
    # less than that, so it peaks at its last backward: 0.5 + 3.25 + 3 * (4 MiB + 4 B) + 16 MiB + 8 B + 4.75
    # = 36.5 MiB + 20 B (stage 1's 20 MiB a microbatch are more than its 4 MiB: its first backward, as before)
    p = four_layers()
    s = setup(3, schedule="GPipe")
    cost = costmodel.evaluate(plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], [])), p, s)
    assert [c.buffer_bytes for c in cost.stages] == [18 * MIB, 32 * MIB, 16 * MIB + 8]
    assert cost.peak_bytes_per_stage == [42 * MIB, 117 * MIB, 73 * MIB // 2 + 20]


def pipeline_iteration_ms(busy_ms, setup_):
    """The one-stage-per-rank closed form (costmodel.pipeline_ms) of stages with these busy times and no step."""
    return costmodel.pipeline_ms(sum(busy_ms), max(busy_ms), 0.0, 0.0, setup_)


def test_iteration_ms_is_fill_drain_plus_steady_state():
    # P=2 [embed, blocks.0 (ckpt)] | [blocks.1, head]: 11 ms and 15.5 ms (tests above)
    # T = 11 + 15.5 + (4 - 1) * 15.5 = 73 ms
    p = four_layers()
    cost = costmodel.evaluate(plan((["embed", "blocks.0"], ["blocks.0"]), (["blocks.1", "head"], [])), p, setup(2))
    assert cost.iteration_ms == pytest.approx(73.0)
    assert pipeline_iteration_ms([11.0, 15.5], setup(2)) == pytest.approx(73.0)
    assert pipeline_iteration_ms([5.0, 1.0, 2.0], setup(3, microbatches=1)) == pytest.approx(8.0)
    assert pipeline_iteration_ms([5.0, 1.0, 2.0], setup(3, microbatches=10)) == pytest.approx(8.0 + 9 * 5.0)


def test_iteration_ms_is_bounded_by_total_work_when_ranks_share_cores():
    # parallel_stages C < P: T = max(critical path, M * sum(time_s) / C)
    # P=2, M=4, times 11 and 15.5: critical path 73; C = 1: 4 * 26.5 / 1 = 106 -> 106
    assert pipeline_iteration_ms([11.0, 15.5], setup(2, parallel_stages=1)) == pytest.approx(106.0)
    # C = 2 = P: capacity 4 * 26.5 / 2 = 53 < 73 -> 73; C > P counts as P
    assert pipeline_iteration_ms([11.0, 15.5], setup(2, parallel_stages=2)) == pytest.approx(73.0)
    assert pipeline_iteration_ms([11.0, 15.5], setup(2, parallel_stages=5)) == pytest.approx(73.0)
    # P=3, M=4, times 3, 12, 9.5: critical path 60.5; C = 2: 4 * 24.5 / 2 = 49 -> 60.5;
    # M = 8: path 24.5 + 7 * 12 = 108.5, capacity 8 * 24.5 / 2 = 98 -> 108.5
    # C = 1, M = 4: 98 -> 98
    assert pipeline_iteration_ms([3.0, 12.0, 9.5], setup(3, parallel_stages=2)) == pytest.approx(60.5)
    assert pipeline_iteration_ms([3.0, 12.0, 9.5], setup(3, 8, parallel_stages=2)) == pytest.approx(108.5)
    assert pipeline_iteration_ms([3.0, 12.0, 9.5], setup(3, parallel_stages=1)) == pytest.approx(98.0)
    p = four_layers()
    cost = costmodel.evaluate(plan((["embed", "blocks.0"], ["blocks.0"]), (["blocks.1", "head"], [])), p,
                              setup(2, parallel_stages=1))
    assert cost.iteration_ms == pytest.approx(106.0)


def test_single_stage_is_both_first_and_last():
    # P=1, M=2: k = 1; [all four], nothing checkpointed
    #   static = 1 + 2 + 2 + 0.5 = 5.5 MiB
    #   kept = 2 + 10 + 10 + 6 - input_in_act(embed) 1 (a slice of the batch, in buffers)
    #          + output(head) 1 + loss 0.25 = 28.25
    #   buffers = M * batch_input = 1 MiB (no recv buffers either way; no batch_target here)
    #   transient = max(3, 1, 1, 5) - loss 0.25 (freed before any backward) = 4.75;
    #   peak = 5.5 + 28.25 + 1 + 4.75 = 39.5 MiB
    #   time = 3 + 6 + 6 + 9 + 0.5 = 24.5; T = 24.5 + 1 * 24.5 = 49 ms
    p = four_layers()
    cost = costmodel.evaluate(plan((["embed", "blocks.0", "blocks.1", "head"], [])), p, setup(1, 2))
    assert cost.stages[0].kept_bytes == 113 * MIB // 4
    assert cost.peak_bytes_per_stage == [158 * MIB // 4]
    assert cost.stages[0].buffer_bytes == 1 * MIB
    assert cost.iteration_ms == pytest.approx(49.0)


def test_last_stage_holds_the_whole_batch_of_targets():
    # batch_target = 0.75 MiB per microbatch: the last stage's buffers grow by M * 0.75, the
    # other stages' do not. P=3, M=4, 1F1B, [embed] | [blocks.0, blocks.1] | [head]
    # (test_three_stage_plan_end_to_end): buffers 18, 40, 20 -> 18, 40, 20 + 4 * 0.75 = 23 (+ the loss values);
    # peaks 37, 85, 28.5 -> 37, 85, 31.5 MiB (k = 1 does not multiply a buffer)
    p = four_layers().model_copy(update={"batch_target_bytes": 3 * MIB // 4})
    stages = plan((["embed"], []), (["blocks.0", "blocks.1"], []), (["head"], []))
    cost = costmodel.evaluate(stages, p, setup(3))
    assert [c.buffer_bytes for c in cost.stages] == [18 * MIB, 40 * MIB, 23 * MIB + LOSS_VALUES]
    assert cost.peak_bytes_per_stage == [37 * MIB, 85 * MIB, 126 * MIB // 4 + LOSS_VALUES]
    # GPipe (k = 4 everywhere): still M * 0.75 = 3 MiB, not k * M: 36.5 -> 39.5 MiB (+ 2 loss values; at its last
    # backward 3 input gradients of 4 MiB and 3 loss values of 4 B: test_gpipe_holds_every_microbatch_on_every_stage)
    assert costmodel.evaluate(stages, p, setup(3, schedule="GPipe")).peak_bytes_per_stage[2] == 79 * MIB // 2 + 20
    # a single stage is first and last: buffers = M * (batch_input 0.5 + batch_target 0.75)
    #   = 2 * 1.25 = 2.5 MiB (M = 2); peak = 39.5 + 1.5 = 41 MiB (test_single_stage_is_both_first_and_last)
    single = costmodel.evaluate(plan((["embed", "blocks.0", "blocks.1", "head"], [])), p, setup(1, 2))
    assert single.stages[0].buffer_bytes == 5 * MIB // 2
    assert single.peak_bytes_per_stage == [164 * MIB // 4]


def test_evaluate_matches_stage_cost_and_split_to_stages():
    p = four_layers()
    stages = costmodel.split_to_stages([0, 2], [False, True, True, False], p)
    assert [(st.layers, st.checkpointed) for st in stages] == [
        (["embed", "blocks.0"], ["blocks.0"]), (["blocks.1", "head"], ["blocks.1"])]
    # caps: 1 MiB above stage 0's need (fits), below stage 1's (does not)
    cost = costmodel.evaluate(stages, p, setup(2, caps=[51 * MIB, 30 * MIB]))
    # stage 0: 50 MiB (test_first_stage_with_a_checkpointed_layer); stage 1 with blocks.1 checkpointed:
    #   kept = 4 + 6 - 4 + 1 + 0.25 = 7.25
    #   transient = max(blocks.1 1 + (10 - 4) - act(head) 6, head 5) - loss 0.25 = 4.75
    #   peak = 2.5 + 7.25 + 20 + 4.75 = 34.5 MiB + the loss values 20 B
    assert cost.peak_bytes_per_stage == [50 * MIB, 138 * MIB // 4 + LOSS_VALUES]
    assert [c.cap_bytes for c in cost.stages] == [51 * MIB, 30 * MIB]
    assert [c.fits for c in cost.stages] == [True, False]
    predicted = costmodel.with_predictions(stages, cost)
    assert predicted[1].predicted.peak_bytes == 138 * MIB // 4 + LOSS_VALUES
    assert predicted[1].predicted.transient_bytes == 19 * MIB // 4
    assert predicted[0].predicted.time_ms == pytest.approx(11.0)


# ---------------------------------------------------------------- evaluate rejects bad plans


@pytest.mark.parametrize(
    "stages, message",
    [
        ((["embed", "blocks.0"], ["blocks.1", "head"], ["head"]), "3 stages"),  # wrong count
        ((["embed", "blocks.0", "blocks.1", "head"],), "1 stages"),  # wrong count
        ((["embed"], ["blocks.1", "head"]), "missing"),  # skips blocks.0
        ((["embed", "blocks.0"], ["blocks.0", "blocks.1", "head"]), "repeated"),  # repeats blocks.0
        ((["embed", "blocks.1"], ["blocks.0", "head"]), "out of order"),  # reordered
        ((["blocks.0", "blocks.1"], ["embed", "head"]), "out of order"),  # reordered across stages
        ((["embed", "blocks.0"], ["blocks.1", "head", "extra"]), "unknown"),
        ((["embed", "blocks.0"], ["blocks.1"]), "missing"),  # drops the last layer
    ],
)
def test_evaluate_rejects_plans_that_do_not_cover_the_layers_in_order(stages, message):
    p = four_layers()
    with pytest.raises(ValueError, match=message):
        costmodel.evaluate(plan(*[(names, []) for names in stages]), p, setup(2))


# ---------------------------------------------------------------- kind normalisation


def test_same_kind_layers_share_mean_times_and_max_bytes():
    # two "Block"s measured differently; a third kind alone is untouched
    layers = [
        layer("a", "Block", fwd_ms=2, bwd_ratio=2, act_mib=10, input_mib=4, output_mib=3,
              param_count=100, transient_mib=1),   # bwd 4
        layer("b", "Block", fwd_ms=4, bwd_ratio=1.5, act_mib=8, input_mib=5, output_mib=2,
              param_count=300, transient_mib=0.5),  # bwd 6
        layer("c", "Head", fwd_ms=7, act_mib=1, input_mib=1, param_count=5),
    ]
    costs = costmodel.layer_costs(profile_of(layers))
    a, b, c = costs
    # times: mean -> fwd (2 + 4) / 2 = 3, bwd (4 + 6) / 2 = 5
    # bytes: max -> act 10, input 5, output 3, params 300, transient 1
    # input_in_act: min(min(4, 10), min(5, 8)) = 4 (the smaller share is the safe correction)
    for cost in (a, b):
        assert (cost.fwd_ms, cost.bwd_ms) == pytest.approx((3.0, 5.0))
        assert (cost.act_bytes, cost.input_bytes, cost.output_bytes) == (10 * MIB, 5 * MIB, 3 * MIB)
        assert (cost.param_count, cost.transient_bytes) == (300, 1 * MIB)
        assert cost.input_in_act_bytes == 4 * MIB
        assert cost.kind == "Block"
    assert (a.name, b.name) == ("a", "b")
    assert (c.fwd_ms, c.bwd_ms, c.act_bytes, c.param_count) == (7, 14, 1 * MIB, 5)


def test_kind_normalisation_reaches_evaluate():
    # P=1, M=1, [a, b] of one kind, b checkpointed. Normalised: fwd 3, bwd 5, act 10,
    # input 5, output 3 MiB, 300 params (16 B each), transient 1 MiB.
    #   static = 600 * 16 = 9600 B; input_in_act = 4 (the kind's minimum, see above)
    #   kept = act(a) 10 + input(b) 5 - input_in_act(a) 4 + output 3 = 14 MiB
    #   buffers 0 (no batch_input, no batch_target)
    #   transient = (10 - 4) + 1 = 7 MiB (b's rerun saves act 10 of which only input_in_act 4 is the input its
    #   checkpoint keeps: LayerCost.recompute_peak_bytes); peak = 9600 + 14 MiB + 7 MiB
    #   time = 2 * (3 + 5) + 3 = 19 ms; T = 19 + 0 = 19 ms
    layers = [
        layer("a", "Block", fwd_ms=2, bwd_ratio=2, act_mib=10, input_mib=4, output_mib=3,
              param_count=100, transient_mib=1),
        layer("b", "Block", fwd_ms=4, bwd_ratio=1.5, act_mib=8, input_mib=5, output_mib=2,
              param_count=300, transient_mib=0.5),
    ]
    cost = costmodel.evaluate(plan((["a", "b"], ["b"])), profile_of(layers), setup(1, 1))
    assert cost.stages[0].static_bytes == 9600
    assert cost.stages[0].kept_bytes == 14 * MIB
    assert cost.stages[0].transient_bytes == 7 * MIB
    assert cost.peak_bytes_per_stage == [9600 + 21 * MIB]
    assert cost.iteration_ms == pytest.approx(19.0)


def with_steps(profile, adam_ms):
    """The profile with each layer's measured optimizer step (ms) per optimizer."""
    layers = [
        item.model_copy(update={"step_ms": {"adam": a, "sgd": a / 4}})
        for item, a in zip(profile.layers, adam_ms)
    ]
    return profile.model_copy(update={"layers": layers})


def test_optimizer_step_runs_once_per_iteration_after_the_pipeline():
    # four_layers with Adam steps embed 1, blocks 2 and 2 (one kind: mean 2), head 0.5 ms.
    # P=2 [embed, blocks.0 (ckpt)] | [blocks.1, head]: times 11 and 15.5 ms (tests above),
    # steps 1 + 2 = 3 and 2 + 0.5 = 2.5 ms.
    # critical path: 73 + max(3, 2.5) = 76; C = 1: (4 * 26.5 + 5.5) / 1 = 111.5
    p = with_steps(four_layers(), [1.0, 2.5, 1.5, 0.5])
    stages = plan((["embed", "blocks.0"], ["blocks.0"]), (["blocks.1", "head"], []))
    cost = costmodel.evaluate(stages, p, setup(2))
    assert [c.step_ms for c in cost.stages] == pytest.approx([3.0, 2.5])
    assert cost.iteration_ms == pytest.approx(76.0)
    assert cost.stages[0].predicted().step_ms == pytest.approx(3.0)
    assert costmodel.evaluate(stages, p, setup(2, parallel_stages=1)).iteration_ms == pytest.approx(111.5)
    # SGD's steps: 0.75 and 0.625 -> 73.75
    assert costmodel.evaluate(stages, p, setup(2, optimizer="sgd")).iteration_ms == pytest.approx(73.75)
    # ZeRO-1 over 4 ranks: each rank steps a quarter of the state -> 73 + 0.75
    assert costmodel.evaluate(stages, p, setup(2, dp=4, zero=1)).iteration_ms == pytest.approx(73.75)
    # a profile without step times charges none: the plain 73 ms
    assert costmodel.evaluate(stages, four_layers(), setup(2)).iteration_ms == pytest.approx(73.0)


def test_bottleneck_bound_counts_the_mean_step():
    # every layer's plain fwd + bwd: 3 + 6 + 6 + 9 = 24, loss 0.5; steps 1 + 2 + 2 + 0.5 = 5.5 over P = 2
    # T_feasible = 100, M = 4: (100 - 24.5 - 2.75) / 3
    p = with_steps(four_layers(), [1.0, 2.5, 1.5, 0.5])
    assert costmodel.bottleneck_bound_ms(p, setup(2), 100.0) == pytest.approx((100 - 24.5 - 2.75) / 3)


def test_recompute_costs_what_was_measured_or_else_a_whole_forward():
    # blocks: fwd 2, bwd 4; measured recompute 1.2 and 0.8 ms -> the kind's mean, 1.0
    p = four_layers()
    layers = [item.model_copy(update={"recompute_ms": r}) for item, r in zip(p.layers, [None, 1.2, 0.8, 0.5])]
    measured = p.model_copy(update={"layers": layers})
    costs = {c.name: c for c in costmodel.layer_costs(measured)}
    assert costmodel.layer_time_ms(costs["blocks.0"], True) == pytest.approx(2 + 4 + 1.0)
    assert costmodel.layer_time_ms(costs["blocks.0"], False) == pytest.approx(6.0)
    assert costmodel.layer_time_ms(costs["embed"], True) == pytest.approx(1 + 2 + 1)  # not measured: fwd
    assert costmodel.layer_time_ms(costs["head"], True) == pytest.approx(3 + 6 + 0.5)
    # P=2 [embed, blocks.0 (ckpt)] | [blocks.1, head]: 3 + 7 = 10 and 6 + 9 + 0.5 = 15.5 -> 10 + 4 * 15.5
    stages = plan((["embed", "blocks.0"], ["blocks.0"]), (["blocks.1", "head"], []))
    assert costmodel.evaluate(stages, measured, setup(2)).iteration_ms == pytest.approx(72.0)
    # one block of the kind without a measurement: the kind falls back to a whole forward
    layers[2] = layers[2].model_copy(update={"recompute_ms": None})
    partial = p.model_copy(update={"layers": layers})
    assert costmodel.evaluate(stages, partial, setup(2)).iteration_ms == pytest.approx(73.0)


def test_a_tied_parameter_is_held_once_where_its_holders_share_the_stage():
    # embed and head share 32768 params (0.5 MiB at Adam fp32's 16 B/param), counted in both
    # layers' param bytes. One stage holds one copy: static 5.5 - 0.5 = 5 MiB, peak 39.5 - 0.5.
    # Split, each end holds its copy: the 2-stage plan's static stays 1 + 2 and 2 + 0.5 MiB.
    from planner.schema import TiedSet

    p = four_layers().model_copy(update={"tied": [TiedSet(layers=["embed", "head"], param_count=32768,
                                                          param_bytes=4 * 32768)]})
    single = costmodel.evaluate(plan((["embed", "blocks.0", "blocks.1", "head"], [])), p, setup(1, 2))
    assert single.stages[0].static_bytes == 5 * MIB
    # and the head's gradient of the table (4 B a param, the weights' dtype) waits in autograd's InputBuffer until
    # embed's backward (tiedadd.buffered_grad_bytes, §381)
    assert single.peak_bytes_per_stage == [156 * MIB // 4 + 4 * 32768]
    split = costmodel.evaluate(plan((["embed", "blocks.0"], []), (["blocks.1", "head"], [])), p, setup(2))
    assert [c.static_bytes for c in split.stages] == [3 * MIB, 5 * MIB // 2]


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_both_solvers_fit_a_stage_that_fits_only_with_its_tied_copy_held_once(solver):
    # Nothing checkpointed on one stage peaks at 39.5 MiB counting the tied copy twice and
    # 39 MiB holding it once (the test above); at a 39.25 MiB cap the plan fits only as held
    # once, and checkpointing the blocks (the other way to fit) costs 4 ms of recompute.
    from planner.schema import TiedSet
    from planner.solve import search

    p = four_layers().model_copy(update={"tied": [TiedSet(layers=["embed", "head"], param_count=32768,
                                                          param_bytes=4 * 32768)]})
    cap = 157 * MIB // 4 + 2 * costmodel.FIT_MARGIN_BYTES
    result = search.plan(p, setup(1, 2, caps=[cap]), solver=solver, mip_gap=0.0, threads=1)
    # HiGHS may call a solve presolved to its end "feasible" with no gap left
    assert result.solve.status == "optimal" or result.solve.gap == pytest.approx(0.0, abs=1e-9)
    assert result.stages[0].checkpointed == [] and result.cost.peak_bytes_per_stage == [156 * MIB // 4 + 4 * 32768]


@pytest.mark.parametrize("runtime, recompute", [("ckplan", 0.5), ("torchtitan", 2.0), ("megatron", 2.0),
                                                ("deepspeed", 2.0), ("colossalai", 2.0)])
def test_runtimes_that_rerun_whole_forwards_are_charged_a_forward_per_checkpointed_layer(runtime, recompute):
    # a block of fwd 2, bwd 4 whose non-reentrant recompute stops early at 0.5 ms: ckplan's
    # runtime (torch.utils.checkpoint, early stop on) pays 0.5; Megatron-LM, DeepSpeed, HF's
    # reentrant checkpointing (ColossalAI) and torchtitan (early_stop=False) rerun the forward, 2
    p = profile_of([layer("b", "Block", fwd_ms=2, act_mib=10, input_mib=4, param_count=0, recompute_ms=0.5)])
    cost = stage_of(p, setup(1, 1, runtime=runtime), 0, ["b"], ["b"])
    assert cost.time_ms == pytest.approx(6.0 + recompute)
