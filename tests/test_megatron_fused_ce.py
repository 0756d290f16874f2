"""Megatron-LM's --cross-entropy-loss-fusion (native) and --moe-grouped-gemm on Transformer Engine's layers
(docs/framework-facts.md §89): the compiled cross-entropy's backward watched as torch's inductor plans it, the loss
region and bytes it is charged, TE's grouped-GEMM workspaces, and the reader taking both flags."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from planner.cost import afterstep, bridgesettings, megatron_loss, runtimes
from planner.cost.terms import Context, stage_value
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import DeviceInfo, FileRef, TrainSetup

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
LOGITS = 64 * 4 * 384 // 2  # a device's logits a microbatch: 64 tokens x 4 sequences, vocabulary 384 over TP 2
H100_LOSS_TBPS = 1.30985  # the analytic profile's loss class rate on H100 (Liger-Kernel's cross-entropy)


def _calculate_gradients(softmax, grad_output, target_mask, masked_target_1d):
    """The ops of Megatron-LM's compiled calculate_gradients (megatron/core/fusions/fused_cross_entropy.py 64-84
    calling tensor_parallel/cross_entropy.py 85-120, ad2ab2ca), rewritten as they run."""
    grad_2d = softmax.view(-1, softmax.size()[-1])
    arange_1d = torch.arange(start=0, end=grad_2d.size()[0], device=grad_2d.device)
    softmax_update = 1.0 - target_mask.view(-1).float()
    grad_2d[arange_1d, masked_target_1d] -= softmax_update
    softmax.mul_(grad_output.unsqueeze(dim=-1))
    return softmax.to(torch.bfloat16)


class _Seen(Exception):
    pass


def _post_grad_graph(fn, *args) -> torch.fx.Graph:
    """The graph inductor lowers for fn(*args), after its post-grad passes (reinplacing included); the
    compile stops there (no kernel is built)."""
    import torch._inductor.compile_fx as compile_fx

    graphs, passes = [], compile_fx.post_grad_passes

    def keep(gm, is_inference):
        passes(gm, is_inference)
        graphs.append(gm.graph)
        raise _Seen

    torch._dynamo.reset()
    with mock.patch.object(compile_fx, "post_grad_passes", keep), pytest.raises(Exception):  # noqa: B017 (dynamo re-raises _Seen wrapped in its own error)
        torch.compile(fn, fullgraph=True)(*args)
    torch._dynamo.reset()
    return graphs[0]


def test_the_compiled_backward_writes_the_softmax_into_a_second_fp32_buffer():
    softmax = torch.rand(8, 2, 384)
    graph = _post_grad_graph(_calculate_gradients, softmax, torch.ones(8, 2), torch.zeros(8, 2, dtype=torch.bool),
                             torch.randint(0, 384, (16,)))
    calls = [node for node in graph.nodes if node.op == "call_function"]
    ops = [node.target for node in calls]
    # the target's -1 stays an out-of-place index_put over the whole softmax (a new fp32 buffer of the logits'
    # size), the multiply reads it, writes the softmax back (copy_) and the bf16 cast: 4 + 4 + 2 B a logit live
    assert ops.count(torch.ops.aten.index_put.default) == 1 and torch.ops.aten.index_put_.default not in ops
    put = next(node for node in calls if node.target == torch.ops.aten.index_put.default)
    base = put.args[0]
    while base.op == "call_function":
        base = base.args[0]
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    assert base is placeholders[0]  # the softmax itself
    copies = [node for node in calls if node.target == torch.ops.aten.copy_.default]
    assert len(copies) == 1 and copies[0].args[0] is placeholders[0]
    casts = [node for node in calls if node.target == torch.ops.prims.convert_element_type.default
             and node.args[1] == torch.bfloat16]
    assert len(casts) == 1


def test_the_rewritten_backward_is_the_cross_entropys_gradient():
    logits = torch.randn(8, 2, 384, dtype=torch.float64)
    target = torch.randint(0, 384, (8, 2))
    grad = _calculate_gradients(torch.softmax(logits, -1).float(), torch.ones(8, 2), torch.zeros(8, 2, dtype=torch.bool),
                                target.view(-1))
    expected = torch.softmax(logits, -1) - torch.nn.functional.one_hot(target, 384)
    assert torch.allclose(grad.double(), expected, atol=1e-2)


def _profile(vocab: int = 384, **moe):
    style = "llama" if moe else "gpt"  # ckplan's experts are SwiGLU (megatron.py refuses GeLU experts)
    arch = archs.Arch(name="tiny-gpt", style=style, hidden_size=256, intermediate_size=1024, num_layers=2, num_heads=8,
                      num_kv_heads=8, vocab_size=vocab, tie_word_embeddings=False, max_position_embeddings=64, **moe)
    return analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=2), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:test", sha256="0" * 64))


def _setup(runtime="megatron", **training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=4, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, dp=2, zero=1, **training)


def test_the_fused_loss_keeps_the_softmax_and_peaks_at_five_logits():
    profile = _profile()
    logits = profile.layers[-1].output_bytes
    assert logits == LOGITS * 2
    unfused = Context(profile, _setup())
    fused = Context(profile, _setup(fused_cross_entropy=True))
    # kept: the fp32 softmax, 2x the bf16 logits, both ways; the backward's peak 2 + 2 + 1 against 2 + 1
    assert stage_value("kept", 0, fused) == stage_value("kept", 0, unfused)
    assert stage_value("extra", 0, fused) - stage_value("extra", 0, unfused) == pytest.approx(2 * logits)


def test_the_fused_loss_moves_40_bytes_a_logit():
    profile = _profile()
    assert megatron_loss.runs_own_ce(profile, _setup(fused_cross_entropy=True)) == LOGITS
    # 40 B a logit at the fused chain's published H100 rate (0.693 of 3.35 TB/s, membound_published.MEGATRON_CE_H100)
    # against the profile's 2 x 2 + 32 at the loss rate; no fills under deterministic mode (not read)
    expected = LOGITS * (40 / (0.693 * 3.35) - 36 / H100_LOSS_TBPS) / 1e12 * 1e3
    for deterministic in (False, True):
        setup = _setup(fused_cross_entropy=True, deterministic=deterministic)
        assert megatron_loss.vocab_parallel_ce_ms(profile, 0, setup) == pytest.approx(expected, rel=1e-9)


def test_the_fused_losses_are_megatrons_and_one_at_a_time():
    titan = runtimes.facts("torchtitan")
    assert titan.fused_cross_entropy is None and not titan.te_grouped_gemm_workspaces
    said = bridgesettings.refused(SimpleNamespace(fused_cross_entropy=True, te_grouped_gemm=True), titan)
    assert len(said) == 2 and all("--runtime megatron" in line for line in said)
    both = SimpleNamespace(fused_cross_entropy=True, te_cross_entropy=True)
    assert bridgesettings.refused(both, runtimes.facts("megatron")) == [
        "the loss is either Megatron-LM's own fused cross-entropy or Transformer Engine's "
        "(--cross-entropy-fusion-impl native or te): give one"]


@pytest.mark.parametrize("name, each", [("NVIDIA H100 80GB HBM3", 32 * MIB + 1024), ("a100-80g", 4 * MIB)])
def test_te_grouped_gemm_keeps_four_more_workspaces(name, each):
    record, device = runtimes.facts("megatron"), DeviceInfo(type="cuda", name=name)
    plain = afterstep.workspace_bytes(record, device, SimpleNamespace(te_grouped_gemm=False))
    assert plain == afterstep.workspace_bytes(record, device) == 2 * 32 * MIB + each
    assert afterstep.workspace_bytes(record, device, SimpleNamespace(te_grouped_gemm=True)) == plain + 4 * each
    assert afterstep.workspace_bytes(record, DeviceInfo(type="cpu", name="cpu"), SimpleNamespace(te_grouped_gemm=True)) == 0


def _read(tmp_path, *changes) -> megatron.Job:
    text = (ROOT / "configs/megatron-lm/gpt3_mcore_te_tp1_pp1_te_4experts_groupedGEMM_op_fuser.yaml").read_text()
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return megatron.read(path)


def test_the_reader_takes_the_grouped_gemm_on_te_layers_with_experts(tmp_path):
    job = _read(tmp_path)
    status = {s.name: s.status for s in job.settings}
    assert status["--moe-grouped-gemm"] == "modelled" and job.modelled.te_grouped_gemm
    local = _read(tmp_path, ("--transformer-impl: transformer_engine", "--transformer-impl: local"))
    assert not local.modelled.te_grouped_gemm


def test_the_reader_takes_the_native_fusion_and_refuses_another_impl(tmp_path):
    job = _read(tmp_path, ("--moe-grouped-gemm: true", "--moe-grouped-gemm: true\n  --cross-entropy-loss-fusion: true"))
    status = {s.name: s.status for s in job.settings}
    assert status["--cross-entropy-loss-fusion"] == "modelled" and job.modelled.fused_cross_entropy
    assert not job.modelled.te_cross_entropy
    from planner.errors import UserError
    with pytest.raises(UserError, match="native and te"):
        _read(tmp_path, ("--moe-grouped-gemm: true", "--moe-grouped-gemm: true\n  --cross-entropy-loss-fusion: true\n"
                                                     "  --cross-entropy-fusion-impl: fused"))
    alone = _read(tmp_path, ("--moe-grouped-gemm: true", "--moe-grouped-gemm: true\n  --cross-entropy-fusion-impl: native"))
    assert {s.name: s.status for s in alone.settings}["--cross-entropy-fusion-impl"] == "no effect"
    assert not alone.modelled.fused_cross_entropy


BIG_VOCAB = 16384  # the logits (256 tokens x 8,192 a rank, 4 MiB in bf16) above every layer's transient: the peak is the loss's


def _evaluate(tmp_path, *extra, **moe):
    from click.testing import CliRunner

    from planner.cli import cli

    path = tmp_path / "tiny.json"
    path.write_text(_profile(BIG_VOCAB, **moe).model_dump_json())
    return CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4", "--ckpt-per-stage",
                                    "0", "--microbatches", "1", "--mem", "80GB", "--precision", "bf16-mixed", "--dp", "2",
                                    "--zero", "1", "--json", *extra])


def test_the_command_line_takes_them_under_megatron_and_refuses_them_elsewhere(tmp_path):
    import json

    def peak(result) -> int:
        assert result.exit_code == 0, result.output
        found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
        return found["hand"]["stages"][0]["peak_bytes"]

    plain = peak(_evaluate(tmp_path, "--runtime", "megatron"))
    # the analytic profile is on an H100: + 2x the bf16 logits at the loss, + 4 TE workspaces of 32 MiB + 1 KiB
    logits_bytes = 64 * 4 * BIG_VOCAB // 2 * 2
    assert peak(_evaluate(tmp_path, "--runtime", "megatron", "--fused-cross-entropy")) == plain + 2 * logits_bytes
    moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 512}
    plain_moe = peak(_evaluate(tmp_path, "--runtime", "megatron", **moe))
    grouped = peak(_evaluate(tmp_path, "--runtime", "megatron", "--te-grouped-gemm", **moe))
    assert grouped == plain_moe + 4 * (32 * MIB + 1024)
    for flag in ("--fused-cross-entropy", "--te-grouped-gemm"):
        refused = _evaluate(tmp_path, "--runtime", "torchtitan", flag, **moe)
        assert refused.exit_code != 0 and "--runtime megatron" in refused.output and "Traceback" not in refused.output
    # a dense model makes no grouped GEMM, and the local layers run none: each refused in one sentence
    dense = _evaluate(tmp_path, "--runtime", "megatron", "--te-grouped-gemm")
    assert dense.exit_code != 0 and "hold none" in dense.output and "Traceback" not in dense.output
    local = _evaluate(tmp_path, "--runtime", "megatron", "--te-grouped-gemm", "--local-layers", **moe)
    assert local.exit_code != 0 and "give one" in local.output and "Traceback" not in local.output


def test_the_export_writes_the_native_fusion():
    from planner.emit.megatron import _test_settings

    assert _test_settings(_setup(fused_cross_entropy=True).training) == ["--cross-entropy-loss-fusion"]
