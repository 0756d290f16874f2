"""What a Megatron-core MoE layer keeps (planner/cost/te_moe_kept.py, docs/framework-facts.md §95): TEGroupedMLP's
saved tensors in place of the analytic profile's eager mixture, counted by hand on a tiny block."""

from dataclasses import replace

from planner.cost import runtimes, te_moe_kept
from planner.cost.runtime_megatron import megatron
from planner.models import archs
from planner.profiler import analytic, analytic_kept
from planner.profiler.analytic import Shape
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 8 experts of width 32, top 2, no shared expert; 64 tokens: S = 128 routed copies
TINY = archs.Arch(name="tiny-moe-kept", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32)
SHAPE = Shape(seq_len=32, micro_batch_size=2)
# the analytic mixture: router fp32 T·E, int64 T·k, fp32 T·k; dispatched S·h·2; int64 S; SwiGLU 4 x S·f·2; outputs S·h·2
GENERIC = [4 * 64 * 8, 8 * 64 * 2, 4 * 64 * 2, 128 * 64 * 2, 8 * 128, *[128 * 32 * 2] * 4, 128 * 64 * 2]
# Megatron-core: fused router's fp32 scores and bool map (T·E each), fp32 probs (S), fc1 input S·h·2, fc1 output
# S·2f·2, the activation's output S·f·2
MEGATRON = [4 * 64 * 8, 64 * 8, 4 * 128, 128 * 64 * 2, 128 * 64 * 2, 128 * 32 * 2]


def _profile(arch=TINY):
    return analytic.analytic_profile(arch, SHAPE, gpu=H100, model=REF)


def test_the_two_mixtures_by_hand():
    found = te_moe_kept.mixtures(_profile())
    assert found["generic"] == GENERIC and found["mcore"] == MEGATRON
    assert found["act_generic"] == 2 * 128 * 32 * 2 and found["act_mcore"] == 128 * 32 * 2
    # the generic run is what the analytic profile charges for the mixture
    assert sum(GENERIC) == sum(term.num_bytes for term in analytic_kept.moe_terms(TINY, SHAPE))


def test_the_clamped_glu_keeps_the_cat_unless_moe_act_recomputes_it():
    found = te_moe_kept.mixtures(_profile(replace(TINY, name="tiny-clamped", swiglu_limit=7.0)))
    assert found["mcore"] == [*MEGATRON[:5], 128 * 64 * 2, 128 * 32 * 2]  # the cat of the clamped halves, 2f
    assert found["act_mcore"] == 3 * 128 * 32 * 2


def test_megatrons_moe_blocks_keep_its_tensors_and_moe_act_frees_fc2s_input():
    profile = _profile()
    after = te_moe_kept.megatron_moe_profile(profile, megatron())
    delta = sum(MEGATRON) - sum(GENERIC)  # -26,112
    assert delta == -26112
    for old, new in zip(profile.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            assert new == old
            continue
        kept = {o.name: o.kept_bytes for o in old.recompute_options}
        now = {o.name: o.kept_bytes for o in new.recompute_options}
        assert now["none"] == kept["none"] + delta and new.act_bytes == old.act_bytes + delta
        assert now["mlp-act"] == kept["mlp-act"] + delta + 2 * 128 * 32 * 2 - 128 * 32 * 2
        assert now["mlp"] == kept["mlp"] and now["full"] == kept["full"]
        none_old, none_new = old.alloc_records["none"], new.alloc_records["none"]
        made = [code for code in none_new.forward if code > 0]
        assert sum(made) == sum(code for code in none_old.forward if code > 0) + delta
        assert MEGATRON == made[made.index(MEGATRON[0]):][:len(MEGATRON)]
        for record in (none_old, none_new):  # every tensor freed but the output and the input's gradient
            count = sum(1 for code in [*record.forward, *record.backward] if code > 0)
            freed = {-code for code in [*record.forward, *record.backward] if code < 0}
            assert set(range(1, count + 1)) - freed == {record.output, record.input_grad}


def test_the_aux_loss_keeps_its_intermediate_after_the_routing_map():
    """Megatron-core's aux_loss (Arch.router_aux_loss): TE v2.9's FusedComputeScoresForMoEAuxLoss saves its T x E
    intermediate in the logits' bf16 (router.py 152), made after the top-k's scores and map: 2 x 64 x 8 = 1,024 B
    more kept under every option that keeps the mixture, in none's record where the router runs."""
    profile = _profile(replace(TINY, name="tiny-aux", router_aux_loss=True))
    found = te_moe_kept.mixtures(profile)
    assert found["mcore"] == [*MEGATRON[:2], 2 * 64 * 8, *MEGATRON[2:]] and found["router"] == 4
    assert te_moe_kept.mixtures(_profile())["router"] == 3
    after = te_moe_kept.megatron_moe_profile(profile, megatron())
    for old, new in zip(profile.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            continue
        kept = {o.name: o.kept_bytes for o in old.recompute_options}
        now = {o.name: o.kept_bytes for o in new.recompute_options}
        assert now["none"] == kept["none"] - 26112 + 1024 and now["mlp"] == kept["mlp"]
        record = new.alloc_records["none"]
        made = [code for code in record.forward if code > 0]
        assert found["mcore"] == made[made.index(MEGATRON[0]):][:len(found["mcore"])]
        count = sum(1 for code in [*record.forward, *record.backward] if code > 0)
        freed = {-code for code in [*record.forward, *record.backward] if code < 0}
        assert set(range(1, count + 1)) - freed == {record.output, record.input_grad}


def test_another_runtime_keeps_the_eager_mixture():
    profile = _profile()
    assert te_moe_kept.megatron_moe_profile(profile, runtimes._of("torchtitan", None, False)) == profile
