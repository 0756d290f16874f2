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
# Megatron-core: fused router's fp32 scores and bool map (T·E each), the permuted probs (S, the logits' dtype: bf16;
# WeightedSwiGLUFunction saves them as they come), fc1 input S·h·2, fc1 output S·2f·2, the activation's output S·f·2
MEGATRON = [4 * 64 * 8, 64 * 8, 2 * 128, 128 * 64 * 2, 128 * 64 * 2, 128 * 32 * 2]


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
    delta = sum(MEGATRON) - sum(GENERIC)  # -26,368 (the probs 2 x 128 B: bf16, not fp32)
    assert delta == -26368
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
    """Megatron-core's aux_loss (Arch.router_aux_loss): FusedComputeScoresForMoEAuxLoss saves its T x E
    intermediate in the top-k's dtype (fp32 under d98e8a64's TE 4329ff84: router.py 152, §543) and FusedAuxLoss the
    E int64 counts, made after the top-k's scores and map: 4 x 64 x 8 + 8 x 8 = 2,112 B more kept under every option
    that keeps the mixture, in none's record where the router runs, every tensor freed."""
    profile = _profile(replace(TINY, name="tiny-aux", router_aux_loss=True))
    found = te_moe_kept.mixtures(profile, megatron())
    assert found["mcore"] == [*MEGATRON[:2], 4 * 64 * 8, 8 * 8, *MEGATRON[2:]] and found["router"] == 5
    assert te_moe_kept.mixtures(_profile())["router"] == 3
    after = te_moe_kept.megatron_moe_profile(profile, megatron())
    for old, new in zip(profile.layers, after.layers, strict=True):
        if old.kind != "moe_block":
            continue
        kept = {o.name: o.kept_bytes for o in old.recompute_options}
        now = {o.name: o.kept_bytes for o in new.recompute_options}
        assert now["none"] == kept["none"] - 26368 + 2112 and now["mlp"] == kept["mlp"]
        record = new.alloc_records["none"]
        made = [code for code in record.forward if code > 0]
        assert found["mcore"] == made[made.index(MEGATRON[0]):][:len(found["mcore"])]
        count = sum(1 for code in [*record.forward, *record.backward] if code > 0)
        freed = {-code for code in [*record.forward, *record.backward] if code < 0}
        assert set(range(1, count + 1)) - freed == {record.output, record.input_grad}


def test_another_runtime_keeps_the_eager_mixture():
    profile = _profile()
    assert te_moe_kept.megatron_moe_profile(profile, runtimes._of("torchtitan", None, False)) == profile


def test_the_routers_intermediate_is_in_the_records_te_dtype_and_the_aux_loss_keeps_its_own():
    from planner.cost.runtime_megatron import megatron_bridge

    T, E = 64, 8
    # TE v2.9 (the Bridge's record): the fused top-k saves its intermediate in the logits' dtype, bf16 (router.cpp
    # 42-47): 2 B a (token, expert), not fp32's 4; TE 4329ff84 (d98e8a64's record) writes it fp32 (router.cpp 66)
    assert megatron_bridge().te_router_scores == "logits" and megatron().te_router_scores == "fp32"
    assert te_moe_kept.mixtures(_profile(), megatron_bridge())["mcore"] == [2 * T * E, *MEGATRON[1:]]
    assert te_moe_kept.mixtures(_profile(), megatron())["mcore"] == MEGATRON
    # the aux loss: its score kernel's intermediate (T x E, the top-k's dtype) and the counts (E int64) beside the map
    aux = _profile(replace(TINY, name="tiny-aux", router_aux_loss=True))
    assert te_moe_kept.mixtures(aux, megatron_bridge())["mcore"] == [2 * T * E, T * E, 2 * T * E, 8 * E, *MEGATRON[2:]]
    assert te_moe_kept.mixtures(aux, megatron())["mcore"] == [4 * T * E, T * E, 4 * T * E, 8 * E, *MEGATRON[2:]]
    # and the layer keeps them: the Bridge's none keeps 2 T·E less at the top-k and 2 T·E + 8 E more for the aux loss
    # than the fp32 record without the aux loss
    delta = {run: sum(found["mcore"]) - sum(found["generic"]) for run, found in (
        ("plain", te_moe_kept.mixtures(_profile(), megatron())),
        ("bridge-aux", te_moe_kept.mixtures(aux, megatron_bridge())))}
    assert delta["bridge-aux"] - delta["plain"] == -2 * T * E + 2 * T * E + 8 * E == 64
    old, new = aux.layers, te_moe_kept.megatron_moe_profile(aux, megatron_bridge()).layers
    for before, after in zip(old, new, strict=True):
        if before.kind == "moe_block":
            assert after.act_bytes == before.act_bytes + delta["bridge-aux"]
            made = [code for code in after.alloc_records["none"].forward if code > 0]
            run = [2 * T * E, T * E, 2 * T * E, 8 * E, *MEGATRON[2:]]
            assert any(made[at:at + len(run)] == run for at in range(len(made)))
