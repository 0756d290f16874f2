"""A tied table's local add on one stage (planner/cost/tiedadd.py; docs/framework-facts.md §249, §349-§352):
autograd's InputBuffer adds the head's and the embedding's gradients every microbatch; charged (the profile's
sum_ms) where the cost model takes the later holder's .grad accumulation off, which otherwise stands for it, and
Megatron's zero-filled dummy gradient beside it under its gradient-accumulation fusion."""

import pytest

from planner.cost import costmodel, layers, tiedadd
from planner.schema import (
    DeviceInfo,
    FileRef,
    LayerProfile,
    Profile,
    StagePlan,
    TiedSet,
    TrainSetup,
)

SHARED = 10_000_000  # a 10M-parameter table the embedding and the head share
ADD_MS = 0.3  # the profile's sum_ms: the add of the two uses' gradients, once a microbatch
MICROBATCHES = 4
NAMES = ["embed", "block", "head"]


def _profile(sum_ms: float = ADD_MS) -> Profile:
    def layer(name: str, accumulate_ms: float = 0.0) -> LayerProfile:
        return LayerProfile(name=name, kind=name, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 20, input_bytes=1 << 10,
                            output_bytes=1 << 10, param_count=SHARED, param_bytes=2 * SHARED, transient_bytes=0,
                            wgrad_accumulate_ms=accumulate_ms)

    return Profile(name="tied", created_at="now", torch_version="x", device=DeviceInfo(type="cuda", name="h100"),
                   dtype="bfloat16", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64),
                   layers=[layer("embed"), layer("block", 0.2), layer("head", 0.2)],
                   tied=[TiedSet(layers=["embed", "head"], param_count=SHARED, param_bytes=2 * SHARED, sum_ms=sum_ms)])


def _setup(runtime: str, *, zero: int = 0, dp: int = 1, stages: int = 1, version: str | None = None,
           **training) -> TrainSetup:
    return TrainSetup(stages=stages, microbatches=MICROBATCHES, micro_batch_size=1, schedule="1F1B",
                      mem_caps_bytes=[80 << 30] * stages, runtime=runtime, runtime_version=version,
                      precision="bf16-mixed", optimizer="adam", dp=dp, zero=zero, **training)


def _adds_ms(setup: TrainSetup) -> dict[str, float]:
    profile = _profile()
    return {cost.name: tiedadd.tied_local_add_ms(cost, profile, setup) for cost in layers.layer_costs(profile)}


def test_where_the_profiles_accumulation_stands_for_the_add_nothing_more_is_charged():
    # torch's autograd with .grad kept (ckplan ZeRO 0, torchtitan unsharded), DeepSpeed ZeRO 3 on this measured
    # profile (it names no elementwise rate, so deepspeed_grads takes no add off: tests/test_gradacc.py), Megatron
    # without its fusion: the head's timed accumulation is the add's bytes
    for setup in (_setup("ckplan"), _setup("torchtitan"), _setup("deepspeed", zero=3, dp=2),
                  _setup("megatron", unfused_grad_accumulation=True)):
        assert _adds_ms(setup) == {"embed": 0.0, "block": 0.0, "head": 0.0}


def test_fsdp2_and_an_optimizers_own_gradients_leave_the_add_uncharged_so_it_is_charged_once_a_microbatch():
    # FSDP2 sharding over 2 ranks (the unsharded .grad is None at each backward), DeepSpeed 56c52238's BF16_Optimizer
    # (.grad cleared before each backward): the head, the later holder, 4 x 0.3 ms
    for setup in (_setup("torchtitan", zero=3, dp=2), _setup("torchtitan", zero=2, dp=2),
                  _setup("deepspeed", version="56c52238")):
        assert _adds_ms(setup) == {"embed": 0.0, "block": 0.0, "head": pytest.approx(MICROBATCHES * ADD_MS)}


def test_megatrons_fused_accumulation_charges_the_add_and_the_dummys_zero_fill():
    # the head's wgrad GEMM accumulates into main_grad and hands autograd a zero-filled dummy (zero_out_wgrad): the
    # fill writes one table (a third of the add's three), then InputBuffer adds it to the embedding's gradient
    assert _adds_ms(_setup("megatron"))["head"] == pytest.approx(MICROBATCHES * (ADD_MS + ADD_MS / 3))


def test_megatrons_add_is_charged_on_the_profile_solve_and_evaluate_hand_the_cost_model():
    # float8.float8_profile (fusedkernels.fused_profile) sets the head's wgrad_accumulate_ms to 0 before evaluate
    # reads it: the add and the fill stay charged there (they were 0 before: tiedadd read the 0); a profile timed
    # under --mfu timed no accumulation, so nothing was taken off and nothing is charged in its place
    from planner.cost.float8 import float8_profile
    from planner.models import archs
    from planner.profiler.analytic import Shape, analytic_profile

    arch = archs.Arch(name="tied", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=4,
                      vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=128)
    setup = _setup("megatron")
    for mfu in (None, 0.4):
        made = analytic_profile(arch, Shape(seq_len=128, micro_batch_size=1, tp=1), gpu=archs.gpu("h100"), mfu=mfu,
                                model=FileRef(file="arch:tied", sha256="0" * 64))
        handed = float8_profile(made, setup)
        add_ms = made.tied[0].sum_ms
        expected = MICROBATCHES * (add_ms + add_ms / 3) if mfu is None else 0.0
        assert add_ms > 0 and next(x for x in handed.layers if x.name == "output").wgrad_accumulate_ms == 0
        for profile in (made, handed):
            head = next(cost for cost in layers.layer_costs(profile) if cost.name == "output")
            assert tiedadd.tied_local_add_ms(head, profile, setup) == pytest.approx(expected, rel=1e-12)


def test_nothing_beside_a_pipeline():
    for runtime in ("torchtitan", "megatron"):
        assert set(_adds_ms(_setup(runtime, zero=1 if runtime == "megatron" else 0, stages=2)).values()) == {0.0}


def test_evaluate_adds_it_to_the_iteration():
    plan = [StagePlan(index=0, layers=NAMES)]
    setup = _setup("torchtitan", zero=3, dp=2)
    charged = costmodel.evaluate(plan, _profile(), setup).iteration_ms
    assert charged - costmodel.evaluate(plan, _profile(sum_ms=0.0), setup).iteration_ms == \
        pytest.approx(MICROBATCHES * ADD_MS)
