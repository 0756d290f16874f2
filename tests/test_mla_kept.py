"""What Megatron-LM's mla_up_proj frees on a latent-attention block under Transformer Engine's spec
(planner/profiler/analytic_kept.py mla_up_norm_bytes, docs/framework-facts.md §101): Q, K and V, and the latent
norms' outputs and statistics the up projections' fused norms make inside the checkpoint, by hand."""

from planner.models import archs
from planner.profiler import analytic_kept, analytic_time
from planner.profiler.analytic import Shape

H100 = archs.gpu("h100")
# h 64, 4 heads; q latent 24, kv latent 16, nope 8, rope 4, v 8; dense
TINY = archs.Arch(name="tiny-mla-kept", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=12)
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # 64 tokens


def test_mla_up_frees_q_k_v_and_the_latent_norms_outputs_and_statistics():
    T, n = 64, 4
    qkv = T * n * (8 + 4) * 2 + T * n * (8 + 4) * 2 + T * n * 8 * 2  # Q, K, V in bf16: 16,384 B
    norms = T * 24 * 2 + 4 * T + T * 16 * 2 + 4 * T  # each latent norm's output and fp32 1/rms: 5,632 B
    assert analytic_kept.mla_up_norm_bytes(TINY, SHAPE) == norms == 5632
    options = {o.name: o for o in analytic_kept.selective_options(TINY, SHAPE, H100)}
    none = sum(term.num_bytes for term in analytic_kept.block_terms(TINY, SHAPE))
    assert options["mla-up"].kept_bytes == none - qkv - norms


def test_the_mla_up_rerun_runs_the_latent_norms_and_rotary():
    done = analytic_time.rerun_work(TINY, SHAPE, "mla-up")
    latents, rotated = 64 * (24 + 16), 64 * (4 * 4 + 4)
    built = 4 * 64 * 4 * 12 * 2  # the query's cat and the key's build, Q and K read and written (hf_mla.up_bytes)
    assert dict(done.classed) == {"norm": 36 * latents, "attention": 20 * rotated + built}
    assert done.flops == 2 * 64 * 24 * 4 * 12 + 2 * 64 * 16 * 4 * 16
