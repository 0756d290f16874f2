"""Every recompute option's kept bytes in a measured profile are what the layer holds when the
runtime runs it under that option, for layers with no matmul (convolutions, BatchNorm,
GroupNorm, LayerNorm, pooling, dropout), not only for matmul layers.

The runtime's side is measured as `ckplan launch` measures a cpu stage (MemTracker, memtrack.py):
a stage of the one layer (stagemodule.stage_module) runs forward on a fresh copy of its input,
and what stays live besides the layer's weights and its output (which the next layer's input or
the stage's output pays for) is what it keeps for backward, its input included when it holds it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT
from torch.distributed._tools.mem_tracker import MemTracker

from planner.models import modelfile
from planner.profiler.measure import measure_model
from planner.runtime.stagemodule import stage_module
from planner.schema import OPTION_NONE

# measured in this process, read as bytes: at one thread (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")

FIXTURES = ROOT / "tests" / "fixtures"
MODELS = ["conv1d_resnet.py", "conv2d_net.py", "normpool_net.py"]


def runtime_kept_bytes(name: str, layer: torch.nn.Module, x: torch.Tensor, option: str, *, first: bool) -> int:
    stage = stage_module([(name, layer)], options={name: option})
    weights = sum(t.untyped_storage().nbytes() for t in (*layer.parameters(), *layer.buffers()))
    source = x.detach()  # a view made inside would count x's storage too
    with MemTracker() as tracker:
        held = source.clone().requires_grad_(not first and x.is_floating_point())
        output = stage(held)
        del held
        live = sum(stats["Total"] for stats in tracker.get_tracker_snapshot("current").values())
    return live - weights - output.untyped_storage().nbytes()


@pytest.mark.parametrize("model", MODELS)
def test_every_measured_option_keeps_what_the_runtime_holds(model):
    loaded = modelfile.load_model_file(FIXTURES / model)
    torch.manual_seed(0)
    layers = modelfile.pipeline_layers(loaded.build_model(), loaded.path)
    inputs, targets = loaded.example_batch(2)
    outputs = modelfile.check_chain(layers, inputs)
    profile = measure_model(layers, inputs, targets, loaded.loss_fn, layer_outputs=outputs, warmup=0, repeats=1)
    checked = 0
    for index, ((name, layer), measured) in enumerate(zip(layers, profile.layers, strict=True)):
        x = [inputs, *outputs][index]
        for option in measured.recompute_options:
            if option.name == OPTION_NONE:
                continue
            held = runtime_kept_bytes(name, layer, x, option.name, first=index == 0)
            assert abs(option.kept_bytes - held) <= 0.01 * held, (name, option.name, option.kept_bytes, held)
            checked += 1
    assert checked > len(layers)  # full and at least one selective option somewhere
