"""The sum that keeps a tied parameter tied (rules.tied_sum_ms; docs/framework-facts.md §247-§249): the
all-reduce between the holders' ranks over the link between them, and nothing where one rank holds them all."""

import pytest

from planner.cost import costmodel, rules
from planner.cost.layers import LayerCost
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


def _layer(tied: tuple[tuple[int, int], ...] = ((SHARED, 2),)) -> LayerCost:
    return LayerCost(name="embed", kind="embed", fwd_ms=1.0, bwd_ms=1.0, act_bytes=0, input_bytes=0, output_bytes=0,
                     input_in_act_bytes=0, param_count=SHARED, transient_bytes=0, tied=tied)


def _setup(*, stages: int = 2, chunks: int = 1, schedule: str = "1F1B", runtime: str = "ckplan",
           version: str | None = None, **comm) -> TrainSetup:
    return TrainSetup(stages=stages, chunks=chunks, schedule=schedule, microbatches=4, micro_batch_size=1,
                      mem_caps_bytes=[80 << 30] * stages, runtime=runtime, runtime_version=version,
                      precision="bf16-mixed", comm={"pp_gb_per_s": 50.0, "pp_latency_ms": 0.01, **comm})


def test_split_ends_all_reduce_their_gradient_over_the_pipelines_link():
    # torch's bf16 .grad, 2 B a parameter: a ring all-reduce of two ranks moves 2 x (2 - 1) / 2 x 20 MB = 20 MB
    # a rank at 50 GB/s (0.4 ms) after 2 steps of 0.01 ms
    assert rules.tied_sum_ms(_layer(), _setup()) == pytest.approx(0.02 + 20e6 / 50e9 * 1e3)


def test_the_sum_reads_the_gradient_the_runtime_reduces():
    # Megatron-LM all-reduces its fp32 main_grad (4 B); DeepSpeed's pipeline engine its BF16_Optimizer's fp32
    # _hp_grad where the record keeps one (56c52238), else the bf16 .grad (2 B)
    fp32 = 0.02 + 40e6 / 50e9 * 1e3
    assert rules.tied_sum_ms(_layer(), _setup(runtime="megatron")) == pytest.approx(fp32)
    assert rules.tied_sum_ms(_layer(), _setup(runtime="deepspeed", version="56c52238")) == pytest.approx(fp32)
    assert rules.tied_sum_ms(_layer(), _setup(runtime="deepspeed")) == pytest.approx(0.02 + 20e6 / 50e9 * 1e3)


def test_nothing_is_summed_where_one_rank_holds_both_ends():
    # one stage: one nn.Parameter, autograd sums the two uses; ZBV: stages 0 and 3 both on rank 0
    assert rules.tied_sum_ms(_layer(), _setup(stages=1)) == 0.0
    assert rules.tied_sum_ms(_layer(), _setup(stages=4, chunks=2, schedule="ZBV")) == 0.0
    # interleaved 1F1B puts stage 0 on rank 0 and stage 3 on rank 1: the all-reduce
    assert rules.tied_sum_ms(_layer(), _setup(stages=4, chunks=2, schedule="interleaved-1F1B")) > 0.0


def test_the_ends_on_two_nodes_sum_over_the_network():
    # 4 ranks a node, stride 2: stage 0 on rank 0 (node 0), stage 2 on global rank 4 (node 1)
    setup = _setup(stages=3, pp_stride=2, gpus_per_node=4, pp_network_gb_per_s=25.0, pp_network_latency_ms=0.02)
    assert rules.tied_sum_ms(_layer(), setup) == pytest.approx(0.04 + 20e6 / 25e9 * 1e3)


def _profile(*, tied: bool) -> Profile:
    def layer(name: str) -> LayerProfile:
        return LayerProfile(name=name, kind=name, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 20, input_bytes=1 << 10,
                            output_bytes=1 << 10, param_count=SHARED, param_bytes=2 * SHARED, transient_bytes=0)

    sets = [TiedSet(layers=["embed", "head"], param_count=SHARED, param_bytes=2 * SHARED, sum_ms=99.0)] if tied else []
    return Profile(name="tied", created_at="now", torch_version="x", device=DeviceInfo(type="cuda", name="h100"),
                   dtype="bfloat16", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64),
                   layers=[layer("embed"), layer("block"), layer("head")], tied=sets)


def test_evaluate_charges_the_all_reduce_on_each_holder_split_and_nothing_on_one_stage():
    names = ["embed", "block", "head"]
    one = _setup(stages=1)
    alone = [StagePlan(index=0, layers=names)]
    assert costmodel.evaluate(alone, _profile(tied=True), one).iteration_ms == \
        pytest.approx(costmodel.evaluate(alone, _profile(tied=False), one).iteration_ms)
    two = _setup(stages=2)
    split = [StagePlan(index=0, layers=names[:2]), StagePlan(index=1, layers=names[2:])]
    tied = costmodel.evaluate(split, _profile(tied=True), two)
    untied = costmodel.evaluate(split, _profile(tied=False), two)
    extra = 0.02 + 20e6 / 50e9 * 1e3  # each rank's step waits for its all-reduce (profile's sum_ms not read)
    assert tied.iteration_ms - untied.iteration_ms == pytest.approx(extra)
