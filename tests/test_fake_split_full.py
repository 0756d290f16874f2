"""A fake profile's split backward of a layer checkpointed whole (`full`): torch 2.13's
stage_backward_input reruns the layer's forward once, and stage_backward_weight once per parameter
group (each group's autograd.grad is its own graph task; non-reentrant checkpoint recomputes per
graph task, stopping after the last tensor the forward saved). Counted on fake tensors, as
`profile --fake` counts it, against hand counts; the reruns counted by torch itself, without the
counters; and recorded in a fake profile made by the CLI (docs/framework-facts.md §62, §73)."""

import inspect

import pytest
import torch
from fixtures.cli import run_ok
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from planner import io
from planner.profiler.fake import counting
from planner.profiler.fake_mode import fake_module, new_mode
from planner.profiler.fake_split import split_work
from planner.runtime.recompute import layer_runner

ROWS, WIDTH, HIDDEN = 8, 16, 32
ATTN = 2 * ROWS * WIDTH * WIDTH  # the Linear(16, 16)'s forward GEMM, 4,096 FLOPs; each gradient GEMM the same
UP = DOWN = 2 * ROWS * WIDTH * HIDDEN  # Linear(16, 32) and Linear(32, 16): 8,192 each
GROUPS = 4  # LayerNorm, the three Linears: each its weight and bias, met at its own op


class Block(nn.Module):
    """A pre-norm block in miniature: norm, a Linear for attention, a residual, a two-Linear MLP
    (the CLI test's model file holds this source)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.attn = nn.Linear(16, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x + self.mlp(x)


def _fake_block():
    mode = new_mode()
    with torch.device("meta"):
        block = Block()
    fake_module(block, mode)
    with mode:
        x = torch.empty(ROWS, WIDTH, requires_grad=True)
        grad = torch.ones(ROWS, WIDTH)
    return block, x, grad, mode


def test_full_recompute_splits_on_fake_tensors_by_hand_count():
    """The rerun stops before the last GEMM (early stop: its input is the last tensor the forward
    saved, packed before the GEMM runs), so it runs norm, ATTN, UP: 12,288 FLOPs. I = the three
    input-gradient GEMMs + one rerun; W = the three weight-gradient GEMMs + one rerun per group;
    the plain backward of the checkpointed layer = all six gradient GEMMs + one rerun."""
    block, x, grad, mode = _fake_block()
    rerun = ATTN + UP
    with mode:
        none = split_work(layer_runner(block, "none"), block, x, grad, counting)
        full = split_work(layer_runner(block, "full"), block, x, grad, counting)
    gradients = ATTN + UP + DOWN
    assert [w.flops for w in none] == [gradients, gradients, 2 * gradients]
    assert [w.flops for w in full] == [gradients + rerun, gradients + GROUPS * rerun, 2 * gradients + rerun]
    # the composition: none's split plus the rerun once in I and once a group in W, bytes too
    rerun_work = full[2] - none[2]
    assert (full[0] - none[0]).bytes == rerun_work.bytes
    assert (full[1] - none[1]).bytes == GROUPS * rerun_work.bytes
    assert x.grad is None and all(p.grad is None for p in block.parameters())


def test_the_weight_pass_adds_into_grad_as_the_profiles_backward_does():
    """Linear(16, 32) without bias on 8 rows: W is the weight GEMM (2·8·16·32 FLOPs) and torch's
    `weight.grad += dw` (read both, write one: 3 x 512 floats), as from a step's second microbatch
    on; the plain backward the same add (AccumulateGrad), as the profile's bwd_ms counts it. Before,
    W made the .grad (no add) and the plain backward after it added: the pair came out under the
    yardstick, and a fake profile's none recorded I + W at 0.93 x its bwd_ms on Qwen2-1.5B."""
    linear = nn.Linear(16, 32, bias=False)
    x = torch.randn(8, 16, requires_grad=True)
    input_pass, weight_pass, plain = split_work(linear, linear, x, torch.ones(8, 32), counting)
    assert (input_pass.flops, weight_pass.flops, plain.flops) == (8192, 8192, 16384)
    assert (input_pass.bytes, weight_pass.bytes, plain.bytes) == (0, 3 * 512 * 4, 3 * 512 * 4)
    assert linear.weight.grad is None


def test_torch_reruns_the_checkpointed_forward_once_in_i_and_once_a_group_in_w():
    """Real tensors, no counters: the layer's forward calls, counted by a hook, in each pass."""
    torch.manual_seed(0)
    block = Block()
    calls = []
    handle = block.register_forward_pre_hook(lambda module, args: calls.append(1))
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    weights = list(block.parameters())
    output = layer_runner(block, "full")(x)
    assert len(calls) == 1
    _, groups = stage_backward_input([output], [torch.ones(ROWS, WIDTH)], [x], iter(weights))
    assert len(calls) == 2 and len(groups) == GROUPS
    stage_backward_weight(iter(weights), groups)
    assert len(calls) == 2 + GROUPS
    handle.remove()


MODEL = f'''
import torch
from torch import nn
{inspect.getsource(Block)}

def build_model():
    return nn.Sequential(nn.Linear(16, 16), Block(), Block())


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size, 16), torch.randn(micro_batch_size, 16)
'''


def test_a_fake_profile_records_full_recomputes_split(tmp_path):
    """`profile --fake`: each block's full option has its I and W, W holding a rerun a group;
    before, full was left without a pair and charged half each of B + the rerun, no rerun in W."""
    model = tmp_path / "blocks.py"
    model.write_text(MODEL)
    run_ok("profile", model, "--fake", "--device", "cpu", "--micro-batch-size", str(ROWS), "--gpu", "h100-sxm",
           "--out", tmp_path / "f.json")
    profile = io.load_profile(tmp_path / "f.json")
    for layer in profile.layers[1:]:
        none, full = layer.recompute_options[0], layer.recompute_options[1]
        assert full.name == "full" and full.input_grad_ms is not None and full.weight_grad_ms is not None
        # at the roofline the passes' times add as their work does: none's pair plus the rerun in I
        # and a rerun a group in W (the same FLOPs and bytes, the first test; within 1e-4: the rerun's
        # bytes inside a backward are classed by the module running them a little apart from the
        # recompute_ms count's, so at slightly different memory-bound rates)
        assert full.input_grad_ms == pytest.approx(none.input_grad_ms + full.recompute_ms, rel=1e-4)
        assert full.weight_grad_ms == pytest.approx(none.weight_grad_ms + GROUPS * full.recompute_ms, rel=1e-4)
