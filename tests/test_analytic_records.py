"""Every recompute option a profiler emits, and the loss, carry the allocation records the caching allocator's
replay plays (planner/profiler/analytic_records.py, allocseq.py; planner/cost/loss_records.py), so that no stage of
a supported plan falls back on the divisor; where one still does, evaluate says which and why."""

import pytest
from fixtures.cli import run_ok

from planner import io
from planner.cost import costmodel, loss_records
from planner.models.archs import arch, gpu
from planner.profiler import analytic
from planner.profiler.formulas import Shape
from planner.schema import OPTION_NONE, OPTION_OFFLOAD, FileRef, StagePlan, TrainSetup

GIB = 2**30


def _missing(profile) -> list[tuple[str, str]]:
    """(layer, option) for every option a layer offers without the record the replay plays for it."""
    return [(layer.name, option.name) for layer in profile.layers for option in layer.recompute_options
            if (OPTION_NONE if option.name == OPTION_OFFLOAD else option.name) not in layer.alloc_records]


def _analytic(name: str, **shape) -> object:
    return analytic.analytic_profile(arch(name), Shape(**{"seq_len": 256, "micro_batch_size": 1, **shape}),
                                     gpu=gpu("h100-sxm"), model=FileRef(file=f"arch:{name}", sha256="0" * 64))


@pytest.mark.parametrize("name, shape", [("llama3-8b", {}), ("llama3-8b", {"tp": 2, "sp": True}),
                                         ("mixtral-8x7b", {}), ("deepseek-v2-lite", {"tp": 2}),
                                         ("gpt3-175b", {"tp": 8}), ("qwen3-0.6b", {})])
def test_an_analytic_profile_records_every_option_its_blocks_offer(name, shape):
    profile = _analytic(name, **shape)
    assert _missing(profile) == []
    for layer in profile.layers:
        for option in layer.recompute_options:  # what each record's forward keeps is the option's kept bytes
            record = layer.alloc_records[OPTION_NONE if option.name == OPTION_OFFLOAD else option.name]
            made = [code for code in record.forward if code > 0]
            kept = sum(size for ident, size in enumerate(made, 1) if ident != record.output)
            assert kept == (option.kept_bytes if option.name != OPTION_OFFLOAD else layer.act_bytes) \
                - layer.input_in_act_bytes, (layer.name, option.name)
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2)
    assert loss_records.stage_loss(profile, setup) is not None


def test_mlp_act_on_a_llama_block_by_hand():
    """llama3-8b at 256 tokens, bf16: mlp-act keeps none's tensors but SiLU's output and the product (two 256 x
    14336 x 2 B); its backward makes them again, frees them, then runs none's backward."""
    block = _analytic("llama3-8b").layers[1]
    none, act = block.alloc_records["none"], block.alloc_records["mlp-act"]
    wide = 256 * 14336 * 2
    made = [code for code in none.forward if code > 0]
    assert sorted(made) == sorted([code for code in act.forward if code > 0] + [wide, wide])
    k = len(act.forward)  # its kept tensors and the output, ids 1..k
    assert act.output == k and act.forward[-1] == 256 * 4096 * 2
    assert act.backward[:4] == [wide, wide, -(k + 2), -(k + 1)]
    assert [code for code in act.backward if code > 0][2:] == [code for code in none.backward if code > 0]


def test_an_analytic_loss_record_holds_the_terms_charged_by_hand():
    """The plain loss on fp32 logits kept 4 B apart: forward the saved tensor and the value, backward the scratch
    beyond the logits' gradient, the gradient (handed back), then the saved tensor and the scratch freed."""
    record = loss_records.loss_record(kept=1000 + 4, transient=700, grad=300)
    assert record.forward == [1000, 4] and record.output == 2
    assert record.backward == [400, 300, -1, -3] and record.input_grad == 4
    fused = loss_records.loss_record(kept=4, transient=50, grad=0)  # the gradient in the logits' own storage
    assert fused.forward == [4] and fused.backward == [50, -2] and fused.input_grad == 0


def _options_plan(profile, option: str) -> list[StagePlan]:
    names = [layer.name for layer in profile.layers]
    blocks = {layer.name for layer in profile.layers if layer.recompute_options}
    cut = len(names) // 2
    return [StagePlan(index=i, layers=part, recompute={name: option for name in part if name in blocks and option != "none"})
            for i, part in enumerate((names[:cut], names[cut:]))]


def test_no_stage_of_a_llama_plan_falls_back_on_the_divisor_under_any_option():
    profile = _analytic("llama3.2-1b")
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2,
                       precision="bf16-mixed")
    options = [option.name for option in profile.layers[1].recompute_options]
    assert {"none", "full", "core-attn", "mlp-act", "op-sac", "offload"} <= set(options)
    for option in options:
        cost = costmodel.evaluate(_options_plan(profile, option), profile, setup)
        assert [c.reserved_by for c in cost.stages] == ["replay", "replay"], option


def test_evaluate_says_which_stage_keeps_the_divisor_and_why(tmp_path):
    profile = _analytic("llama3.2-1b")
    path = tmp_path / "p.json"
    io.save_profile(profile.model_copy(update={"layers": [
        layer.model_copy(update={"alloc_records": {k: v for k, v in layer.alloc_records.items() if k != "full"}})
        if layer.name == "layers.3" else layer for layer in profile.layers]}), path)
    result = run_ok("evaluate", "--profile", path, "--mem", "80GB", "--layers-per-stage", "8,10",
                    "--ckpt-per-stage", "8,0", "--precision", "bf16-mixed", "--time-limit", "5")
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "your configuration: stage 0's reserved is the divisor's" in said
    assert "layers.3 has no allocation record for its option 'full'" in said
    assert "your configuration: stage 1's reserved is the divisor's" not in said


@pytest.mark.xdist_group("llama_style_profiles")  # one worker: the shared profiles once (conftest.py)
@pytest.mark.parametrize("fake", [True, False])
def test_a_model_files_profile_records_every_option_and_the_loss(llama_style_profiles, fake):
    """tests/fixtures/llama_style.py profiled fake (--device cpu) and measured (one thread, one repeat, no warmup)."""
    measured, faked, _ = llama_style_profiles
    profile = io.load_profile(faked if fake else measured)
    assert _missing(profile) == [] and profile.loss_alloc is not None
    assert any(len(layer.recompute_options) > 2 for layer in profile.layers)


@pytest.mark.parametrize("name, shape", [("qwen3-0.6b", {}), ("deepseek-v2-lite", {"tp": 2})])
def test_an_mtp_layer_records_its_blocks_selective_options(name, shape):
    """An MTP layer keeps its transformer layer's tensors one by one (analytic_mtp.py), so each selective option it
    offers (the block's) has a record keeping the option's bytes, and a last stage running one is replayed."""
    profile = _analytic(name, mtp=1, **shape)
    mtp = next(layer for layer in profile.layers if layer.kind == "mtp")
    selective = [option for option in mtp.recompute_options if option.name not in ("none", "full")]
    assert selective and [missing for missing in _missing(profile) if missing[0] == mtp.name] == []
    for option in selective:
        record = mtp.alloc_records[option.name]
        made = [code for code in record.forward if code > 0]
        assert sum(size for ident, size in enumerate(made, 1) if ident != record.output) == option.kept_bytes
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, mem_caps_bytes=[80 * GIB] * 2,
                       precision="bf16-mixed")
    names = [layer.name for layer in profile.layers]
    for option in selective:
        plan = [StagePlan(index=0, layers=names[:2]),
                StagePlan(index=1, layers=names[2:], recompute={mtp.name: option.name})]
        assert [c.reserved_by for c in costmodel.evaluate(plan, profile, setup).stages] == ["replay", "replay"], \
            option.name
