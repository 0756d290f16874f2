"""The two attention regions by name (docs/framework-facts.md §82, §87): `core-attn` the attention core
alone (Megatron-LM's core_attn, analytic profiles), `attn` the attention module whole (ckplan's runtime,
the fake profile, and now analytic GQA blocks); files written before the rename read with an analytic
`attn` as `core-attn` (planner/schema/renames.py)."""

import json

import pytest
import torch
import yaml
from export_plans import llm_profile, make_plan
from test_analytic_split import SEQ, _config, _first_block

from planner import io
from planner.models import archs
from planner.models.archconfig import from_hf_config
from planner.profiler import analytic_kept, analytic_split, analytic_time
from planner.profiler.analytic_kept import gqa_terms, offers_whole_attention, selective_options
from planner.profiler.fake import counting
from planner.profiler.fake_split import split_work
from planner.profiler.formulas import Shape
from planner.runtime.recompute import layer_runner
from planner.schema import PLAN_SCHEMA_VERSION, PROFILE_SCHEMA_VERSION
from planner.schema.renames import core_attention_named

H100 = archs.gpu("h100")
TINY = archs.Arch(name="tiny-llama", style="llama", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, vocab_size=128, tie_word_embeddings=False)


def _options(arch, shape):
    return {o.name: o for o in selective_options(arch, shape, H100, 0.5)}


def test_attn_frees_everything_the_attention_module_saves_but_its_input():
    """Tiny LLaMA block, T = 32 tokens, 4 heads of 16, 2 K/V heads, flash: the module keeps Q (32 x 64 x 2 B),
    K and V (32 x 32 x 2 B each), flash's logsumexp (4 x 32 x 4 B) and its output (32 x 64 x 2 B); its input
    (the norm output) stays, held by the checkpoint. It reruns Q, K and V's GEMMs, rotary and the core (torch's
    early stop: not the output projection's GEMM); core-attn frees the logsumexp alone."""
    shape = Shape(seq_len=16, micro_batch_size=2)
    options = _options(TINY, shape)
    none = sum(term.num_bytes for term in analytic_kept.block_terms(TINY, shape))
    freed = 32 * 64 * 2 + 2 * 32 * 32 * 2 + 4 * 32 * 4 + 32 * 64 * 2
    assert none - options["attn"].kept_bytes == freed == options["attn"].recompute_peak_bytes
    assert none - options["core-attn"].kept_bytes == 4 * 32 * 4
    assert none - options["attn,mlp"].kept_bytes == freed + 4 * 32 * 128 * 2
    assert "core-attn,attn" not in options and "attn,core-attn" not in options
    rerun = analytic_time.rerun_work(TINY, shape, "attn")
    core = 4 * 32 * 16 * 64  # 4·T·s·w forward (the kernel runs half of it, causal)
    assert rerun.flops == 2 * 32 * 64 * (64 + 32 + 32) + core
    assert dict(rerun.classed) == {"attention": 20 * 32 * (64 + 32) + 32 * 16 * 8}  # rotary on Q and K, cos and sin
    assert options["attn"].recompute_ms == pytest.approx(analytic_time.times_ms((rerun,), H100, 0.5)[0])
    # a split backward reruns it once in I and once per group of q, k, v, o in W
    assert analytic_split.region_groups(TINY, "attn", moe=False) == 4
    assert analytic_split.selective_split(TINY, "attn,mlp", (1.0, 2.0), {"attn": 0.25, "mlp": 0.5}, moe=False) == {
        "input_grad_ms": 1.75, "weight_grad_ms": 2.0 + 4 * 0.25 + 3 * 0.5}


def test_attn_is_offered_where_its_count_holds():
    shape = Shape(seq_len=16, micro_batch_size=1)
    assert offers_whole_attention(TINY, shape)
    assert not offers_whole_attention(TINY, Shape(seq_len=16, micro_batch_size=1, tp=2))
    assert not offers_whole_attention(TINY, Shape(seq_len=16, micro_batch_size=1, cp=2))
    for name in ("deepseek-v2-lite", "gpt-oss-20b"):  # latent attention; attention sinks
        assert not offers_whole_attention(archs.arch(name), shape)
    gpt = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                     num_kv_heads=4, vocab_size=128, tie_word_embeddings=True, max_position_embeddings=32)
    assert "attn" not in _options(gpt, shape) and "core-attn" in _options(gpt, shape)
    assert sum(t.num_bytes for t in gqa_terms(TINY, shape)[1:]) > 0


def test_analytic_attn_is_the_fake_counts_of_the_runtimes_attn_on_a_tiny_llama_block():
    """The runtime's `attn` (the self_attn module checkpointed) on transformers' LLaMA block, under the fake
    profile's counters: its rerun in I is the analytic rerun to the FLOP and the byte, and W reruns it 4 times
    (the FLOPs); the fake classes W's rerun bytes elementwise (no module entered: §87), the analytic as in I."""
    config = _config("llama-3.2-1b")
    arch = from_hf_config(config, where="llama", name="llama")
    shape = Shape(seq_len=SEQ, micro_batch_size=1)
    block, x = _first_block(config)
    x = x.requires_grad_(True)
    grad = torch.zeros_like(block(x))
    none_input, none_weight, _ = split_work(layer_runner(block, "none"), block, x, grad, counting)
    attn_input, attn_weight, _ = split_work(layer_runner(block, "attn"), block, x, grad, counting)
    rerun = analytic_time.rerun_work(arch, shape, "attn")
    assert attn_input.flops - none_input.flops == rerun.flops
    assert attn_input.bytes - none_input.bytes == rerun.bytes
    assert dict(attn_input.classed)["attention"] - dict(none_input.classed)["attention"] == rerun.bytes
    assert attn_weight.flops - none_weight.flops == 4 * rerun.flops
    assert attn_weight.bytes - none_weight.bytes == 4 * rerun.bytes


def test_option_names_in_older_files():
    assert core_attention_named("attn") == "core-attn"
    assert core_attention_named("attn,mlp-act") == "core-attn,mlp-act"
    assert core_attention_named("mlp,norm-out") == "mlp,norm-out"


def _old_profile(tmp_path, source: str):
    profile = llm_profile(options=True)
    data = json.loads(profile.model_dump_json())
    data.update(schema_version=1, source=source)
    for layer in data["layers"]:  # as written before: the core was `attn`, no whole-module option
        options = [o for o in layer["recompute_options"] if o["name"] != "attn"]
        for option in options:
            option["name"] = option["name"].replace("core-attn", "attn")
        layer["recompute_options"] = options
        if options:
            layer["compiled_kept_bytes"] = {"attn": 5, "attn,mlp-act": 3}
            layer["compiled_time"] = {"fwd_ms": 1.0, "bwd_ms": 2.0, "recompute_ms": {"attn": 0.5}}
    path = tmp_path / f"{source}.json"
    path.write_text(json.dumps(data))
    return path


def test_an_older_analytic_profile_reads_its_attn_as_core_attn(tmp_path):
    profile = io.load_profile(_old_profile(tmp_path, "analytic"))
    block = profile.layers[1]
    assert [o.name for o in block.recompute_options][2:] == ["core-attn", "mlp", "mlp-act", "norm", "save-matmuls",
                                                            "core-attn,mlp-act"]
    assert block.compiled_kept_bytes == {"core-attn": 5, "core-attn,mlp-act": 3}
    assert block.compiled_time.recompute_ms == {"core-attn": 0.5}
    assert profile.schema_version == PROFILE_SCHEMA_VERSION
    io.save_profile(profile, tmp_path / "again.json")
    assert io.load_profile(tmp_path / "again.json") == profile  # written in today's names, read as written
    # a fake or measured profile's attn always was the attention module whole
    measured = io.load_profile(_old_profile(tmp_path, "measured"))
    assert "attn" in [o.name for o in measured.layers[1].recompute_options]


def test_an_older_analytic_plan_reads_its_attn_as_core_attn(tmp_path):
    profile = llm_profile(options=True)
    io.save_profile(profile, tmp_path / "p.json")
    plan = make_plan(profile, tmp_path / "p.json", [5, 5], {"layers.0"})
    plan = plan.model_copy(update={"profile_source": "analytic"})
    data = yaml.safe_load(io.plan_to_yaml(plan))
    data["schema_version"] = 2
    data["stages"][0]["recompute"] = {"layers.0": "full", "layers.1": "attn", "layers.2": "attn,mlp-act"}
    data["baselines"] = [{"name": "b", "feasible": True, "iteration_ms": 1.0, "peak_bytes_per_stage": [1, 1],
                          "stages": [{"index": 0, "layers": ["layers.0"], "recompute": {"layers.0": "attn"}}]}]
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    old = io.load_plan(tmp_path / "old.yaml")
    assert old.schema_version == PLAN_SCHEMA_VERSION
    assert old.stages[0].recompute == {"layers.0": "full", "layers.1": "core-attn", "layers.2": "core-attn,mlp-act"}
    assert old.baselines[0].stages[0].recompute == {"layers.0": "core-attn"}
    # a plan of today's version, or of a measured profile, keeps its attn (the attention module whole)
    for version, source in ((PLAN_SCHEMA_VERSION, "analytic"), (2, "measured")):
        (tmp_path / "plan.yaml").write_text(yaml.safe_dump({**data, "schema_version": version,
                                                            "profile_source": source}, sort_keys=False))
        assert io.load_plan(tmp_path / "plan.yaml").stages[0].recompute["layers.1"] == "attn"
