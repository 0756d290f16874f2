"""`profile --fake`: the model's own code run under FakeTensorMode, no memory, no hardware.
On the CPU at small shapes it must give the measured profile's bytes exactly; at full size
its parameters and FLOPs are those of the architecture's formulas, and where its kept
bytes differ from them the difference is a named piece of the model's code."""

import json

import pytest
from fixtures.cli import run, run_ok

from planner import io
from planner.models import archs
from planner.profiler import analytic

BYTE_FIELDS = ("act_bytes", "input_bytes", "output_bytes", "input_in_act_bytes", "param_count", "param_bytes",
               "largest_param_count", "trained_param_numels", "lookup_param_count", "transient_bytes")
PROFILE_BYTES = ("batch_input_bytes", "batch_target_bytes", "loss_bytes", "loss_transient_bytes")

CHAIN = '''
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32))


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size, 64), torch.randn(micro_batch_size, 32)
'''


def _same_bytes(fake, measured):
    assert [layer.name for layer in fake.layers] == [layer.name for layer in measured.layers]
    for mine, theirs in zip(fake.layers, measured.layers):
        assert {key: getattr(mine, key) for key in BYTE_FIELDS} == {key: getattr(theirs, key) for key in BYTE_FIELDS}, \
            mine.name
    assert {key: getattr(fake, key) for key in PROFILE_BYTES} == {key: getattr(measured, key) for key in PROFILE_BYTES}
    assert [(t.layers, t.param_count, t.param_bytes) for t in fake.tied] == \
        [(t.layers, t.param_count, t.param_bytes) for t in measured.tied]
    # the allocations and frees the allocator replay runs from, storage by storage
    assert [layer.alloc_records for layer in fake.layers] == [layer.alloc_records for layer in measured.layers]
    assert fake.loss_alloc == measured.loss_alloc and fake.loss_alloc is not None


@pytest.mark.xdist_group("llama_style_profiles")  # one worker: the shared profiles once (conftest.py)
def test_a_fake_profile_of_a_model_file_equals_the_measured_one_byte_for_byte(llama_style_profiles):
    # tests/fixtures/llama_style.py: RMSNorm, rotary, GQA, SwiGLU, in one nn.Sequential
    measured_path, fake_path, output = llama_style_profiles
    measured, fake = io.load_profile(measured_path), io.load_profile(fake_path)
    _same_bytes(fake, measured)
    assert fake.source == "fake" and fake.device.type == "cpu" and fake.dtype == "float32"
    assert "times are rooflines" in output and "per-kernel ceiling, not end to end" in output


def _gpt2_config(folder, attn_pdrop: float):
    """A 1-layer GPT-2 config (tied embedding) at toy widths; its folder for --hf-config. One block:
    a fake profile's time grows with the blocks (about 5 CPU-s at one, 12-15 at two), and a block fed
    by a block is held to its measured bytes by llama_style.py's two (the first test here)."""
    config = folder / f"gpt2-{attn_pdrop}" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4, "vocab_size": 256,
                                  "n_positions": 64, "attn_pdrop": attn_pdrop, "resid_pdrop": 0.0, "embd_pdrop": 0.0}))
    return config.parent


GPT2_ARGS = ("--seq-len", "32", "--micro-batch-size", "2")


def _fake_gpt2(folder, attn_pdrop: float, device: str):
    out = folder / f"{attn_pdrop}-{device}.json"
    run_ok("profile", "--hf-config", folder / f"gpt2-{attn_pdrop}", *GPT2_ARGS, "--fake", "--device", device,
           "--dtype", "float32", "--out", out)
    return io.load_profile(out)


@pytest.fixture(scope="module")
def gpt2_fake_cpu(tmp_path_factory):
    """The fake CPU profile of the GPT-2 config without dropout: the measured profile is held to it
    and the dropout test compares against it (one fake run of the model's code, not one per test)."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2")
    _gpt2_config(folder, 0.0)
    return folder, _fake_gpt2(folder, 0.0, "cpu")


@pytest.mark.xdist_group("gpt2_fake_cpu")  # one worker: the fixture's fake profile once
def test_a_fake_hugging_face_profile_equals_the_measured_one_with_its_tied_embedding(tmp_path, gpt2_fake_cpu):
    folder, fake = gpt2_fake_cpu
    run_ok("profile", "--hf-config", folder / "gpt2-0.0", *GPT2_ARGS, "--threads", "1", "--repeats", "1", "--warmup",
           "0", "--out", tmp_path / "m.json")
    measured = io.load_profile(tmp_path / "m.json")
    _same_bytes(fake, measured)
    assert [t.layers for t in fake.tied] == [["embed", "head"]]
    assert fake.assumptions["model"]["style"] == "gpt" and fake.assumptions["model"]["tie_word_embeddings"]


def test_fake_flops_and_rooflines_of_a_linear_chain(tmp_path):
    # b = 4: Linear 64->128 forward 2*4*64*128 = 65,536 FLOPs; its backward has no input
    # gradient (the batch needs none), only the weight gradient: 65,536. GELU: no matmul.
    # Linear 128->32: 32,768 forward, 65,536 backward (input and weight gradients).
    model = tmp_path / "chain.py"
    model.write_text(CHAIN)
    run_ok("profile", model, "--fake", "--device", "cpu", "--micro-batch-size", "4", "--gpu", "a100-80g",
           "--out", tmp_path / "f.json")
    profile = io.load_profile(tmp_path / "f.json")
    flops = profile.assumptions["flops"]
    assert [(flops[name]["forward"], flops[name]["backward"]) for name in ("0", "1", "2")] == \
        [(65_536, 65_536), (0, 0), (32_768, 65_536)]
    gpu = archs.gpu("a100-80g")
    # the GELU moves its input and output forward (2 x 4 x 128 floats), nothing multiplies: at the rate
    # eager kernels of its class reach (planner/profiler/membound.py: activation, which the A100 has no
    # sweep of, so its eager mean)
    assert "activation" not in dict(gpu.membound_class_efficiency)
    assert profile.layers[1].fwd_ms == pytest.approx(
        2 * 4 * 128 * 4 / (gpu.hbm_tbps * gpu.membound_eager_efficiency * 1e12) * 1e3)
    assert profile.assumptions["matmul_efficiency"] == gpu.matmul_efficiency == 256.5 / 312  # soaked (§190)
    assert profile.layers[0].step_ms == analytic.step_ms(64 * 128 + 128, gpu)


@pytest.mark.xdist_group("llama3_8b_layer_fake")  # one worker: the shared profile once (conftest.py)
def test_a_full_width_llama_3_8b_layer_against_the_analytic_formulas(llama3_8b_layer_fake):
    """One of LLaMA 3 8B's decoder layers at full width and 4096 tokens, built on meta (one: a fake
    profile's time grows with its layers, and a second is the first's kind): the parameters and FLOPs
    equal the formulas; the kept bytes exceed them by what Hugging
    Face's code keeps and a fused kernel does not. The profile is test_roofline's too (conftest.py)."""
    pytest.importorskip("transformers")
    fake = io.load_profile(llama3_8b_layer_fake[1])
    assert fake.device.type == "cuda" and fake.dtype == "bfloat16" and fake.device.name == "h100-sxm (fake)"
    arch = archs.Arch(**{**archs.arch("llama3-8b").__dict__, "num_layers": 1})
    shape = analytic.Shape(seq_len=4096, micro_batch_size=1)
    assert [layer.name for layer in fake.layers][1:-1] == ["layers.0"]
    block = fake.layers[1]
    assert block.param_count == analytic.block_params(arch, shape) == 218_112_000
    assert fake.layers[0].param_count + fake.layers[-1].param_count == \
        analytic.embedding_params(arch, shape) + analytic.head_params(arch, shape)
    assert fake.assumptions["flops"]["layers.0"]["forward"] == analytic.block_flops(arch, shape)
    # HF's RMSNorm upcasts: it keeps its input in fp32 (4sbh where a fused kernel keeps the
    # bf16 input, 2sbh) and the bf16 normalised tensor before the weight (2sbh): +4sbh per
    # norm, two norms. Rotary keeps its cos and sin, s x head_dim in bf16 each.
    s, h, head = 4096, 4096, 128
    explained = 2 * 4 * s * h + 2 * 2 * s * head
    assert block.act_bytes == sum(t.num_bytes for t in analytic.block_terms(arch, shape)) + explained


@pytest.mark.parametrize("args, sentence", [
    (["--arch", "llama3-8b", "--seq-len", "8", "--fake"], "--fake runs a model's own code"),
    (["tests/fixtures/llama_style.py", "--fake", "--repeats", "3"], "a --fake profile times nothing"),
    (["tests/fixtures/llama_style.py", "--fake", "--tp", "2"], "--tp applies to --arch/--arch-config profiles only"),
])
def test_fake_refuses_what_it_cannot_do_in_one_sentence(tmp_path, args, sentence):
    result = run("profile", *args, "--out", tmp_path / "p.json")
    assert result.exit_code == 1 and sentence in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "p.json").exists()


def test_a_plan_of_a_fake_profile_is_exported_not_launched(tmp_path):
    model = tmp_path / "chain.py"  # any model: a fake profile of llama_style.py took 20 CPU seconds
    model.write_text(CHAIN)
    run_ok("profile", model, "--fake", "--out", tmp_path / "f.json")
    run_ok("solve", "--profile", tmp_path / "f.json", "--stages", "2", "--microbatches", "2", "--out",
           tmp_path / "plan.yaml")
    for command in ("launch", "calibrate"):
        result = run(command, tmp_path / "plan.yaml")
        assert result.exit_code == 1 and "--fake profile" in result.output and "Traceback" not in result.output


@pytest.mark.xdist_group("gpt2_fake_cpu")
def test_attention_dropout_runs_in_the_gpus_fused_kernel(tmp_path, gpt2_fake_cpu):
    """With attention dropout, torch's CPU flash kernel refuses and the math path keeps the s x s
    probabilities and mask; a GPU's fused kernel takes dropout and keeps what it keeps without.
    A GPU's fake profile keeps the GPU's bytes and FLOPs and says so; a CPU's keeps the CPU's."""
    folder, plain_cpu = gpt2_fake_cpu
    _gpt2_config(tmp_path, 0.1)
    profiles = {(0.0, "cuda"): _fake_gpt2(folder, 0.0, "cuda"), (0.0, "cpu"): plain_cpu,
                (0.1, "cuda"): _fake_gpt2(tmp_path, 0.1, "cuda"), (0.1, "cpu"): _fake_gpt2(tmp_path, 0.1, "cpu")}
    plain, dropped = profiles[0.0, "cuda"], profiles[0.1, "cuda"]
    assert [layer.act_bytes for layer in dropped.layers] == [layer.act_bytes for layer in plain.layers]
    assert dropped.assumptions["flops"] == plain.assumptions["flops"]
    assert "dropout 0.1 in the fused kernel" in dropped.assumptions["attention_dropout"]
    assert "attention_dropout" not in plain.assumptions
    # on the CPU the math path: the block keeps at least the 2 x 4 x 32 x 32 fp32 probabilities more
    cpu_plain, cpu_dropped = profiles[0.0, "cpu"], profiles[0.1, "cpu"]
    assert cpu_dropped.layers[1].act_bytes >= cpu_plain.layers[1].act_bytes + 2 * 4 * 32 * 32 * 4
    assert "attention_dropout" not in cpu_dropped.assumptions
