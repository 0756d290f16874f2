"""A latent attention's backward FLOPs at its own head dims (formulas.attention_bwd_flops): the five backward
GEMMs counted one by one against torch's flop counter on an SDPA call, and the analytic kernel carrying them."""

from __future__ import annotations

from torch.utils import flop_counter

from planner.models import archs
from planner.profiler import analytic_time, formulas
from planner.profiler.analytic import Shape

# 4 heads, q/k 12 (nope 8 + rope 4), v 8
TINY = archs.Arch(name="tiny-mla", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=4,
                  vocab_size=128, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=12)
LLAMA = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                   num_kv_heads=4, vocab_size=128, tie_word_embeddings=False)


def test_backward_gemms_by_hand():
    b, h, s, d_qk, d_v = 2, 4, 32, 12, 8
    gemm = 2 * b * h * s * s  # one s x s GEMM's multiply-adds x 2, per unit of head dim
    forward = gemm * d_qk + gemm * d_v  # S = QKᵀ, O = PV
    backward = gemm * d_qk + gemm * d_v + gemm * d_v + gemm * d_qk + gemm * d_qk  # S again, dP, dV, dQ, dK
    assert backward == gemm * (3 * 12 + 2 * 8) == 851_968
    assert formulas.attention_bwd_flops(TINY, forward) == backward  # 52 / 20: 2.6x
    assert formulas.attention_bwd_flops(LLAMA, forward) == forward * 5 // 2
    # torch's own count of the same shapes (torch/utils/flop_counter.py, the counter the fake profile uses)
    q, k, v = (b, h, s, d_qk), (b, h, s, d_qk), (b, h, s, d_v)
    assert flop_counter.sdpa_flop_count(q, k, v) == forward
    assert flop_counter.sdpa_backward_flop_count((b, h, s, d_v), q, k, v) == backward

def test_the_analytic_kernel_carries_the_latent_ratio():
    shape = Shape(seq_len=32, micro_batch_size=2)
    core = analytic_time._attention(TINY, shape)[0][0]
    assert core.flops == 2 * 64 * 32 * 4 * (12 + 8)  # T·s·heads·(d_qk + d_v) x 2, counted over the full s x s
    fwd, bwd, _ = analytic_time.block_work(TINY, shape)
    (attention_bwd,) = [kernel for kernel, _ in bwd.kernels if kernel.kind == "attention-bwd"]
    assert attention_bwd.flops == core.flops * 52 // 20 and attention_bwd.run_fraction == core.run_fraction
