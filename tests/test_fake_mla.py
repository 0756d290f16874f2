"""A fake profile's attention as the GPU runs it (planner/profiler/cuda_sdpa.py, device_attention.py): torch's
CUDA dispatcher's pick at a call's shapes, the picked kernel's saved tensors where the CPU would take its math
path (a latent attention's V narrower than Q and K), and what transformers' eager blocks keep beyond the
analytic count (planner/profiler/hf_kept.py), by hand at toy widths."""

from __future__ import annotations

import pytest
import torch
from fixtures.scripts import load_script

from planner.models import archconfig, archs
from planner.profiler import analytic_kept, cuda_sdpa, device_attention, fake_mode, hf_kept
from planner.profiler.formulas import Shape

MLA = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 64,
       "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
       "num_key_value_heads": 4, "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
       "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 32, "q_lora_rank": None,
       "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 256,
       "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
       "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
       "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 0, "hidden_act": "silu", "attention_bias": False}
QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 64,
         "intermediate_size": 128, "max_position_embeddings": 512, "num_attention_heads": 4, "num_hidden_layers": 1,
         "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_sliding_window": False,
         "tie_word_embeddings": False, "vocab_size": 256, "attention_dropout": 0.0}


def _call(q, k, v, **kw) -> cuda_sdpa.Call:
    return cuda_sdpa.Call((1, 16, 4096, q), (1, 16, 4096, k), (1, 16, 4096, v), **kw)


def test_dispatcher_picks_as_sdp_utils_does():
    mla = _call(192, 192, 128, is_causal=True)
    assert cuda_sdpa.backend(mla, 90) == cuda_sdpa.CUDNN  # cuDNN first on sm90 (cuDNN 9.20 > 9.15), (192, 128) allowed
    assert cuda_sdpa.backend(mla, 100) == cuda_sdpa.CUDNN
    assert cuda_sdpa.backend(mla, 80) == cuda_sdpa.EFFICIENT  # flash wants one head dim; efficient takes V's own
    assert cuda_sdpa.backend(mla, 90, cudnn=91400) == cuda_sdpa.EFFICIENT  # cuDNN not preferred below 9.15.1
    assert cuda_sdpa.backend(_call(192, 192, 192), 90) == cuda_sdpa.FLASH  # cuDNN's 192 only with V at 128
    assert cuda_sdpa.backend(_call(256, 256, 256), 90) == cuda_sdpa.FLASH  # cuDNN's limit 128 at 9.20
    assert cuda_sdpa.backend(_call(128, 128, 128), 90) == cuda_sdpa.CUDNN
    assert cuda_sdpa.backend(_call(128, 128, 128), 80) == cuda_sdpa.FLASH
    assert cuda_sdpa.backend(_call(128, 128, 128, has_mask=True), 80) == cuda_sdpa.EFFICIENT
    assert cuda_sdpa.backend(_call(128, 128, 128, dtype="float32"), 80) == cuda_sdpa.EFFICIENT
    assert cuda_sdpa.backend(_call(128, 128, 128, dropout=0.1), 90) == cuda_sdpa.FLASH  # cuDNN's dropout: 1/16 steps
    assert cuda_sdpa.backend(_call(12, 12, 12), 80) == cuda_sdpa.FLASH  # flash pads any head dim up to 256
    assert cuda_sdpa.backend(_call(12, 12, 8), 80) == cuda_sdpa.MATH  # V narrower, 12 not a multiple of 8
    gqa = cuda_sdpa.Call((1, 28, 4096, 128), (1, 4, 4096, 128), (1, 4, 4096, 128), is_causal=True)
    assert cuda_sdpa.backend(gqa, 90) == cuda_sdpa.CUDNN and cuda_sdpa.backend(gqa, 80) == cuda_sdpa.FLASH
    assert cuda_sdpa.capability(archs.gpu("h100")) == 90 and cuda_sdpa.capability(archs.gpu("a100-80g")) == 80
    assert cuda_sdpa.capability(archs.gpu("mi300x")) is None


@pytest.mark.parametrize(("gpu", "kernel", "lse"), [("h100", "cudnn", (2, 4, 64, 1)), ("a100-80g", "efficient", (2, 4, 64))])
def test_narrow_v_runs_the_fused_kernel_not_math(gpu, kernel, lse):
    """q/k head dim 24, v 16, 2 x 64 tokens, 4 heads: the fused kernel keeps Q, K, V, its output, the
    log-sum-exp (fp32 per head and token) and two int64 RNG scalars: no 64 x 64 scores."""
    mode = fake_mode.new_mode()
    layer = torch.nn.Identity()
    with mode, device_attention.device_attention("cuda", archs.gpu(gpu), [("layers.0", layer)]) as ran:
        q, k = (torch.empty(2, 4, 64, 24, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
        v = torch.empty(2, 4, 64, 16, dtype=torch.bfloat16, requires_grad=True)
        saved = []
        layer(q)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
    assert out.shape == (2, 4, 64, 16) and v.grad.shape == v.shape and q.grad.shape == q.shape
    assert ran.by_layer() == {"layers.0": kernel}
    shapes = sorted(tuple(t.shape) for t in saved)
    assert shapes == sorted([(), (), (2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 24), (2, 4, 64, 24), lse])
    rows = 2 * 4 * 64  # batch x heads x tokens
    assert sum(t.numel() * t.element_size() for t in saved) == 2 * rows * (24 + 24 + 16 + 16) + 4 * rows + 16



def _arch(config: dict):
    return archconfig.from_hf_config(config, where="test", name="test")


def test_mla_block_kept_by_hand():
    """The dense latent-attention block at 64 tokens (h 64, 4 heads, q/k 16 + 8, v 16, kv rank 32, MLP 128):
    analytic 149,248 B; transformers' eager block keeps 59,408 more (hf_kept), 208,656 traced."""
    T, h, heads, r, f = 64, 64, 4, 32, 128
    analytic = (2 * T * h + 4 * T + 2 * T * h  # attention norm input, 1/rms, output
                + 2 * T * r + 4 * T + 2 * T * r  # the kv latent's norm
                + 2 * 2 * T * heads * 24 + 2 * T * heads * 16  # Q, K (nope + rope), V
                + 4 * T * heads + 2 * T * heads * 16  # logsumexp, output
                + 2 * T * h + 4 * T + 2 * T * h + 4 * 2 * T * f)  # MLP norm, SwiGLU's four
    extra = 4 * T * h * 2 + 4 * T * r + 2 * 2 * T * 8 + 2 * T * heads * 16 + 2 * T * heads * 16 + 16
    assert analytic == 149_248 and extra == 59_408
    arch, shape = _arch(MLA), Shape(seq_len=T, micro_batch_size=1)
    assert sum(t.num_bytes for t in analytic_kept.block_terms(arch, shape, moe=False)) == analytic
    assert sum(t.num_bytes for t in hf_kept.extra_terms(arch, shape)) == extra
    rows, kernels = load_script("fake_saved_tensors").saved_tensors(MLA, seq_len=T, layer=0, gpu="h100")
    assert kernels == {"layers.0": "cudnn"}
    assert sum(row["bytes"] for row in rows) == analytic + extra
    assert max(row["bytes"] for row in rows) < 2 * heads * T * T  # no scores (bf16, heads x T x T)


def test_qwen2_block_kept_by_hand():
    """Qwen2 at 64 tokens (h 64, 4 heads of 16, 2 K/V heads, MLP 128, q/k/v biases): the eager RMSNorms'
    fp32 copies and normalised outputs (4 B an element each) and rotary's cos and sin (64 x 16 bf16 each)
    are the whole gap; GQA runs in the kernel (enable_gqa: no repeated K/V), the biases keep nothing."""
    T, h, kv, f = 64, 64, 32, 128
    analytic = (2 * T * h + 4 * T + 2 * T * h + 2 * T * h + 2 * 2 * T * kv + 4 * T * 4 + 2 * T * h
                + 2 * T * h + 4 * T + 2 * T * h + 4 * 2 * T * f)
    extra = 2 * 4 * T * h + 2 * 2 * T * 16
    arch, shape = _arch(QWEN2), Shape(seq_len=T, micro_batch_size=1)
    assert sum(t.num_bytes for t in analytic_kept.block_terms(arch, shape, moe=False)) == analytic == 124_416
    assert sum(t.num_bytes for t in hf_kept.extra_terms(arch, shape)) == extra == 36_864
    rows, kernels = load_script("fake_saved_tensors").saved_tensors(QWEN2, seq_len=T, layer=0, gpu="h100")
    assert kernels == {"layers.0": "cudnn"}
    assert sum(row["bytes"] for row in rows) == analytic + extra


NARROW_V = '''
import torch
from torch import nn


class Attention(nn.Module):
    """4 heads, q/k head dim 24, v 16: a latent attention's unequal head dims, over 64 tokens."""

    def __init__(self):
        super().__init__()
        self.qk, self.v, self.out = nn.Linear(64, 2 * 4 * 24), nn.Linear(64, 4 * 16), nn.Linear(4 * 16, 64)

    def forward(self, x):
        b, s, _ = x.shape
        q, k = self.qk(x).view(b, s, 2, 4, 24).permute(2, 0, 3, 1, 4)
        v = self.v(x).view(b, s, 4, 16).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(b, s, 64))


def build_model():
    return nn.Sequential(Attention(), nn.Linear(64, 32))


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size, 64, 64), torch.randn(micro_batch_size, 64, 32)
'''


def test_profile_records_kernels(tmp_path):
    """`ckplan profile --fake` names each layer's attention kernel in its assumptions: a bf16 call with V narrower
    than Q and K runs the efficient kernel on an A100 (cuDNN on H100: test_mla_block_kept_by_hand traces
    transformers' DeepseekV3 block itself). A two-layer MODEL.py: the same path as --hf-config's (profile_fake.run),
    without a decoder block's many recompute options to run."""
    from click.testing import CliRunner

    from planner import io
    from planner.cli import cli

    model = tmp_path / "narrow_v.py"
    model.write_text(NARROW_V)
    out = tmp_path / "f.json"
    result = CliRunner().invoke(cli, ["profile", str(model), "--fake", "--dtype", "bfloat16", "--gpu", "a100-80g",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    facts = io.load_profile(out).assumptions
    assert facts["attention_kernels"] == {"0": "efficient"}
    assert "compute capability 8.0" in facts["attention_kernels_source"]
