"""A zero-bubble schedule's split backward charged as its two passes run (planner/cost/splittime.py):
each layer's recorded input and weight passes (the profiler's SplitTimeJob, the analytic split), the
first stage's input pass empty, and the full-backward schedules untouched."""

import pytest
import torch
from torch import nn

from planner.cost import costmodel, splittime
from planner.cost.layers import layer_costs
from planner.models.archs import Arch, gpu
from planner.models.synthetic import layer, profile_of
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.profiler.splitbackward import recorded_split_ms, split_per_option, split_time_job
from planner.profiler.timing import time_interleaved
from planner.schema import FileRef, StagePlan, TrainSetup
from planner.schema.profile import RecomputeOption


def _block(name: str, input_ms: float | None, weight_ms: float | None, kind: str = "Block"):
    """A layer of F 1 ms, B 2 ms (synthetic's bwd_ratio), none's split recorded as given."""
    found = layer(name, kind, fwd_ms=1.0, act_mib=1, input_mib=0.5, param_count=10)
    options = [RecomputeOption(name="none", kept_bytes=found.act_bytes, input_grad_ms=input_ms, weight_grad_ms=weight_ms),
               RecomputeOption(name="full", kept_bytes=found.input_bytes, recompute_ms=1.0)]
    return found.model_copy(update={"recompute_options": options})


def _one_layer_a_stage(profile, setup):
    order = costmodel.schedule_of(setup)
    names = [item.name for item in profile.layers]
    return [StagePlan(index=r, layers=[names[k] for k in order.stages_of(r)],
                      chunks=[[names[k]] for k in order.stages_of(r)]) for r in range(order.num_ranks)]


def _setup(schedule: str, chunks: int) -> TrainSetup:
    return TrainSetup(stages=2, microbatches=2, micro_batch_size=1, schedule=schedule, chunks=chunks,
                      mem_caps_bytes=[2**40] * 2)


def test_a_stage_charges_its_layers_recorded_passes_and_the_rest_half_each():
    """Two layers, one recorded (I 1.5, W 0.9 against its B of 2) and one not (a kind of its own:
    a kind's times are its layers' means, recorded where every layer recorded them): the stage's I is
    1.5 + half the unrecorded 2, its W 0.9 + 1; the first stage runs no I and its whole backward as W."""
    costs = layer_costs(profile_of([_block("a", 1.5, 0.9), _block("b", None, None, kind="Other")]))
    setup = _setup("ZBV", 2)
    split = splittime.stage_split(costs, [0, 0], setup)
    assert (split.input_grad_ms, split.weight_grad_ms, split.charged_ms) == pytest.approx((1.5, 0.9, 2.0))
    assert splittime.split_pass_ms(4.0, split, stage=1) == pytest.approx((2.5, 1.9))
    assert splittime.split_pass_ms(4.0, split, stage=0) == (0.0, 4.0)
    # full recomputes: the recorded figures of none do not apply to it, half each of B + rerun
    assert splittime.stage_split(costs, [1, 1], setup) == splittime.StageSplit()


def test_the_recorded_fractions_follow_the_backward_the_row_charges():
    """A compute scale of 2 (a calibrated launch) doubles the row's backward and the recorded passes with it."""
    costs = layer_costs(profile_of([_block("a", 1.5, 0.9)]))
    setup = _setup("ZBV", 2)
    scaled = setup.model_copy(update={"time": setup.time.model_copy(update={"compute_scale": 2.0})})
    assert splittime.layer_split_ms(costs[0], 0, scaled) == pytest.approx((3.0, 1.8, 4.0))


def test_zbv_iteration_is_the_hand_simulated_one_and_1f1b_is_unchanged():
    """ZBV on 2 ranks, 4 one-layer stages (rank 0: stages 0 and 3), 2 microbatches; every layer F 1,
    I 1.5, W 0.9; stage 0: I 0, W 2 (torch's full backward there). Torch's order, by hand:
    rank 0 F0 0-1, F0' 1-2, F3 3-4 (after rank 1's F2 2-3), I3 4-5.5, W3 -6.4, F3' 6.4-7.4 (F2' ended
    5), I3' -8.9, W3' -9.8; rank 1 F1 1-2, F2 2-3, F1' 3-4, F2' 4-5, I2 5.5-7, W2 -7.9, I1 -9.4, W1
    -10.3, I2' (after I3' 8.9) 10.3-11.8, W2' -12.7, I1' -14.2, W1' -15.1; rank 0 again I0 at 9.8
    (empty), W0 -11.8, I0' at 14.2 (after I1'), W0' -16.2: 16.2 ms. Half each (I = W = 1) gives
    another figure; 1F1B's B stays 2 whatever the profile records."""
    recorded = profile_of([_block(f"l{k}", 1.5, 0.9) for k in range(4)])
    plain = profile_of([_block(f"l{k}", None, None) for k in range(4)])
    zbv = _setup("ZBV", 2)
    assert costmodel.evaluate(_one_layer_a_stage(recorded, zbv), recorded, zbv).iteration_ms == pytest.approx(16.2)
    assert costmodel.evaluate(_one_layer_a_stage(plain, zbv), plain, zbv).iteration_ms != pytest.approx(16.2)
    two = profile_of([_block(f"l{k}", 1.5, 0.9) for k in range(2)])
    plain_two = profile_of([_block(f"l{k}", None, None) for k in range(2)])
    one_f_one_b = _setup("1F1B", 1)
    assert (costmodel.evaluate(_one_layer_a_stage(two, one_f_one_b), two, one_f_one_b).iteration_ms
            == costmodel.evaluate(_one_layer_a_stage(plain_two, one_f_one_b), plain_two, one_f_one_b).iteration_ms)


def test_a_recomputes_split_times_are_recorded_together_or_not_at_all():
    with pytest.raises(ValueError, match="together"):
        RecomputeOption(name="none", kept_bytes=1, input_grad_ms=1.0)
    assert RecomputeOption.model_validate({"name": "none", "kept_bytes": 1}).input_grad_ms is None  # older profiles


def test_the_profiler_times_torchs_two_passes_and_records_them_against_the_profiles_backward():
    torch.manual_seed(0)
    layer_ = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    x = torch.randn(8, 16, requires_grad=True)
    grad = torch.ones(8, 16)
    split = split_per_option(layer_, x, grad, ["none", "full"])
    job = split_time_job(layer_, x, grad, split)
    time_interleaved([job], warmup=1, repeats=3)
    medians = job.medians()
    assert set(medians) == {"none", "full"}
    assert all(len(job.input_ms[name]) == 3 and all(t > 0 for t in medians[name]) for name in medians)
    assert x.grad is None
    # the pair in the proportion the job measured against its own plain backward, on the profile's backward
    assert recorded_split_ms((3.0, 1.0, 2.0), 4.0) == (6.0, 2.0)
    # no input gradient to split off (a first layer): nothing to time
    assert split_time_job(layer_, x.detach(), grad, split) is None


def test_an_analytic_block_splits_off_its_weight_gradient_gemms():
    """Small Llama, tp 1, --mfu 0.5: W is the forward's weight GEMMs' FLOPs once (Q and O 2·T·h·q each,
    K and V 2·T·h·kv each, SwiGLU's three 2·T·h·f), I the rest of the 2 x forward backward."""
    arch = Arch(name="small-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
    shape = Shape(seq_len=32, micro_batch_size=2)
    h100 = gpu("h100")
    profile = analytic.analytic_profile(arch, shape, gpu=h100, mfu=0.5, model=FileRef(file="arch:test", sha256="0" * 64))
    block = profile.layers[1]
    T, h, q, kv, f = 64, 64, 64, 32, 160
    weight_flops = 2 * (2 * T * h * q) + 2 * (2 * T * h * kv) + 3 * (2 * T * h * f)
    none = block.recompute_options[0]
    assert none.weight_grad_ms == pytest.approx(weight_flops / (h100.bf16_tflops * 1e12 * 0.5) * 1e3)
    assert none.input_grad_ms + none.weight_grad_ms == pytest.approx(block.bwd_ms)
    full = block.recompute_options[1]  # full's I reruns the block once, its W once per parameter group (9: §78)
    assert full.input_grad_ms == pytest.approx(none.input_grad_ms + full.recompute_ms)
    assert full.weight_grad_ms == pytest.approx(none.weight_grad_ms + 9 * full.recompute_ms)


def test_a_fake_profile_counts_torchs_two_passes_weight_gemms_in_w():
    """Linear(16, 32), GELU, Linear(32, 16) on 8 rows: W runs the two weight GEMMs (2·8·16·32 FLOPs
    each), I the two input-gradient GEMMs (the first layer's too: the input needs its gradient), the
    plain backward all four."""
    from planner.profiler.fake import counting
    from planner.profiler.fake_split import split_work

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    x = torch.randn(8, 16, requires_grad=True)
    input_pass, weight_pass, plain = split_work(mlp, mlp, x, torch.ones(8, 16), counting)
    gemm = 2 * 8 * 16 * 32
    assert (input_pass.flops, weight_pass.flops, plain.flops) == (2 * gemm, 2 * gemm, 4 * gemm)
    assert x.grad is None and all(p.grad is None for p in mlp.parameters())
