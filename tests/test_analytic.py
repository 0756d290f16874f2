"""Analytic profiles of published architectures: the formulas by hand on small configs,
the published parameter counts, and the formulas against the measured profiler on the
same architectures built small in plain torch."""

import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.nn import functional as F

from planner import io
from planner.cli import cli
from planner.errors import UserError
from planner.models import archconfig, archs
from planner.models.modelfile import check_chain
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.profiler.saved import saved_bytes
from planner.profiler.storages import storage_nbytes
from planner.schema import FileRef

H100 = archs.gpu("h100")
SMALL_LLAMA = archs.Arch(name="small-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                         num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
SMALL_GPT = archs.Arch(name="small-gpt", hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                       num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32,
                       style="gpt")
REF = FileRef(file="arch:test", sha256="0" * 64)


def _kept(arch, shape):
    return sum(term.num_bytes for term in analytic.block_terms(arch, shape))


# ---------------------------------------------------------------- formulas by hand


def test_llama_block_bytes_by_hand():
    # s=32, b=2 (64 tokens), h=64, 4 heads of 16, 2 K/V heads (kv width 32), f=160, bf16
    shape = Shape(seq_len=32, micro_batch_size=2)
    norms = 2 * (64 * 64 * 2 + 64 * 4)  # two RMSNorms: input (bf16) + 1/rms per token (fp32)
    qkv_input = mlp_input = 64 * 64 * 2  # the two norm outputs
    q, k, v = 64 * 64 * 2, 64 * 32 * 2, 64 * 32 * 2
    lse, attn_out = 4 * 4 * 32 * 2, 64 * 64 * 2  # flash: logsumexp per head and token; output O
    swiglu = 4 * 64 * 160 * 2  # gate out, SiLU out, up out, product
    assert _kept(SMALL_LLAMA, shape) == norms + qkv_input + q + k + v + lse + attn_out + mlp_input + swiglu
    eager = Shape(seq_len=32, micro_batch_size=2, attention="eager")
    scores = 4 * 32 * 32 * 2 * 2  # softmax output: heads · s² · b, bf16; no dropout
    assert _kept(SMALL_LLAMA, eager) == _kept(SMALL_LLAMA, shape) - lse + scores


def test_llama_block_bytes_under_tp_and_sp_by_hand():
    tp = Shape(seq_len=32, micro_batch_size=2, tp=2)
    # replicated: norm inputs, statistics and outputs; split /2: Q (2 heads), K and V (1 head each),
    # logsumexp, O, the four f-wide tensors
    replicated = 2 * (64 * 64 * 2 + 64 * 4) + 2 * 64 * 64 * 2
    split = 64 * 32 * 2 + 2 * 64 * 16 * 2 + 4 * 2 * 32 * 2 + 64 * 32 * 2 + 4 * 64 * 80 * 2
    assert _kept(SMALL_LLAMA, tp) == replicated + split
    sp = Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True)
    assert _kept(SMALL_LLAMA, sp) == replicated // 2 + split
    # 4 devices for 2 K/V heads: each holds one whole K/V head (replicated), not half of one
    assert analytic.kv_width(SMALL_LLAMA, Shape(seq_len=32, micro_batch_size=2, tp=4)) == 16


@pytest.mark.parametrize("tp,sp", [(1, False), (4, False), (4, True), (8, True)])
def test_gpt_block_is_korthikanti_plus_norm_statistics(tp, sp):
    """Korthikanti et al.'s sbh(34 + 5as/h), sbh(10 + 24/t + 5as/(ht)), sbh(34/t + 5as/(ht)),
    exactly, plus LayerNorm's fp32 mean and 1/std per token (8sb per norm) they leave out."""
    arch = archs.Arch(name="g", hidden_size=512, intermediate_size=2048, num_layers=1, num_heads=8,
                      num_kv_heads=8, vocab_size=1000, tie_word_embeddings=True, style="gpt")
    shape = Shape(seq_len=256, micro_batch_size=2, tp=tp, sp=sp, attention="eager")
    norm_stats = 2 * 8 * 256 * 2 // (tp if sp else 1)
    assert _kept(arch, shape) == analytic.korthikanti_block_bytes(arch, shape) + norm_stats
    no_tp = Shape(seq_len=256, micro_batch_size=2, attention="eager")
    assert analytic.korthikanti_block_bytes(arch, no_tp) == 256 * 2 * 512 * (34 + 5 * 8 * 256 / 512)


def test_full_recompute_keeps_the_block_input():
    shape = Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True)
    assert analytic.boundary_bytes(SMALL_LLAMA, shape) == 2 * 32 * 2 * 64 // 2  # 2sbh/t, bf16


def test_flops_by_hand():
    # GPT: 24·b·s·h²·(1 + s/(6h)) (Narayanan et al. 2021) at t = 1
    gpt = Shape(seq_len=32, micro_batch_size=2)
    assert analytic.block_flops(SMALL_GPT, gpt) == 24 * 2 * 32 * 64**2 * (1 + 32 / (6 * 64))
    # LLaMA: Q and output projections 2·2bsh², K and V 2·2bsh·32, SwiGLU 3·2bsh·f, attention 4bs²h
    llama = 2 * 64 * 64 * (2 * 64 + 2 * 32 + 3 * 160) + 4 * 64 * 32 * 64
    assert analytic.block_flops(SMALL_LLAMA, gpt) == llama
    assert analytic.block_flops(SMALL_LLAMA, Shape(seq_len=32, micro_batch_size=2, tp=2)) == llama // 2
    assert analytic.head_flops(SMALL_LLAMA, gpt) == 2 * 64 * 64 * 128


def test_params_by_hand():
    one = Shape(seq_len=1, micro_batch_size=1)
    # LLaMA block: wq, wo 64², wk, wv 64·32, three SwiGLU matrices 64·160, two norms
    assert analytic.block_params(SMALL_LLAMA, one) == 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64
    # TP 2: matrices halved, norms replicated
    two = Shape(seq_len=1, micro_batch_size=1, tp=2)
    assert analytic.block_params(SMALL_LLAMA, two) == 64 * 64 + 64 * 32 + 3 * 64 * 80 + 2 * 64
    # GPT block: 12h² + 13h
    assert analytic.block_params(SMALL_GPT, one) == 12 * 64 * 64 + 13 * 64


@pytest.mark.parametrize("name,published", [
    ("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320), ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496), ("llama3.1-405b", 405_853_388_800),
    ("mistral-7b", 7_241_732_096), ("qwen2.5-7b", 7_615_616_512), ("qwen2.5-72b", 72_706_203_648),
])
def test_builtin_archs_have_their_published_parameter_counts(name, published):
    """The parameter counts in each model's safetensors index: the dimensions are right."""
    assert analytic.total_params(archs.ARCHS[name]) == published


def test_gpt3_is_175b():
    assert round(analytic.total_params(archs.ARCHS["gpt3-175b"]) / 1e9) == 175


def test_profile_times_losses_and_assumptions():
    shape = Shape(seq_len=32, micro_batch_size=2, tp=2, sp=True)
    profile = analytic.analytic_profile(SMALL_LLAMA, shape, gpu=H100, mfu=0.5, model=REF)
    assert [layer.name for layer in profile.layers] == ["tok_embeddings", "layers.0", "layers.1", "output"]
    block = profile.layers[1]
    assert block.fwd_ms == pytest.approx(analytic.block_flops(SMALL_LLAMA, shape) / (989.4e12 * 0.5) * 1e3)
    assert block.bwd_ms == 2 * block.fwd_ms
    # torch's non-reentrant checkpoint stops before the down projection (2 x tokens x f/t x h FLOPs)
    down = 2 * shape.tokens * (SMALL_LLAMA.intermediate_size // 2) * SMALL_LLAMA.hidden_size
    assert block.recompute_ms == pytest.approx((analytic.block_flops(SMALL_LLAMA, shape) - down) / (989.4e12 * 0.5) * 1e3)
    assert block.step_ms["adam"] == pytest.approx(block.param_count * 28 / 3.35e12 * 1e3)
    head = profile.layers[-1]
    assert head.output_bytes == 64 * 64 * 2  # logits: s·b·V/t in bf16
    assert profile.loss_transient_bytes == 64 * 64 * 4 and profile.loss_bytes == 64 * 64 * 4 + 4
    assert profile.source == "analytic"
    facts = profile.assumptions
    assert (facts["seq_len"], facts["tp"], facts["sp"], facts["mfu"], facts["gpu"]) == (32, 2, True, 0.5, "h100-sxm")
    assert facts["gpu_memory_bytes"] == 80 * 10**9 and "Korthikanti" in facts["activations"]


def test_tp_that_does_not_divide_is_refused():
    with pytest.raises(UserError, match="--tp 3"):
        analytic.analytic_profile(SMALL_LLAMA, Shape(seq_len=32, micro_batch_size=1, tp=3), gpu=H100, model=REF)
    with pytest.raises(UserError, match="--sp"):
        analytic.analytic_profile(SMALL_LLAMA, Shape(seq_len=32, micro_batch_size=1, sp=True), gpu=H100, model=REF)


# ---------------------------------------------------------------- against measurement
# The same architectures built small in plain torch, the way production code runs them:
# a fused RMSNorm that keeps its input and 1/rms (as Apex's and Transformer Engine's do),
# rotary tables as buffers, native grouped-query flash attention in (b, s, heads, d)
# layout, the fused dropout op GPUs use (one bool mask).


class FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        normed = x * rstd
        grad_normed = grad * weight
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x, (grad * normed).sum(dim=tuple(range(grad.dim() - 1)))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return FusedRMSNorm.apply(x, self.weight)


class LlamaBlock(nn.Module):
    def __init__(self, arch):
        super().__init__()
        h, hd, self.heads, self.kv = arch.hidden_size, arch.head_size, arch.num_heads, arch.num_kv_heads
        self.attn_norm, self.mlp_norm = RMSNorm(h), RMSNorm(h)
        self.wq = nn.Linear(h, self.heads * hd, bias=False)
        self.wk = nn.Linear(h, self.kv * hd, bias=False)
        self.wv = nn.Linear(h, self.kv * hd, bias=False)
        self.wo = nn.Linear(self.heads * hd, h, bias=False)
        self.w1 = nn.Linear(h, arch.intermediate_size, bias=False)
        self.w3 = nn.Linear(h, arch.intermediate_size, bias=False)
        self.w2 = nn.Linear(arch.intermediate_size, h, bias=False)
        freqs = torch.outer(torch.arange(arch.max_position_embeddings).float(),
                            1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)).repeat(1, 2)[:, None, :]
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def rotary(self, x):  # x: (b, s, heads, hd)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * self.cos[: x.shape[1]] + rotated * self.sin[: x.shape[1]]

    def forward(self, x):
        b, s, _ = x.shape
        normed = self.attn_norm(x)
        q = self.rotary(self.wq(normed).view(b, s, self.heads, -1)).transpose(1, 2)
        k = self.rotary(self.wk(normed).view(b, s, self.kv, -1)).transpose(1, 2)
        v = self.wv(normed).view(b, s, self.kv, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, -1))
        normed = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(normed)) * self.w3(normed))


class GPTEmbedding(nn.Module):
    def __init__(self, arch):
        super().__init__()
        self.tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.positions = nn.Embedding(arch.max_position_embeddings, arch.hidden_size)
        self.register_buffer("ids", torch.arange(arch.max_position_embeddings), persistent=False)

    def forward(self, tokens):
        x = self.tokens(tokens) + self.positions(self.ids[: tokens.shape[1]])
        return torch.native_dropout(x, 0.1, True)[0]


class GPTBlock(nn.Module):
    """Korthikanti et al.'s block: LayerNorm, eager attention with dropout, GELU MLP, dropout."""

    def __init__(self, arch):
        super().__init__()
        h, self.heads = arch.hidden_size, arch.num_heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, arch.intermediate_size), nn.Linear(arch.intermediate_size, h)
        s = arch.max_position_embeddings
        self.register_buffer("future", torch.ones(s, s, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(h, dim=-1))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (h // self.heads) ** -0.5
        probs = torch.softmax(scores.masked_fill(self.future[:s, :s], float("-inf")), dim=-1)
        context = torch.matmul(torch.native_dropout(probs, 0.1, True)[0], v)
        x = x + torch.native_dropout(self.proj(context.transpose(1, 2).reshape(b, s, h)), 0.1, True)[0]
        return x + torch.native_dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1, True)[0]


def _small_model(arch):
    if arch.style == "gpt":
        embedding, blocks, norm = GPTEmbedding(arch), [GPTBlock(arch) for _ in range(arch.num_layers)], \
            nn.LayerNorm(arch.hidden_size)
    else:
        embedding = nn.Embedding(arch.vocab_size, arch.hidden_size)
        blocks, norm = [LlamaBlock(arch) for _ in range(arch.num_layers)], RMSNorm(arch.hidden_size)
    head = nn.Sequential(norm, nn.Linear(arch.hidden_size, arch.vocab_size, bias=False))
    return [("tok_embeddings", embedding), *((f"layers.{i}", b) for i, b in enumerate(blocks)), ("output", head)]


@pytest.mark.parametrize("arch,attention", [(SMALL_LLAMA, "flash"), (SMALL_GPT, "eager")],
                         ids=["llama-style", "gpt-style"])
def test_analytic_matches_the_measured_profile(arch, attention):
    """Per layer: kept bytes within 10% of what the profiler measures (its saved-tensor
    pass, the one `ckplan profile` takes act_bytes from; its timing passes are left out,
    they would only make this test slow and sensitive to a busy machine), parameters,
    input and output bytes exact, at the same shapes (fp32 on this CPU)."""
    torch.manual_seed(0)
    layers = _small_model(arch)
    tokens = torch.randint(0, arch.vocab_size, (2, 33))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    outputs = check_chain(layers, inputs)
    saved = saved_bytes(layers, inputs, targets, lambda out, tgt: F.cross_entropy(out.flatten(0, 1), tgt.flatten()))
    shape = Shape(seq_len=32, micro_batch_size=2, attention=attention, dtype="float32")
    predicted = analytic.analytic_profile(arch, shape, gpu=H100, model=REF)
    layer_inputs = [inputs, *outputs[:-1]]
    for index, ((name, layer), want) in enumerate(zip(layers, predicted.layers, strict=True)):
        assert name == want.name
        assert sum(p.numel() for p in layer.parameters()) == want.param_count, name
        assert storage_nbytes(layer_inputs[index]) == want.input_bytes, name
        assert storage_nbytes(outputs[index]) == want.output_bytes, name
        assert saved.input_in_act_bytes[index] == want.input_in_act_bytes, name
        # the tolerance; on torch 2.13 the two agree to the byte
        assert want.act_bytes == pytest.approx(saved.act_bytes[index], rel=0.10), name


# ---------------------------------------------------------------- the command line

QWEN_LIKE = {  # a config.json the built-ins do not cover (Qwen2.5-0.5B's published dimensions)
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 32768, "hidden_act": "silu", "rope_theta": 1000000.0,
}


def _run(*args):
    result = CliRunner().invoke(cli, list(args))
    return result, result.output


def test_arch_profile_solves_with_the_gpu_memory_and_cannot_be_launched(tmp_path):
    from planner.runtime.checks import prepare

    profile_path, plan_path = tmp_path / "p.json", tmp_path / "plan.yaml"
    result, out = _run("profile", "--arch", "llama3-8b", "--seq-len", "4096", "--micro-batch-size", "1",
                       "--tp", "2", "--gpu", "a100-80g", "--out", str(profile_path))
    assert result.exit_code == 0, out
    profile = io.load_profile(profile_path)
    assert profile.source == "analytic" and len(profile.layers) == 34 and profile.dtype == "bfloat16"
    assert profile.model.file == "arch:llama3-8b" and profile.assumptions["gpu"] == "a100-80g"
    result, out = _run("solve", "--profile", str(profile_path), "--stages", "2", "--microbatches", "4",
                       "--precision", "bf16-mixed", "--out", str(plan_path))
    assert result.exit_code == 0, out
    # what a process can allocate on an A100 80GB: CUDA's 85,100,068,864 bytes less a 400 MiB context
    assert "--mem not given: 78.9 GiB per device, what a process can allocate" in out
    assert "85100068864" in out and "400 MB" in out  # the sources, said
    plan = io.load_plan(plan_path)
    assert plan.setup.pipeline.mem_caps_bytes == [85_100_068_864 - 400 * 2**20] * 2
    assert plan.profile_source == "analytic"
    with pytest.raises(UserError, match="ckplan export"):
        prepare(plan, plan_file=plan_path)


def test_arch_config_reads_a_hugging_face_config(tmp_path):
    config = tmp_path / "qwen2.5-0.5b" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(QWEN_LIKE))
    out_path = tmp_path / "p.json"
    result, out = _run("profile", "--arch-config", str(config), "--seq-len", "2048", "--micro-batch-size", "2",
                       "--dtype", "bf16", "--out", str(out_path))
    assert result.exit_code == 0, out
    profile = io.load_profile(out_path)
    assert profile.name.startswith("qwen2.5-0.5b") and profile.model.sha256 == io.sha256_file(config)
    # 494,032,768 published parameters, the tied embedding counted once (the head's copy is extra)
    params = sum(layer.param_count for layer in profile.layers)
    assert params - 151936 * 896 == 494_032_768


def test_a_tied_embedding_is_counted_once_on_one_stage_and_twice_split():
    # Qwen2.5-0.5B: 494,032,768 parameters with the 151936 x 896 embedding tied to the head.
    # bf16-mixed Adam holds 16 B per parameter: one stage holds 16 x 494,032,768 bytes; split,
    # the last stage holds the head's copy too. The profile's sum is the local add the measuring
    # profiler times, autograd's InputBuffer add of the two uses' bf16 gradients on one stage
    # (read 2, write 1): 3 x 2 B a parameter at the eager elementwise rate.
    from planner.cost import costmodel
    from planner.profiler import membound
    from planner.schema import StagePlan, TrainSetup

    arch = archconfig.from_hf_config(QWEN_LIKE, where="config.json", name="qwen2.5-0.5b")
    gpu = archs.gpu("h100")
    profile = analytic.analytic_profile(arch, Shape(seq_len=2048, micro_batch_size=1), gpu=gpu, model=REF)
    shared = 151936 * 896
    assert [(t.layers, t.param_count) for t in profile.tied] == [(["tok_embeddings", "output"], shared)]
    assert profile.tied[0].sum_ms == pytest.approx(3 * 2 * shared / (membound.achieved_tbps(gpu, "eager", "elementwise")
                                                                     * 1e12) * 1e3)
    names = [layer.name for layer in profile.layers]
    one = costmodel.evaluate([StagePlan(index=0, layers=names, checkpointed=[])], profile,
                             TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[10**12],
                                        precision="bf16-mixed"))
    assert one.stages[0].static_bytes == 16 * 494_032_768
    two = costmodel.evaluate([StagePlan(index=0, layers=names[:13], checkpointed=[]),
                              StagePlan(index=1, layers=names[13:], checkpointed=[])], profile,
                             TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[10**12] * 2,
                                        precision="bf16-mixed"))
    assert sum(stage.static_bytes for stage in two.stages) == 16 * (494_032_768 + shared)


def test_measured_profile_needs_mem(tmp_path):
    from planner.schema import DeviceInfo, LayerProfile, Profile

    layer = LayerProfile(name="0", kind="x", fwd_ms=1, bwd_ms=1, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=1,
                         bwd_ms_max=1, act_bytes=1, input_bytes=1, output_bytes=1, param_count=1, param_bytes=4,
                         transient_bytes=0)
    profile = Profile(name="m", created_at="now", torch_version="x", device=DeviceInfo(type="cpu", name="cpu"),
                      dtype="float32", micro_batch_size=1, model=REF, layers=[layer])
    io.save_profile(profile, tmp_path / "m.json")
    result, out = _run("solve", "--profile", str(tmp_path / "m.json"), "--stages", "1", "--out",
                       str(tmp_path / "plan.yaml"))
    assert result.exit_code == 1 and "give --mem" in out and "Traceback" not in out


@pytest.mark.parametrize("change,message", [
    ({"hidden_size": None}, "has no hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"intermediate_size": 48.5}, "intermediate_size must be a positive integer"),
    ({"vocab_size": "big"}, "vocab_size must be a positive integer"),
    ({"num_attention_heads": 15}, "hidden_size 896 is not a multiple of num_attention_heads 15"),
    ({"num_key_value_heads": 3}, "num_attention_heads 14 is not a multiple of num_key_value_heads 3"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' with model_type 'qwen2' is not read"),
    ({"model_type": "qwen3_next"}, "model_type 'qwen3_next' is not read"),
    # a family --arch-config does not read but --hf-config builds: the refusal says the way that works
    ({"model_type": "phi3"}, "model_type 'phi3' is not read; --arch-config reads"),
    ({"model_type": "granite"}, "`ckplan profile --hf-config CONFIG --fake` runs transformers' own granite code"),
    ({"model_type": "phimoe", "num_local_experts": 16}, "model_type 'phimoe' is not read; --arch-config reads llama, "
                                                        "mistral"),
    ({"model_type": "phimoe", "num_local_experts": 16}, "`ckplan profile --hf-config CONFIG --fake` runs transformers' "
                                                        "own phimoe"),
    ({"attention_dropout": 0.1}, "attention_dropout = 0.1; dropout is not modelled"),
    ({"mlp_bias": True}, "mlp_bias is true"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
])
def test_arch_config_refuses_bad_fields_in_one_sentence(tmp_path, change, message):
    config = {**QWEN_LIKE, **change}
    config = {key: value for key, value in config.items() if value is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result, out = _run("profile", "--arch-config", str(path), "--seq-len", "128", "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and message in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()
    assert ("--hf-config CONFIG --fake" in out) == (config.get("model_type") in ("phi3", "granite", "phimoe"))


@pytest.mark.parametrize("args,message", [
    (["--arch", "llama5", "--seq-len", "8"], "unknown --arch 'llama5'"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--gpu", "tpu"], "unknown --gpu 'tpu'"),
    (["--arch", "llama3-8b"], "needs --seq-len"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--tp", "3"], "--tp 3 does not divide"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--sp"], "needs --tp 2 or more"),
    (["--arch", "llama3-8b", "--seq-len", "9", "--tp", "2", "--sp"], "--seq-len divisible by 2"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--repeats", "3"], "--repeats applies to measuring MODEL.py"),
    (["--arch", "llama3-8b", "--arch-config", "c.json", "--seq-len", "8"], "not both"),
    (["--arch-config", "missing.json", "--seq-len", "8"], "does not exist"),
    (["--arch", "llama3-8b", "--seq-len", "8", "--dtype", "fp32"], "16-bit tensor-core peaks only"),
    (["model.py", "--arch", "llama3-8b", "--seq-len", "8"], "not both"),
    (["model.py", "--tp", "2"], "--tp applies to --arch/--arch-config profiles only"),
    ([], "give MODEL.py to measure, --hf-config config.json to measure a Hugging Face model, or --arch"),
])
def test_profile_arch_bad_input_is_one_sentence(tmp_path, args, message):
    result, out = _run("profile", *args, "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 1 and message in out, out
    assert "Traceback" not in out and not (tmp_path / "p.json").exists()


def test_seq_len_past_the_context_window_is_warned_about(tmp_path):
    result, out = _run("profile", "--arch", "llama2-7b", "--seq-len", "8192", "--micro-batch-size", "1",
                       "--out", str(tmp_path / "p.json"))
    assert result.exit_code == 0 and "exceeds llama2-7b's max_position_embeddings 4096" in out, out


LLAMA_LIKE = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 32000}


@pytest.mark.parametrize("extra, sentence", [
    # Mixtral-8x7B's expert fields under a model_type that is not read with them
    ({"model_type": "llama", "num_local_experts": 8, "num_experts_per_tok": 2},
     "num_local_experts = 8 is a mixture-of-experts or latent-attention setting that is not read for model_type "
     "'llama'"),
    # DeepSeek-V2-Lite's (deepseek-ai/DeepSeek-V2-Lite) experts and latent attention, its own fields missing
    ({"model_type": "deepseek_v2", "n_routed_experts": 64, "kv_lora_rank": 512, "q_lora_rank": None},
     "has no qk_rope_head_dim"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64}, "kv_lora_rank = 512 is a mixture-of-experts or latent-attention"),
    # Gemma 2's (google/gemma-2-9b) soft-capping, under a family that is read
    ({"model_type": "gemma", "head_dim": 128, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
     "logit soft-capping is not modelled"),
    # a family not read is said so first, not refused for a field another family reads: Gemma 2 itself, and
    # Llama 4 Scout's text model (meta-llama/Llama-4-Scout-17B-16E text_config), whose num_local_experts was
    # "read for model_type mixtral, qwen3_moe, gpt_oss", as though renaming its family would plan it
    ({"model_type": "gemma2", "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
     "model_type 'gemma2' is not read; --arch-config reads"),
    ({"model_type": "llama4_text", "num_local_experts": 16, "num_experts_per_tok": 1, "intermediate_size_mlp": 16384},
     "model_type 'llama4_text' is not read; --arch-config reads"),
])
def test_configs_with_unmodelled_memory_are_refused_not_read_as_dense(tmp_path, extra, sentence):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_LIKE, **extra}))
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profile", "--arch-config", str(config), "--seq-len", "8", "--out", str(out)])
    assert result.exit_code == 1 and sentence in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_a_dense_config_with_zero_or_null_expert_fields_is_still_read(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA_LIKE, "num_experts": 0, "q_lora_rank": None,
                                  "final_logit_softcapping": None}))
    result = CliRunner().invoke(cli, ["profile", "--arch-config", str(config), "--seq-len", "8",
                                      "--out", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output


# Published configs, as their config.json gives them (the fields that set the shapes), with the
# parameter count the model card states or the built model has
PUBLISHED_CONFIGS = [
    ("llama", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 128256}, 8_030_261_248),  # meta-llama/Meta-Llama-3-8B
    ("mistral", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                 "sliding_window": 4096}, 7_241_732_096),  # mistralai/Mistral-7B-v0.1
    ("qwen2", {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
               "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}, 494_032_768),
    ("gemma", {"hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8,
               "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
               "hidden_activation": "gelu_pytorch_tanh"}, 2_506_172_416),  # google/gemma-2b
    ("gpt2", {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}, 124_439_808),
    ("opt", {"hidden_size": 768, "ffn_dim": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "vocab_size": 50272, "max_position_embeddings": 2048}, 125_239_296),  # facebook/opt-125m
]


@pytest.mark.parametrize("model_type, fields, published", PUBLISHED_CONFIGS, ids=[c[0] for c in PUBLISHED_CONFIGS])
def test_arch_config_counts_the_parameters_transformers_builds(model_type, fields, published):
    # the whole config transformers writes (its defaults included: Qwen2's unused sliding
    # window, LLaMA's mlp_bias false, dropouts 0), read by --arch-config; the model itself
    # built on the meta device, no weights
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    arch = archconfig.from_hf_config(json.loads(config.to_json_string()), where="config.json", name=model_type)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    assert built == published
    assert analytic.total_params(arch) == published
    assert arch.style == ("gpt" if model_type in ("gpt2", "opt") else "llama")
    assert arch.sliding_window == (4096 if model_type == "mistral" else None)


def test_opt_relu_keeps_one_mlp_tensor_where_gelu_keeps_two():
    gpt2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
    # GELU as one kernel (Megatron-LM's fused bias-GELU keeps the same): its input and its output
    gpt = archconfig.from_hf_config({**gpt2, "activation_function": "gelu_pytorch_tanh"}, where="c", name="gpt2")
    opt = archconfig.from_hf_config({"model_type": "opt", "hidden_size": 768, "ffn_dim": 3072, "num_hidden_layers": 12,
                                "num_attention_heads": 12, "vocab_size": 50272, "max_position_embeddings": 2048},
                               where="c", name="opt")
    shape = Shape(seq_len=512, micro_batch_size=2)
    gelu = sum(t.num_bytes for t in analytic.block_terms(gpt, shape))
    relu = sum(t.num_bytes for t in analytic.block_terms(opt, shape))
    assert gelu - relu == 512 * 2 * 3072 * 2  # one s·b·f tensor of 2 bytes
    # GPT-2's own gelu_new, written out as eager ops, keeps three more: tanh's output, 0.5·x, 1 + tanh
    eager_gelu = archconfig.from_hf_config(gpt2, where="c", name="gpt2")
    assert sum(t.num_bytes for t in analytic.block_terms(eager_gelu, shape)) - gelu == 3 * 512 * 2 * 3072 * 2
    eager = Shape(seq_len=512, micro_batch_size=2, attention="eager")  # the paper's own setting
    assert sum(t.num_bytes for t in analytic.block_terms(gpt, eager)) == \
        analytic.korthikanti_block_bytes(gpt, eager) + 2 * 2 * 4 * 512 * 2  # + LayerNorm statistics


def test_a_sliding_window_shortens_attention_flops_past_it():
    mistral = archs.arch("mistral-7b")
    full = archs.Arch(**{**mistral.__dict__, "sliding_window": None})
    short, long = Shape(seq_len=4096, micro_batch_size=1), Shape(seq_len=16384, micro_batch_size=1)
    assert analytic.block_flops(mistral, short) == analytic.block_flops(full, short)
    assert analytic.block_flops(full, long) - analytic.block_flops(mistral, long) == 4 * 16384 * (16384 - 4096) * 4096


def test_megatrons_cross_entropy_writes_the_logits_gradient_into_its_saved_softmax():
    # LLaMA 3 8B's logits at 2048 tokens: 2048 x 128256. The formula's loss scratch is their
    # fp32 gradient (1,050,673,152 B); Megatron-LM's vocab-parallel cross-entropy computes it
    # in place in the fp32 softmax it keeps, so only the bf16 cast back is new: half of it.
    from planner.cost import costmodel
    from planner.schema import TrainSetup

    profile = analytic.analytic_profile(archs.arch("llama3-8b"), Shape(seq_len=2048, micro_batch_size=1),
                                        gpu=archs.gpu("h100"), model=REF)
    assert profile.loss_transient_bytes == 2048 * 128256 * 4
    setup = {runtime: TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[10**12] * 2,
                                 runtime=runtime) for runtime in ("ckplan", "megatron")}
    assert costmodel.stage_constant_transient_bytes(profile, 1, setup["ckplan"]) == 2048 * 128256 * 4
    assert costmodel.stage_constant_transient_bytes(profile, 1, setup["megatron"]) == 2048 * 128256 * 2
    assert costmodel.stage_constant_transient_bytes(profile, 0, setup["megatron"]) == 0
