"""torch's Adam keeps a 4 B fp32 step count per parameter tensor on the CPU (torch 2.13.0 adam.py 168-176, §382):
charged on a CPU device only, once for a tied table on one stage (planner/cost/stepcounts.py). Hand counts on three
layers of 2, 12 and 3 tensors, the last holding the first's table."""

import pytest

from planner.cost import costmodel
from planner.schema import (
    DeviceInfo,
    FileRef,
    LayerProfile,
    Profile,
    StagePlan,
    TiedSet,
    TrainSetup,
)

PLAN = [StagePlan(index=0, layers=["embed", "block", "head"])]


def _profile(device: str, tensors: bool = True) -> Profile:
    def layer(name: str, count: int) -> LayerProfile:
        return LayerProfile(name=name, kind=name, fwd_ms=1.0, bwd_ms=2.0, fwd_ms_min=1.0, fwd_ms_max=1.0,
                            bwd_ms_min=2.0, bwd_ms_max=2.0, act_bytes=1 << 10, input_bytes=1 << 8,
                            output_bytes=1 << 8, param_count=1000, param_bytes=4000, transient_bytes=0,
                            param_tensors=count if tensors else 0)

    return Profile(name="t", created_at="now", torch_version="x", device=DeviceInfo(type=device, name=device),
                   dtype="float32", micro_batch_size=1, model=FileRef(file="m.py", sha256="0" * 64),
                   layers=[layer("embed", 2), layer("block", 12), layer("head", 3)],
                   tied=[TiedSet(layers=["embed", "head"], param_count=100, param_bytes=400)])


def _setup(optimizer: str = "adam", **extra) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=2, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[1 << 30],
                      runtime="ckplan", precision="fp32", optimizer=optimizer, **extra)


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_adam_on_the_cpu_holds_a_count_per_tensor_the_tied_one_once(zero):
    extra = {"dp": 2, "zero": zero} if zero else {}
    with_counts = costmodel.evaluate(PLAN, _profile("cpu"), _setup(**extra)).stages[0]
    without = costmodel.evaluate(PLAN, _profile("cpu", tensors=False), _setup(**extra)).stages[0]
    assert with_counts.static_bytes - without.static_bytes == 4 * (2 + 12 + 3 - 1)
    assert with_counts.peak_bytes - without.peak_bytes == 4 * 16


def test_none_on_a_gpu_nor_for_sgd():
    for profile, setup in ((_profile("cuda"), _setup()), (_profile("cpu"), _setup("sgd"))):
        counted = costmodel.evaluate(PLAN, profile, setup).stages[0]
        bare = costmodel.evaluate(PLAN, _profile(profile.device.type, tensors=False), setup).stages[0]
        assert counted.static_bytes == bare.static_bytes
