"""A tied parameter on one stage is one nn.Parameter (docs/framework-facts.md §307): the optimizer steps it once,
data parallelism reduces it (and ZeRO 1/2 gather it after the step) once, and the step's scratch holds it once, at
its first holder, as the static bytes already count it (rules.tied_once_bytes); ZeRO 3 gathers it for each holder. Hand counts on a table of 10M parameters the
embedding and the head share, beside a block of 10M; every layer's step timed at 1e-7 ms a parameter."""

import pytest

from planner.cost import costmodel, dataparallel
from planner.schema import (
    DeviceInfo,
    FileRef,
    LayerProfile,
    Profile,
    StagePlan,
    TiedSet,
    TrainSetup,
)

SHARED = 10_000_000
PLAN = [StagePlan(index=0, layers=["embed", "block", "head"])]


def _profile(*, tied: bool) -> Profile:
    """tied: the head's weight is the embedding's table (its param_count counts it, as profiles record a tied
    holder); else the same job written as one parameter: the head holds none of its own."""
    def layer(name: str, count: int) -> LayerProfile:
        return LayerProfile(name=name, kind=name, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 20, input_bytes=1 << 10,
                            output_bytes=1 << 10, param_count=count, param_bytes=2 * count, transient_bytes=0,
                            step_ms={"adam": count * 1e-7})

    sets = [TiedSet(layers=["embed", "head"], param_count=SHARED, param_bytes=2 * SHARED)] if tied else []
    return Profile(name="tied", created_at="now", torch_version="x", device=DeviceInfo(type="cuda", name="h100"),
                   dtype="bfloat16", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64),
                   layers=[layer("embed", SHARED), layer("block", SHARED), layer("head", SHARED if tied else 0)],
                   tied=sets)


def _setup(runtime: str, zero: int, **links) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[80 << 30],
                      runtime=runtime, precision="bf16-mixed", optimizer="adam", dp=4, zero=zero, **links)


def test_one_stage_steps_the_shared_table_once():
    # ckplan's runtime, ZeRO 0, no link known: the step is the embedding's and the block's, 2 x 10M x 1e-7 ms
    # (before: the head's 10M again, 3.0 ms); Adam's sqrt(v) scratch 4 B x 20M = 80,000,000 B (before 120,000,000)
    stage = costmodel.evaluate(PLAN, _profile(tied=True), _setup("ckplan", 0)).stages[0]
    assert stage.step_ms == pytest.approx(2.0)
    assert stage.step_scratch_bytes == 80_000_000


@pytest.mark.parametrize("runtime", ["ckplan", "torchtitan", "megatron", "deepspeed"])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_the_tied_table_reduces_and_gathers_as_one_parameter(runtime, zero):
    # at 10 GB/s between the replicas: the reductions (and ZeRO 1/2's gathers) of the table once, as for the job
    # written with one parameter (before: 1.5x the step, e.g. ckplan ZeRO 1 9.75 ms against 6.5)
    links = {"shard_gb_per_s": 10.0, "replica_gb_per_s": 10.0}
    tied = costmodel.evaluate(PLAN, _profile(tied=True), _setup(runtime, zero, **links)).stages[0]
    one = costmodel.evaluate(PLAN, _profile(tied=False), _setup(runtime, zero, **links)).stages[0]
    if zero < 3:
        assert tied.step_ms == pytest.approx(one.step_ms)
    else:  # ZeRO 3 gathers a weight for each module that uses it (DeepSpeed's coordinator a submodule at a time)
        assert tied.step_ms > one.step_ms
        setup = _setup(runtime, zero, **links)
        gather, reduce = dataparallel.collectives_ms(SHARED, setup, shared=SHARED)
        assert reduce == 0.0 and gather == pytest.approx(dataparallel.weight_gather_ms(SHARED, setup))
    assert tied.static_bytes == one.static_bytes
    # the head's gradient of the table (bf16, 2 B) waits in autograd's InputBuffer to the embedding's backward
    # (§336, §381), which the one-parameter job, its head holding no parameter, never makes
    buffered = 2 * SHARED
    if runtime in ("torchtitan", "ckplan") and zero == 3:
        # FSDP2's units: the tied modules are one unit (§307, §308), gathered from the head's backward to the
        # embedding's (§330): where the blocks' backward peaks, with the table (bf16, 2 B) the one-parameter job lacks
        assert buffered <= tied.peak_bytes - one.peak_bytes <= buffered + 2 * SHARED
    else:
        assert tied.peak_bytes == one.peak_bytes + buffered


def test_split_holders_each_step_their_copy():
    # two stages: each holder's rank steps its own copy of the table (the sum keeps them equal): 1e-7 x 20M on
    # stage 0 (embedding and block), 1e-7 x 10M on stage 1 (the head's copy)
    setup = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[80 << 30] * 2,
                       runtime="ckplan", precision="bf16-mixed", optimizer="adam")
    split = [StagePlan(index=0, layers=["embed", "block"]), StagePlan(index=1, layers=["head"])]
    stages = costmodel.evaluate(split, _profile(tied=True), setup).stages
    assert [stage.step_ms for stage in stages] == pytest.approx([2.0, 1.0])


def test_the_buffered_gradient_only_where_the_holders_share_the_stage():
    # one stage: the table once in the weights' dtype (bf16-mixed 2 B, fp32 4 B); two stages: each holder's
    # stage has its own AccumulateGrad, nothing waits (tiedadd.buffered_grad_bytes)
    from planner.cost import tiedadd

    profile = _profile(tied=True)
    assert tiedadd.buffered_grad_bytes(profile, 0, _setup("ckplan", 0)) == 2 * SHARED
    fp32 = TrainSetup(stages=1, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[80 << 30],
                      runtime="ckplan", precision="fp32", optimizer="adam")
    assert tiedadd.buffered_grad_bytes(profile, 0, fp32) == 4 * SHARED
    split = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[80 << 30] * 2,
                       runtime="ckplan", precision="bf16-mixed", optimizer="adam")
    assert tiedadd.buffered_grad_bytes(profile, 0, split) == tiedadd.buffered_grad_bytes(profile, 1, split) == 0
    assert tiedadd.buffered_grad_bytes(_profile(tied=False), 0, _setup("ckplan", 0)) == 0
