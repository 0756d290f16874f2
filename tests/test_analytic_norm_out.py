"""The analytic blocks' `norm-out` (Megatron-LM's layernorm recompute: the norms megatron-core's
Transformer Engine layer builds as modules of their own run without keeping their outputs, recomputed
in backward; d98e8a64 transformer_layer.py 470-531) and a dense block's whole-MLP `mlp` (Megatron-LM's
mlp), by hand on tiny blocks."""

import pytest

from planner.models import archs
from planner.profiler import analytic, analytic_time
from planner.profiler.analytic import Shape
from planner.profiler.analytic_kept import norm_out_bytes

H100 = archs.gpu("h100")
SHAPE = Shape(seq_len=32, micro_batch_size=2)  # 64 tokens, bf16
TINY_MOE = archs.Arch(name="tiny-moe", hidden_size=64, intermediate_size=160, num_layers=3, num_heads=4,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, num_shared_experts=1,
                      shared_intermediate_size=48, dense_layers=(0,))
TINY_MLA = archs.Arch(name="tiny-mla", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                      num_kv_heads=4, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32,
                      kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
NORM = 64 * 64 * 2 + 64 * 4  # one RMSNorm: its output (64 tokens x 64 x 2 B) and 1/rms (64 x fp32)


def _kept(arch, shape, **moe):
    return sum(term.num_bytes for term in analytic.block_terms(arch, shape, **moe))


def _options(arch, **moe):
    return {o.name: o for o in analytic.selective_options(arch, SHAPE, H100, 0.4, **moe)}


def test_norm_out_frees_the_norms_megatron_builds_as_modules():
    assert norm_out_bytes(TINY_MOE, SHAPE, moe=True) == {"mlp": NORM}  # GQA: the attention norm is fused
    assert norm_out_bytes(TINY_MOE, SHAPE, moe=False) == {}  # dense GQA: both fused into LayerNormLinear
    assert norm_out_bytes(TINY_MLA, SHAPE, moe=False) == {"attn": NORM}  # MLA: the attention norm is its own
    assert "norm-out" not in _options(TINY_MOE, moe=False)
    moe = _options(TINY_MOE, moe=True)
    assert moe["norm-out"].kept_bytes == _kept(TINY_MOE, SHAPE, moe=True) - NORM
    assert moe["norm-out"].recompute_peak_bytes == NORM
    # one RMSNorm's forward: read and write 64 x 64 (36 B an element and 28 a token, analytic_time's rates)
    assert moe["norm-out"].recompute_ms == pytest.approx(
        analytic_time.times_ms((analytic_time.rerun_work(TINY_MOE, SHAPE, "norm"),), H100, 0.4)[0])
    assert analytic_time.rerun_work(TINY_MOE, SHAPE, "norm").bytes == 36 * 64 * 64 + 28 * 64


def test_norm_out_combines_and_its_restored_output_adds_to_its_sub_blocks_recompute():
    moe, kept = _options(TINY_MOE, moe=True), _kept(TINY_MOE, SHAPE, moe=True)
    mixture = moe["mlp"].recompute_peak_bytes
    core = 4 * 4 * 32 * 2  # flash's logsumexp, 4 heads x 64 tokens x fp32
    assert moe["mlp,norm-out"].kept_bytes == kept - mixture - NORM
    assert moe["mlp,norm-out"].recompute_peak_bytes == mixture + NORM  # the MLP norm is back while the MoE reruns
    assert moe["core-attn,norm-out"].recompute_peak_bytes == max(core, NORM)  # at different points of the backward
    latent = _options(TINY_MLA)
    up = latent["mla-up"].recompute_peak_bytes
    assert latent["mla-up,norm-out"].recompute_peak_bytes == up + NORM
    assert latent["mlp,norm-out"].recompute_peak_bytes == max(4 * 64 * 160 * 2, NORM)


def test_dense_mlp_frees_the_whole_mlp_and_reruns_its_forward():
    dense, kept = _options(TINY_MOE, moe=False), _kept(TINY_MOE, SHAPE, moe=False)
    swiglu = 4 * 64 * 160 * 2  # gate out, SiLU out, up out, product: 64 tokens x 160 x 2 B each
    assert dense["mlp"].kept_bytes == kept - swiglu and dense["mlp"].recompute_peak_bytes == swiglu
    assert "mlp,mlp-act" not in dense and dense["core-attn,mlp"].kept_bytes == kept - swiglu - 4 * 4 * 32 * 2
    rerun = analytic_time.rerun_work(TINY_MOE, SHAPE, "mlp", moe=False)
    assert rerun.flops == 3 * 2 * 64 * 64 * 160  # gate, up and down
    gpt = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                     num_kv_heads=4, vocab_size=128, tie_word_embeddings=True, max_position_embeddings=32)
    options, gelu = _options(gpt), 2 * 64 * 256 * 2  # GELU's input and output
    assert options["mlp"].kept_bytes == _kept(gpt, SHAPE) - gelu
    assert analytic_time.rerun_work(gpt, SHAPE, "mlp", moe=False).flops == 2 * 2 * 64 * 64 * 256


def test_megatron_export_of_norm_out_and_dense_mlp_reads_back_as_the_plan(tmp_path):
    """A DeepSeek-V2-Lite plan whose every layer takes mla-up,mlp,norm-out, under a cap only that list
    fits, is exported as --recompute-modules mla_up_proj mlp moe layernorm, and --from-megatron's reader
    gives every layer the same option and the rank the same bytes as the export's re-score."""
    import json

    from export_plans import make_chunked_plan
    from fixtures.cli import run_ok

    from planner import io
    from planner.cost import costmodel
    from planner.emit import megatron

    run_ok("profile", "--arch", "deepseek-v2-lite", "--seq-len", "1024", "--micro-batch-size", "1", "--gpu", "h100",
           "--out", tmp_path / "p.json")
    profile = io.load_profile(tmp_path / "p.json")
    every = {layer.name: "mla-up,mlp,norm-out" for layer in profile.layers if layer.kind in ("decoder_block", "moe_block")}
    assert len(every) == 27

    def plan_at(cap_mib):
        return make_chunked_plan(profile, tmp_path / "p.json", [len(profile.layers)], every, schedule="1F1B", chunks=1,
                                 microbatches=4, cap_mib=cap_mib, runtime="megatron",
                                 te_grouped_gemm=True)  # as the export's --moe-grouped-gemm runs it

    from planner.cost.assembly import FIT_MARGIN_BYTES

    # what it reserves and the fit margin (the replay judges it: every option has its record): nothing keeping more fits
    plan = plan_at((plan_at(10**7).stages[0].predicted.reserved_bytes + FIT_MARGIN_BYTES) / 2**20)
    io.save_plan(plan, tmp_path / "plan.yaml")
    result = megatron.export(plan, profile, plan_file=str(tmp_path / "plan.yaml"))
    assert "    --recompute-modules mla_up_proj mlp moe layernorm\n" in result.text
    script = tmp_path / "train.sh"
    script.write_text(result.text + 'torchrun --nproc_per_node 1 pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" '
                      "--vocab-size 102400\n")
    summary = json.loads(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100", "--json").stdout)
    exported = costmodel.evaluate(result.rounded.ranks(), profile, result.rounded.setup).stages[0]
    assert not [note for note in summary["notes"] if note.startswith("selective recompute")]
    rank = summary["ranks"][0]
    assert set(rank["recompute"].values()) == {"mla-up,mlp,norm-out"} and len(rank["recompute"]) == 27
    assert (rank["static_bytes"], rank["peak_bytes"]) == (exported.static_bytes, exported.peak_bytes)
    assert exported.activation_bytes == plan.stages[0].predicted.activation_bytes
