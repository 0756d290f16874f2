"""A fake profile says how much of each layer's transient is autograd's fresh weight gradients (the model's code run
into a `.grad` made before: each new gradient alive until AccumulateGrad adds it in place), so the transient a
runtime accumulating inside its wgrad GEMM holds is read off it; an analytic profile's transient has them in place
(0). Hand counts on tiny layers, fp32 on the CPU (no 512-byte blocks)."""

import pytest
import torch
from fixtures.cli import run_ok
from torch import nn

from planner import io
from planner.profiler import measure
from planner.profiler.fake_wgrad import transient_in_place
from planner.profiler.storages import StorageTracker

CHAIN = '''
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 32, bias=False))


def example_batch(micro_batch_size):
    return torch.randint(0, 64, (micro_batch_size,)), torch.randn(micro_batch_size, 32)
'''


def fresh_bytes(layer: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> int:
    """Of the transient, the fresh weight gradients'; the transient itself measure's count (fake.py takes it here)."""
    transient, in_place = transient_in_place(layer, x, grad)
    assert transient == measure._transient_bytes(layer, x, grad, tracker=lambda device: StorageTracker())
    return transient - in_place


def _ready(layer: nn.Module) -> nn.Module:
    for param in layer.parameters():
        param.grad = torch.zeros_like(param)  # as fake.py makes them: AccumulateGrad then adds in place
    return layer


def test_a_linears_fresh_weight_gradient_is_its_transients_share():
    # Linear 8 -> 16 on 4 rows: kept its output [4, 16] (256 B); the backward receives [4, 16] (256 B) and makes
    # the input's gradient [4, 8] (128 B) and the weight's [16, 8] (512 B), all alive at once:
    # 256 + 128 + 512 - 256 kept + 256 received = 896; in place (no [16, 8] of its own) 384
    layer = _ready(nn.Linear(8, 16, bias=False))
    x = torch.randn(4, 8, requires_grad=True)
    assert transient_in_place(layer, x, torch.zeros(4, 16)) == (896, 384)
    assert fresh_bytes(layer, x, torch.zeros(4, 16)) == 16 * 8 * 4


def test_stacked_experts_make_one_fresh_gradient_as_large_as_all_of_them():
    # transformers' experts hold every expert's weight in one tensor [E, h, f]: the batched product's weight
    # gradient is one [4, 8, 6] tensor (768 B) whatever the tokens; kept the output [4, 3, 6] (288 B); the input's
    # gradient [4, 3, 8] (384 B): 288 + 384 + 768 - 288 + 288 = 1,440, in place 672
    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 8, 6))

        def forward(self, x):
            return torch.bmm(x, self.w)

    layer, x = _ready(Experts()), torch.randn(4, 3, 8, requires_grad=True)
    assert transient_in_place(layer, x, torch.zeros(4, 3, 6)) == (1440, 672)
    layer.w.requires_grad_(False)  # no weight gradient: nothing fresh
    assert fresh_bytes(layer, x, torch.zeros(4, 3, 6)) == 0


def test_the_fake_profile_records_it_and_the_analytic_one_has_it_in_place(tmp_path):
    model = tmp_path / "chain.py"
    model.write_text(CHAIN)
    run_ok("profile", model, "--fake", "--device", "cpu", "--micro-batch-size", "4", "--out", tmp_path / "f.json")
    fake = io.load_profile(tmp_path / "f.json")
    # the embedding's backward makes the whole table's gradient [64, 16] (4,096 B) beside its output's [4, 16]
    # (256 B) received; the linear's, its weight's [32, 16] (2,048 B) beside the input's [4, 16] and its output's
    # [4, 32] received (2,048 + 256 + 512 = 2,816, in place 768)
    assert [(layer.transient_bytes, layer.weight_grad_transient_bytes) for layer in fake.layers] == \
        [(4096 + 256, 64 * 16 * 4), (2816, 32 * 16 * 4)]
    assert "weight_grad_transient_bytes" in fake.assumptions["transients"]
    run_ok("profile", "--arch", "llama3-8b", "--seq-len", "8", "--out", tmp_path / "a.json")
    analytic = io.load_profile(tmp_path / "a.json")
    # wgradfresh: the embedding's backward makes the whole table's gradient fresh (embedding_dense_backward, no GEMM to
    # accumulate it into): 128,256 x 4,096 x 2 B = 1,050,673,152 B on the embedding alone; every block's in place, 0
    fresh = [layer.weight_grad_transient_bytes for layer in analytic.layers]
    assert fresh == [128_256 * 4_096 * 2] + [0] * (len(fresh) - 1)
    assert "accumulated in place" in analytic.assumptions["transients"]


@pytest.mark.parametrize("frozen", [True, False])
def test_a_layer_without_trainable_weights_has_nothing_fresh(frozen):
    layer = _ready(nn.Linear(8, 16, bias=False)).requires_grad_(not frozen)
    x = torch.randn(4, 8, requires_grad=True)
    assert (fresh_bytes(layer, x, torch.zeros(4, 16)) == 0) is frozen
