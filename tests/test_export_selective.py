"""Exports of plans that recompute parts of layers (selective options, planner/runtime/recompute.py):
Megatron-LM says one --recompute-modules list for every decoder layer or block recompute of
whole layers, whichever fits and is faster under the cost model; torchtitan 0.3's policy
checkpoints each layer's parts as the plan says; ColossalAI and DeepSpeed checkpoint whole
layers. Every rounding is re-scored.

The profile: embedding, 8 decoder blocks with options (export_plans.BLOCK_OPTIONS), head.
"""

from __future__ import annotations

import re
import shlex
import sys

import pytest
import torch
from export_plans import llm_profile, write_chunked
from torch import nn

from planner.cost import costmodel
from planner.emit import colossalai, deepspeed, megatron, rounding, torchtitan
from planner.models.configs.megatron_flags import recompute_modules_option

ATTN_EVERYWHERE = {f"layers.{i}": "core-attn" for i in range(8)}
MIXED = {**ATTN_EVERYWHERE, "layers.3": "core-attn,mlp-act", "layers.5": "full", "layers.6": "save-matmuls"}


def _write(tmp_path, recompute, *, source="analytic", kind="Block", **kwargs):
    return write_chunked(tmp_path, [3, 2, 2, 3], recompute, profile=llm_profile(options=True, kind=kind),
                         schedule="interleaved-1F1B", profile_source=source, **kwargs)


def _flags(text: str) -> dict:
    return dict(re.findall(r"^\s+(--[\w-]+)(?: (.+))?$", text, flags=re.M))


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_module_lists_as_ckplan_options():
    assert megatron._said("core-attn,mlp-act", moe=False) == {"core_attn"}  # a dense MLP's activation: none
    assert megatron._said("core-attn,mlp-act", moe=True) == {"core_attn", "moe_act"}
    assert megatron._said("attn", moe=False) == set()  # the whole attention module: no module list says it
    assert megatron._said("attn,mlp", moe=False) == {"mlp"}
    assert megatron._said("mlp", moe=False) == {"mlp"}
    assert megatron._said("mlp", moe=True) == {"moe"}
    assert megatron._said("save-matmuls", moe=False) == set()
    assert recompute_modules_option(("core_attn", "moe_act", "layernorm"), moe=True) == "core-attn,mlp-act,norm-out"
    assert recompute_modules_option(("core_attn", "moe_act"), moe=False) == "core-attn"
    assert recompute_modules_option(("moe",), moe=False) == "none"


def test_megatron_says_the_plans_attention_recompute_with_core_attn(tmp_path):
    profile, plan, path = _write(tmp_path, ATTN_EVERYWHERE)
    result = megatron.export(plan, profile, plan_file=str(path))
    flags = _flags(result.text)
    assert (flags["--recompute-granularity"], flags["--recompute-modules"]) == ("selective", "core_attn")
    assert "--recompute-method" not in flags and "--recompute-num-layers" not in flags
    # every decoder layer recomputes attn: the plan exactly, its rounding scored as such
    assert result.rounded.ranks() == [r.model_copy(update={"predicted": None}) for r in plan.stages]
    assert result.scored.rounded == costmodel.evaluate(plan.stages, profile, result.rounded.setup)
    assert any("chosen over block recompute (--recompute-num-layers 2" in c for c in result.rounded.changes)


def test_megatron_rounds_a_mixed_plan_to_the_fastest_setting_that_fits(tmp_path):
    profile, plan, path = _write(tmp_path, MIXED)
    result = megatron.export(plan, profile, plan_file=str(path))
    # the candidates: block recompute of whole layers (N = 2, the largest count) or core_attn everywhere
    roles = rounding.llm_roles(profile)
    attn = [s.with_recompute({n: "core-attn" for n in rounding.decoder_layers(s, roles)})
            for s in costmodel.pipeline_stages(plan.stages, plan.setup)]
    setup = result.rounded.setup
    selective_ms = costmodel.evaluate(costmodel.ranks_of(attn, setup), profile, setup).iteration_ms
    assert result.scored.rounded.iteration_ms == selective_ms
    assert "--recompute-modules core_attn" in result.text
    assert any("options core-attn, core-attn,mlp-act, full, save-matmuls become core-attn" in c
               for c in result.rounded.changes)


def test_megatron_keeps_block_recompute_when_selective_does_not_fit(tmp_path):
    every = {f"layers.{i}": "full" for i in range(8)}
    profile, plan, path = _write(tmp_path, ATTN_EVERYWHERE)
    attn_mib = max(megatron.export(plan, profile, plan_file=str(path)).scored.rounded.peak_bytes_per_stage) / 2**20
    profile, plan, path = _write(tmp_path, every)
    block_mib = max(megatron.export(plan, profile, plan_file=str(path)).scored.rounded.peak_bytes_per_stage) / 2**20
    assert block_mib < attn_mib
    # a cap between: core_attn everywhere no longer fits, block recompute of every layer does
    profile, plan, path = _write(tmp_path, every | {"layers.0": "core-attn"}, cap_mib=(block_mib + attn_mib) / 2)
    result = megatron.export(plan, profile, plan_file=str(path))
    flags = _flags(result.text)
    assert flags["--recompute-granularity"] == "full" and flags["--recompute-num-layers"] == "2"
    assert result.scored.rounded.feasible and "--recompute-modules" not in flags
    assert any("the 1 layers the plan recomputes selectively (core-attn) recompute whole layers" in c
               for c in result.rounded.changes)


def test_megatron_moe_layers_say_moe_act(tmp_path):
    recompute = {f"layers.{i}": "mlp-act" for i in range(8)}
    profile, plan, path = _write(tmp_path, recompute, kind="moe_block")
    assert "--recompute-modules moe_act" in megatron.export(plan, profile, plan_file=str(path)).text
    dense, plan, path = _write(tmp_path, recompute)  # a dense MLP's activation alone: no module says it
    flags = _flags(megatron.export(plan, dense, plan_file=str(path)).text)
    assert flags["--recompute-granularity"] == "full" and "--recompute-modules" not in flags


def test_megatron_core_takes_the_selective_flags(tmp_path):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    profile, plan, path = _write(tmp_path, ATTN_EVERYWHERE)
    flags = _flags(megatron.export(plan, profile, plan_file=str(path)).text)
    config = TransformerConfig(
        num_layers=8, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=2,
        pipeline_dtype=torch.bfloat16,
        pipeline_model_parallel_layout=shlex.split(flags["--pipeline-model-parallel-layout"])[0],
        recompute_granularity=flags["--recompute-granularity"], recompute_modules=flags["--recompute-modules"].split())
    assert config.recompute_modules == ["core_attn"] and config.recompute_num_layers is None


# ---------------------------------------------------------------- torchtitan


class _InnerAttention(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Attention(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.inner_attention = _InnerAttention()

    def forward(self, x):
        q, k, v = (w(x).unflatten(-1, (2, -1)).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        return self.wo(self.inner_attention(q, k, v).transpose(1, 2).flatten(-2))


class _FeedForward(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, 16, bias=False), nn.Linear(16, dim, bias=False), \
            nn.Linear(dim, 16, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class _Block(nn.Module):
    """torchtitan's llama3 TransformerBlock's submodules and names."""

    def __init__(self):
        super().__init__()
        self.attention, self.feed_forward = _Attention(), _FeedForward()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(8), nn.RMSNorm(8)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): _Block() for i in range(8)})

    def forward(self, x):
        for block in self.layers.values():
            x = block(x)
        return x


def _wrapped(model) -> dict[str, list[str]]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return {layer_id: [name.replace("._checkpoint_wrapped_module", "") or "(block)"
                       for name, m in block.named_modules() if isinstance(m, CheckpointWrapper)]
            for layer_id, block in model.layers.items()}


def test_torchtitan_checkpoints_each_layers_parts_as_the_plan_says(tmp_path):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from test_export_frameworks import _load_titan_export

    recompute = {name: option for name, option in (MIXED | {"layers.7": "norm", "layers.1": "mlp", "layers.2": "attn"}).items()
                 if name != "layers.4"}
    profile, plan, path = _write(tmp_path, recompute, runtime="torchtitan")
    result = torchtitan.export(plan, profile, plan_file=str(path), base="ckplan_base:base")
    assert result.rounded.changes == [] and result.scored.rounded == result.scored.exact  # the plan exactly
    module = _load_titan_export(tmp_path, result.text)
    ac = module.ckplan_config().activation_checkpoint
    assert ac.layers == ["layers.5"] and ac.selective["layers.6"] == "save-matmuls"
    torch.manual_seed(0)
    model, reference = _Model(), _Model()
    reference.load_state_dict(model.state_dict())
    ac.build().apply(model)
    assert _wrapped(model) == {
        "0": ["attention.inner_attention"], "1": ["feed_forward"], "2": ["attention"],
        "3": ["attention.inner_attention", "feed_forward"], "4": [], "5": ["(block)"], "6": ["(block)"],
        "7": ["attention_norm", "ffn_norm"]}
    x = torch.randn(2, 4, 8)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_torchtitan_writes_core_attn_as_the_kernel_and_attn_as_the_attention_submodule(tmp_path):
    """The policy's parts by name, whatever profile the plan was made from: core-attn the kernel
    (inner_attention), attn the attention module whole."""
    for source in ("analytic", "measured"):
        profile, plan, path = _write(tmp_path, ATTN_EVERYWHERE | {"layers.1": "attn"}, source=source)
        text = torchtitan.export(plan, profile, plan_file=str(path), base="m:f").text
        assert 'PARTS = {"core-attn": ["attention.inner_attention"], "attn": ["attention"]' in text
        assert "'layers.0': 'core-attn'" in text and "'layers.1': 'attn'" in text


def test_torchtitan_cli_keeps_the_selective_policy(tmp_path, monkeypatch):
    pytest.importorskip("torchtitan")
    tyro = pytest.importorskip("tyro")
    from dataclasses import field, make_dataclass

    from test_export_frameworks import _load_titan_export
    from torchtitan.distributed.activation_checkpoint import (
        ActivationCheckpointingConfig,
        SelectiveAC,
    )

    profile, plan, path = _write(tmp_path, MIXED)
    module = _load_titan_export(tmp_path, torchtitan.export(plan, profile, plan_file=str(path),
                                                            base="ckplan_base:base").text)
    monkeypatch.setitem(sys.modules, "ckplan_titan", module)  # as torchtitan imports it (--module): tyro reads its source
    loaded = module.ckplan_config().activation_checkpoint
    Job = make_dataclass("Job", [("activation_checkpoint", ActivationCheckpointingConfig,
                                  field(default_factory=SelectiveAC.Config))], kw_only=True)
    parsed = tyro.cli(Job, args=[], default=Job(activation_checkpoint=loaded))
    assert type(parsed.activation_checkpoint) is module.CkplanAC.Config
    assert parsed.activation_checkpoint.selective == loaded.selective


def test_torchtitan_0_2_rounds_selective_to_whole_layers(tmp_path):
    profile, plan, path = _write(tmp_path, MIXED)
    result = torchtitan.export(plan, profile, plan_file=str(path), version="0.2.2")
    assert any("recompute whole layers" in c for c in result.rounded.changes)


# ---------------------------------------------------------------- whole layers only


@pytest.mark.parametrize("module", [colossalai, deepspeed])
def test_colossalai_and_deepspeed_recompute_whole_layers(tmp_path, module):
    profile, plan, path = _write(tmp_path, MIXED)
    result = module.export(plan, profile, plan_file=str(path))
    assert any("the 7 layers the plan recomputes selectively" in c for c in result.rounded.changes)
    assert all(stage.recompute == dict.fromkeys(stage.checkpointed, "full") for stage in result.rounded.stages)
    assert result.scored.rounded == costmodel.evaluate(result.rounded.ranks(), profile, result.rounded.setup)
