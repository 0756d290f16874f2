"""Recompute options (planner/runtime/recompute.py): which a layer has, the bytes each keeps counted
by hand, the FLOPs each recomputes counted exactly, every option training bit for bit like
none, and a pipeline mixing them whose peaks the cost model predicts."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT
from fixtures.cli import run, run_ok
from fixtures.rt_plans import make_plan
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import planner.runtime.launcher as launcher
from planner import io
from planner.cost import costmodel
from planner.models import modelfile
from planner.profiler.measure import measure_model
from planner.profiler.saved import saved_bytes
from planner.runtime import validate_plan
from planner.runtime.checks import prepare
from planner.runtime.recompute import find_options, layer_runner, offloading_runner
from planner.runtime.reference import reference_losses
from planner.schema import OPTION_FULL, OPTION_NONE, OPTION_OFFLOAD

FIXTURES = ROOT / "tests" / "fixtures"
LLAMA = FIXTURES / "llama_style.py"
F32 = 4
B, S, D, H = 2, 3, 4, 6  # batch, sequence, width, SwiGLU hidden
N = B * S  # rows


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, H, bias=False)
        self.w3 = nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class NormMLPBlock(nn.Module):
    """x + mlp(norm(x)): small enough to count every saved tensor by hand."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.mlp = SwiGLU()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


# What each option keeps, in floats. x: the input (N x D); mean, rstd: LayerNorm's (N x 1 each);
# y: the norm's output, the MLP's input; g = w1(y), u = w3(y) (N x H); silu(g) and silu(g) * u
# (N x H, saved by the mul and by w2); o = w2(...) (N x D), kept only by a selective policy,
# which saves every matmul output (its cache holds o until the backward, though no backward reads it).
KEPT_FLOATS = {
    OPTION_NONE: N * D + 2 * N + N * D + 4 * N * H,  # x, mean, rstd, y, g, u, silu(g), the product
    OPTION_FULL: N * D,  # x
    "mlp": N * D + 2 * N + N * D,  # the norm's x, mean, rstd; checkpoint keeps the MLP's input y
    "mlp-act": N * D + 2 * N + N * D + 2 * N * H + N * D,  # ... and its matmuls' g, u, o; not silu(g), the product
    "norm": N * D + N * D + 4 * N * H,  # checkpoint keeps the norm's x, not mean and rstd; the MLP keeps all
    "save-matmuls": N * D + 2 * N * H + N * D,  # the layer's input x, the matmul outputs g, u, o
    "mlp-act,norm": N * D + N * D + 2 * N * H + N * D,  # x for the norm, y, g, u, o for the MLP
}


def test_find_options_of_a_norm_and_mlp_block():
    # no attention: nothing with attn; mlp and norm alone are combined only as mlp-act,norm
    assert find_options(NormMLPBlock()) == ["mlp", "mlp-act", "norm", "save-matmuls", OPTION_OFFLOAD, "mlp-act,norm"]
    assert find_options(SwiGLU()) == ["save-matmuls", OPTION_OFFLOAD]  # its own parts are plain Linears
    assert find_options(nn.Linear(D, D)) == ["save-matmuls", OPTION_OFFLOAD]


@pytest.mark.parametrize("policy_sees_output", [True, False], ids=["torch-2.13", "torch-2.11"])
def test_exact_kept_bytes_of_each_option(policy_sees_output, monkeypatch):
    # torch 2.11's selective policy is called before the op and sees no output: the saved
    # outputs are then read from the forward's storage (the GPU check found this on CUDA torch 2.11)
    import planner.runtime.recompute

    monkeypatch.setattr(planner.runtime.recompute, "_POLICY_SEES_OUTPUT", policy_sees_output)
    torch.manual_seed(0)
    block = NormMLPBlock()
    options = [name for name in KEPT_FLOATS if name not in (OPTION_NONE, OPTION_FULL)]
    saved = saved_bytes([("block", block)], torch.randn(B, S, D), torch.randn(B, S, D), F.mse_loss, options=[options])
    assert saved.act_bytes == [KEPT_FLOATS[OPTION_NONE] * F32]
    assert saved.option_bytes == [{name: KEPT_FLOATS[name] * F32 for name in options}]
    # every option keeps the layer's own input, as none does: the cost model's stage-input
    # correction (input_in_act_bytes) holds under every option
    assert saved.option_input_bytes == [dict.fromkeys(options, N * D * F32)]


def test_offload_copies_each_saved_storage_out_once_and_back_once():
    """The offload option over NormMLPBlock, made to copy cpu tensors (move_cpu: what it does to
    a GPU's): the input x stays, as do the weights (kept by storage); every other saved storage
    (mean, rstd, y, g, u, silu(g), the product: none's less x) goes to the host once, though w1
    and w3 both save y, and comes back once, when the backward reaches the block (the hook on
    its output), for every view saved of it. The gradients are none's bit for bit."""
    torch.manual_seed(0)
    block = NormMLPBlock()
    x = torch.randn(B, S, D, requires_grad=True)
    grad = torch.randn(B, S, D)
    out = block(x)
    out.backward(grad)
    want = [out.detach(), x.grad, *(p.grad for p in block.parameters())]
    block.zero_grad(set_to_none=True)
    x.grad = None

    kept, out_copies, back_copies = [], [], []
    real_empty = torch.empty

    def counting_empty(*args, **kwargs):  # both copies are made by torch.empty(..., dtype=uint8)
        made = real_empty(*args, **kwargs)
        if kwargs.get("dtype") is torch.uint8 and made.numel():
            (back_copies if "device" in kwargs else out_copies).append(made.numel())
        return made

    moved = (KEPT_FLOATS[OPTION_NONE] - N * D) * F32
    torch.empty = counting_empty
    try:
        out = offloading_runner(block, kept.append, move_cpu=True)(x)
        assert sum(out_copies) == moved and len(out_copies) == 7 and not back_copies
        fetched = []  # a hook after the option's own: all seven are back before the block's backward
        out.register_hook(lambda _: fetched.append(len(back_copies)))
        out.backward(grad)
    finally:
        torch.empty = real_empty
    assert sum(back_copies) == moved and len(back_copies) == 7 and fetched == [7]
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    assert {t.untyped_storage().data_ptr() for t in kept} - params == {x.untyped_storage().data_ptr()}
    got = [out.detach(), x.grad, *(p.grad for p in block.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# Backward FLOPs of the block on a (B, S, D) input that needs its gradient (torch's counter
# counts matmuls): each Linear's backward is 2 matmuls of its forward's 2 * N * in * out FLOPs.
MATMUL = 2 * N * D * H  # one of w1, w3, w2 forward
PLAIN = 3 * 2 * MATMUL


@pytest.mark.parametrize(("option", "expected"), [
    (OPTION_NONE, PLAIN),
    # the recompute reruns w1 and w3; non-reentrant checkpoint stops once w2's input is back, before its matmul
    (OPTION_FULL, PLAIN + 2 * MATMUL),
    ("mlp", PLAIN + 2 * MATMUL),
    ("mlp-act", PLAIN),  # g and u come from the cache: silu and the product alone are recomputed
    ("norm", PLAIN),
    ("save-matmuls", PLAIN),
    ("mlp-act,norm", PLAIN),
])
def test_backward_flops_count_exactly_what_each_option_recomputes(option, expected):
    torch.manual_seed(0)
    block = NormMLPBlock()
    x = torch.randn(B, S, D, requires_grad=True)
    # the counter runs over the forward too: a selective policy replays the forward's ops by
    # count, and the counter's own dispatch must be there both times
    with FlopCounterMode(display=False) as counter:
        out = layer_runner(block, option)(x)
        forward = counter.get_total_flops()
        out.sum().backward()
    assert forward == 3 * MATMUL
    assert counter.get_total_flops() - forward == expected


def _llama_layers():
    loaded = modelfile.load_model_file(LLAMA)
    torch.manual_seed(0)
    return loaded, modelfile.pipeline_layers(loaded.build_model())


ALL_BLOCK_OPTIONS = ["attn", "mlp", "mlp-act", "norm", "save-matmuls", OPTION_OFFLOAD, "attn,mlp", "attn,mlp-act",
                     "attn,norm", "mlp-act,norm", "attn,mlp-act,norm"]
# what a cpu profile measures: offload moves nothing where the host is the device
CPU_BLOCK_OPTIONS = [name for name in ALL_BLOCK_OPTIONS if name != OPTION_OFFLOAD]


def test_find_options_on_the_llama_style_model():
    _, layers = _llama_layers()
    assert [find_options(layer) for _, layer in layers] == [
        ["save-matmuls", OPTION_OFFLOAD],  # the embedding: nothing recognisable inside
        ALL_BLOCK_OPTIONS, ALL_BLOCK_OPTIONS,
        ["save-matmuls", OPTION_OFFLOAD],  # the final RMSNorm is the layer itself, not a part of it
        ["save-matmuls", OPTION_OFFLOAD],
    ]


def _hf_llama_layers():
    pytest.importorskip("transformers")
    from planner.models import hfmodels

    config = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    build_model, example_batch = hfmodels.model_file(config, seq_len=8)  # random weights: nothing downloaded
    torch.manual_seed(0)
    model = build_model()
    return model.pipeline_layers(), example_batch(2)[0]


def test_find_options_on_a_hugging_face_llama():
    layers, _ = _hf_llama_layers()
    decoder = dict(layers)["layers.0"]
    hf_layer = decoder.layer  # transformers' LlamaDecoderLayer: self_attn, mlp, input_/post_attention_layernorm
    assert type(hf_layer).__name__ == "LlamaDecoderLayer"
    assert find_options(hf_layer) == ALL_BLOCK_OPTIONS
    assert find_options(decoder) == ALL_BLOCK_OPTIONS  # found inside ckplan's pipeline wrapper too
    assert find_options(dict(layers)["head"]) == ["norm", "save-matmuls", OPTION_OFFLOAD]


@pytest.mark.parametrize("model", ["llama_style", "hugging_face_llama"])
def test_every_option_gives_the_same_output_and_gradients_bit_for_bit(model):
    """The forward values and every gradient under each option equal the plain layer's, also
    for Hugging Face's attention, which takes its rotary embeddings as a keyword argument."""
    if model == "llama_style":
        _, layers = _llama_layers()
        layer = layers[1][1]
        x = torch.randn(2, 32, 64)
    else:
        layers, _ = _hf_llama_layers()
        layer = dict(layers)["layers.1"]
        x = torch.randn(2, 8, 32)
    grad = torch.randn_like(x)

    def step(option):
        layer.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_(True)
        out = layer_runner(layer, option)(leaf)
        out.backward(grad)
        return [out.detach(), leaf.grad, *(p.grad for p in layer.parameters())]

    want = step(OPTION_NONE)
    for option in [OPTION_FULL, *find_options(layer)]:
        got = step(option)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), option
    assert not any("forward" in module.__dict__ for module in layer.modules())  # every submodule its own again


@pytest.mark.usefixtures("one_thread")  # the bytes and options at any count (conftest.one_thread)
def test_profile_lists_the_options_of_each_kind():
    loaded, layers = _llama_layers()
    inputs, targets = loaded.example_batch(2)
    outputs = modelfile.check_chain(layers, inputs)
    result = measure_model(layers, inputs, targets, loaded.loss_fn, layer_outputs=outputs, warmup=0, repeats=1)
    by_name = {layer.name: layer for layer in result.layers}
    blocks = [by_name["1"], by_name["2"]]
    for layer in result.layers:
        names = [option.name for option in layer.recompute_options]
        assert names[:2] == [OPTION_NONE, OPTION_FULL]
        none, full, *selective = layer.recompute_options
        assert (none.kept_bytes, full.kept_bytes) == (layer.act_bytes, layer.input_bytes)
        assert all(option.kept_bytes < layer.act_bytes for option in selective)  # the others are left out
    assert [o.name for o in blocks[0].recompute_options] == [o.name for o in blocks[1].recompute_options]
    assert [o.name for o in blocks[0].recompute_options][2:] == CPU_BLOCK_OPTIONS
    assert [o.kept_bytes for o in blocks[0].recompute_options] == [o.kept_bytes for o in blocks[1].recompute_options]
    # save-matmuls keeps less than the final norm's activations; on the embedding and the head
    # it keeps their input, as none does, and is left out
    assert [o.name for o in by_name["3"].recompute_options] == [OPTION_NONE, OPTION_FULL, "save-matmuls"]
    assert [o.name for o in by_name["0"].recompute_options] == [OPTION_NONE, OPTION_FULL]


def test_an_option_the_layer_lacks_is_one_sentence(tmp_path, monkeypatch):
    def popen(*args, **kwargs):
        raise AssertionError("a rank process was started for a bad plan")

    monkeypatch.setattr(launcher.subprocess, "Popen", popen)
    plan = make_plan(LLAMA, [["0", "1"], ["2", "3", "4"]])
    plan.stages[0] = plan.stages[0].with_recompute({"0": "attn"})
    path = tmp_path / "plan.yaml"
    io.save_plan(plan, path)
    result = run("launch", path)
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "stage 0's layer 0 has no recompute option 'attn'; its options are none, full, save-matmuls, offload" in errors[0]


# A mixed plan: full on the embedding and attn on block 1 (stage 0); mlp-act on block 2 alone
# (stage 1: an option on the layer that opens a stage, whose input is the receive buffer);
# save-matmuls on the final norm, the head kept (stage 2).
MIXED_STAGES = [["0", "1"], ["2"], ["3", "4"]]
MIXED = [{"0": OPTION_FULL, "1": "attn"}, {"2": "mlp-act"}, {"3": "save-matmuls"}]


def _plan_with(profile, recompute, plan_path):
    plan = make_plan(LLAMA, MIXED_STAGES, microbatches=4, micro_batch_size=profile.micro_batch_size)
    stages = [stage.with_recompute(chosen) for stage, chosen in zip(plan.stages, recompute, strict=True)]
    cost = costmodel.evaluate(stages, profile, plan.setup)
    plan = plan.model_copy(update={"stages": costmodel.with_predictions(stages, cost)})
    io.save_plan(plan, plan_path)
    return plan


@pytest.mark.slow
def test_mixed_options_pipeline_peaks_are_the_prediction_and_losses_equal_one_process(tmp_path):
    """Profile the LLaMA-style model, run a 3-stage plan mixing full, attn, mlp-act,
    save-matmuls and none through `ckplan launch --reference`: every stage's measured peak
    within 2% of the cost model's prediction, and what the options change exact: the same
    plan without recompute (replayed in one process, which holds what a launch holds) peaks
    higher by exactly the bytes the cost model says. The losses equal one process's bit for bit."""
    profile_path = tmp_path / "profile.json"
    run_ok("profile", LLAMA, "--micro-batch-size", "4", "--threads", "1", "--repeats", "2", "--out", profile_path)
    profile = io.load_profile(profile_path)
    mixed = _plan_with(profile, MIXED, tmp_path / "mixed.yaml")
    kept = _plan_with(profile, [{}, {}, {}], tmp_path / "kept.yaml")
    report_path = tmp_path / "run.json"
    run_ok("launch", tmp_path / "mixed.yaml", "--steps", "1", "--warmup-steps", "1", "--reference",
           "--report", report_path)
    report = io.load_report(report_path)
    replayed = validate_plan(kept, plan_file=None)
    for stage, without in zip(report.stages, replayed, strict=True):
        measured, predicted = stage.measured.peak_bytes, stage.predicted.peak_bytes
        assert abs(measured - predicted) <= 0.02 * predicted, (stage.index, measured, predicted)
        saved_predicted = kept.stages[stage.index].predicted.peak_bytes - predicted
        assert without.peak_bytes - measured == saved_predicted > 0, stage.index
    # the replay holds what the pipeline holds, byte for byte, under options too
    assert [check.peak_bytes for check in validate_plan(mixed, plan_file=None)] == \
        [stage.measured.peak_bytes for stage in report.stages]
    reference = reference_losses(mixed, prepare(mixed, plan_file=None), num_steps=len(report.losses), seed=0)
    assert report.losses == reference


def test_a_mixture_of_experts_is_its_blocks_mlp():
    """A MoE block's mixture is found as its MLP (class name "MoE", Mixtral's SparseMoeBlock,
    attribute moe or block_sparse_moe), so `mlp` recomputes the whole mixture (Megatron-LM's
    moe); the bundled MoE model's block has it."""
    from planner.models.modelfile import load_model_file, pipeline_layers
    from planner.runtime.recompute import find_options, find_parts

    path = ROOT / "configs" / "models" / "moe.py"
    block = dict(pipeline_layers(load_model_file(path).build_model(), path))["blocks.0"]
    assert find_parts(block)["mlp"] == [block.moe]
    assert "mlp" in find_options(block)

    class SparseMoeBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(4, 2)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block_sparse_moe = nn.Linear(4, 4)
            self.other = SparseMoeBlock()

    assert len(find_parts(Layer())["mlp"]) == 2


def test_a_mixture_of_experts_familys_norms_and_attention_are_not_its_mlp():
    """Qwen2-MoE names every class after itself (Qwen2MoeRMSNorm, Qwen2MoeAttention): "moe" in a class name
    had made its norms and attention MLPs, so `mlp` checkpointed the whole block and the LM head (a norm and
    a linear) was offered mlp and mlp-act."""
    from planner.runtime.recompute import find_parts

    class Qwen2MoeRMSNorm(nn.Module):
        def forward(self, x):
            return x

    class Qwen2MoeAttention(nn.Linear):
        pass

    class Qwen2MoeSparseMoeBlock(nn.Linear):
        pass

    block = nn.Module()
    block.self_attn, block.mlp = Qwen2MoeAttention(4, 4), Qwen2MoeSparseMoeBlock(4, 4)
    block.input_layernorm, block.post_attention_layernorm = Qwen2MoeRMSNorm(), Qwen2MoeRMSNorm()
    parts = find_parts(block)
    assert parts["mlp"] == [block.mlp] and parts["attn"] == [block.self_attn]
    assert parts["norm"] == [block.input_layernorm, block.post_attention_layernorm]
    head = nn.Module()
    head.norm, head.lm_head = Qwen2MoeRMSNorm(), nn.Linear(4, 8)
    assert find_parts(head)["mlp"] == [] and "mlp" not in find_options(head)
    # the decoder layer wrapped whole, as the Hugging Face adapter's Decoder holds it (`.layer`): its class
    # (Qwen3MoeDecoderLayer) says "moe" but it holds the attention, so `mlp` is still its mixture, not itself
    Qwen3MoeDecoderLayer = type("Qwen3MoeDecoderLayer", (nn.Module,), {})
    layer = Qwen3MoeDecoderLayer()
    layer.self_attn, layer.mlp = Qwen2MoeAttention(4, 4), Qwen2MoeSparseMoeBlock(4, 4)
    wrapper = nn.Module()
    wrapper.layer = layer
    assert find_parts(wrapper)["mlp"] == [layer.mlp] and find_parts(wrapper)["attn"] == [layer.self_attn]
