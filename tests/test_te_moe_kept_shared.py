"""A Megatron-core MoE layer with a shared expert and latent attention (DeepSeek-V3's shape, tiny), as
planner/cost/te_moe_kept.py keeps it (docs/framework-facts.md §101): the shared expert's fused SwiGLU input and
linear_fc2 input in place of the analytic profile's four SwiGLU tensors, counted by hand."""

from planner.cost import te_moe_kept
from planner.cost.runtime_megatron import megatron
from planner.models import archs
from planner.profiler import analytic, analytic_kept
from planner.profiler.analytic import Shape
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 heads; q latent 24, kv latent 16; 8 experts of width 32, top 2; one shared expert of width 48; 64 tokens
TINY = archs.Arch(name="tiny-mla-shared", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, q_lora_rank=24, kv_lora_rank=16,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, head_dim=12, num_experts=8,
                  num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1, shared_intermediate_size=48)
SHAPE = Shape(seq_len=32, micro_batch_size=2)
ROUTED_GENERIC = [4 * 64 * 8, 8 * 64 * 2, 4 * 64 * 2, 128 * 64 * 2, 8 * 128, *[128 * 32 * 2] * 4, 128 * 64 * 2]
ROUTED_MEGATRON = [4 * 64 * 8, 64 * 8, 2 * 128, 128 * 64 * 2, 128 * 64 * 2, 128 * 32 * 2]
SHARED_GENERIC = [64 * 48 * 2] * 4  # gate out, SiLU out, up out, product: T x 48 x 2 B
SHARED_MEGATRON = [64 * 96 * 2, 64 * 48 * 2]  # linear_fc1's output (the fused SwiGLU's input), linear_fc2's input


def _profile():
    return analytic.analytic_profile(TINY, SHAPE, gpu=H100, model=REF)


def test_the_shared_expert_by_hand_after_the_routed_ones():
    found = te_moe_kept.mixtures(_profile())
    assert found["generic"] == ROUTED_GENERIC + SHARED_GENERIC
    assert found["mcore"] == ROUTED_MEGATRON + SHARED_MEGATRON
    # the generic run is what the analytic profile charges for the mixture, shared expert included
    assert sum(found["generic"]) == sum(term.num_bytes for term in analytic_kept.moe_terms(TINY, SHAPE))
    # moe_act is the routed experts' alone: what it frees is unchanged by the shared expert
    assert found["act_generic"] == 2 * 128 * 32 * 2 and found["act_mcore"] == 128 * 32 * 2


def test_megatrons_blocks_keep_the_shared_experts_two_tensors_under_every_option_that_keeps_the_mixture():
    profile = _profile()
    after = te_moe_kept.megatron_moe_profile(profile, megatron())
    delta = sum(ROUTED_MEGATRON + SHARED_MEGATRON) - sum(ROUTED_GENERIC + SHARED_GENERIC)
    assert delta == -26368 - 64 * 48 * 2  # the routed experts' (test_te_moe_kept) and one shared T x 48 less
    blocks = 0
    for old, new in zip(profile.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            assert new == old
            continue
        blocks += 1
        kept = {o.name: o.kept_bytes for o in old.recompute_options}
        now = {o.name: o.kept_bytes for o in new.recompute_options}
        assert now["none"] == kept["none"] + delta and new.act_bytes == old.act_bytes + delta
        assert now["mla-up"] == kept["mla-up"] + delta  # the latent attention's option keeps the mixture
        assert now["mlp"] == kept["mlp"] and now["full"] == kept["full"]
        made = [code for code in new.alloc_records["none"].forward if code > 0]
        run = ROUTED_MEGATRON + SHARED_MEGATRON  # none's record holds Megatron's run of tensors, the generic one gone
        assert any(made[at:at + len(run)] == run for at in range(len(made)))
        generic = ROUTED_GENERIC + SHARED_GENERIC
        assert not any(made[at:at + len(generic)] == generic for at in range(len(made)))
    assert blocks == 2
