"""The router's dtypes as Megatron-core and Transformer Engine run them: `--moe-router-dtype fp32` charged in time and
memory (Arch.router_dtype_bytes; megatron-core 92c8482e router.py 78-101, TE v2.9 router.cpp 42-47), and TE v2.13 on's
fp32 router intermediates charged where the runtime's record says so (RuntimeFacts.te_router_scores), the MoE
block's TE record carrying what they add beside v2.9's (docs/framework-facts.md §543, §588). Counted by hand on a
tiny block: T = 512 tokens, E = 8 experts, top 2 (S = 1,024 routed copies)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.cost import fusedkernels, runtime_megatron, te_moe_kept
from planner.cost.float8 import float8_profile
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic, te_fused, te_moe, te_moe_eager
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms
from planner.schema import OPTION_FULL, FileRef, TrainSetup

TINY = [("--num-layers", ["2"]), ("--hidden-size", ["64"]), ("--num-attention-heads", ["4"]),
        ("--seq-length", ["512"]), ("--vocab-size", ["256"]), ("--swiglu", []), ("--num-experts", ["8"]),
        ("--moe-router-topk", ["2"]), ("--moe-ffn-hidden-size", ["32"]), ("--disable-bias-linear", [])]
SHAPE = Shape(seq_len=512, micro_batch_size=1)
TE, S = 512 * 8, 512 * 2
H100 = archs.gpu("h100")


def _arch(*extra):
    return megatron.from_pairs(TINY + list(extra), "t.sh").arch


def test_fp32_sets_the_routers_element_size_and_says_it_modelled():
    assert _arch().router_dtype_bytes == 0  # the input's dtype
    fp32 = megatron.from_pairs(TINY + [("--moe-router-dtype", ["fp32"])], "t.sh")
    assert fp32.arch.router_dtype_bytes == 4
    said = next(s for s in fp32.settings if s.name == "--moe-router-dtype")
    assert said.status == "modelled"
    # fp64 without the fusion: Megatron's eager top-k, not TE's kernels: listed, not charged
    fp64 = megatron.from_pairs(TINY + [("--moe-router-dtype", ["fp64"])], "t.sh")
    assert fp64.arch.router_dtype_bytes == 0
    assert next(s for s in fp64.settings if s.name == "--moe-router-dtype").status == "not modelled"


def test_fp32_logits_by_hand():
    """The fused top-k 7 -> 13 B a (token, expert) each way (logits, probs, intermediate and gradients 2 -> 4 B);
    the probabilities permute reads (T E) and writes (S), the weighted activation's weight (S) forward; backward
    the permuted probabilities' gradient read (S) and written back (T E), the weight read and its gradient written
    (2 S): +8 TE + 4 S forward, +8 TE + 6 S backward; with EP 2 (4 local experts) the sort and unsort carry the
    probabilities too, +2 x 2 x 2 S a way."""
    bf16, fp32 = _arch(), _arch(("--moe-router-dtype", ["fp32"]))
    before, after = te_moe.routed_bytes(bf16, SHAPE), te_moe.routed_bytes(fp32, SHAPE)
    assert (after[0] - before[0], after[1] - before[1]) == (8 * TE + 4 * S, 8 * TE + 6 * S) == (36864, 38912)
    ep = dataclasses.replace(SHAPE, ep=2)
    before, after = te_moe.routed_bytes(bf16, ep), te_moe.routed_bytes(fp32, ep)
    assert (after[0] - before[0], after[1] - before[1]) == (8 * TE + 12 * S, 8 * TE + 14 * S)
    # the aux loss's kernels (9 / 8 B in bf16) at 17 / 16, and the eager add of the logits' two gradients 6 -> 12 B
    aux, aux32 = dataclasses.replace(bf16, router_aux_loss=True), dataclasses.replace(fp32, router_aux_loss=True)
    assert te_moe.router_elements(aux) == (7 + 9, 7 + 8) and te_moe.router_elements(aux32) == (13 + 17, 13 + 16)
    assert te_moe_eager.aux_loss_bytes(aux32, SHAPE)[1] - te_moe_eager.aux_loss_bytes(aux, SHAPE)[1] == 6 * TE


def test_te_213s_fp32_intermediates_by_hand():
    """TE v2.13 on: the top-k's intermediate 2 -> 4 B written and read (+2 TE each way); the aux loss's scores and
    intermediate 2 -> 4 B (forward: both written and the scores read again, +6 TE; backward: the scores' gradient
    written and read and the intermediate read, +6 TE). Nothing more where the logits are fp32 already."""
    bf16 = _arch()
    assert te_moe.fp32_scores_bytes(bf16, SHAPE) == (2 * TE, 2 * TE)
    assert te_moe.fp32_scores_bytes(dataclasses.replace(bf16, router_aux_loss=True), SHAPE) == (8 * TE, 8 * TE)
    assert te_moe.fp32_scores_bytes(_arch(("--moe-router-dtype", ["fp32"])), SHAPE) == (0, 0)
    assert te_moe.router_elements(bf16, scores="fp32") == (9, 9)  # framework-facts §543's 9 B each way


def _profile(arch):
    return analytic.analytic_profile(arch, SHAPE, gpu=H100, model=FileRef(file="arch:test", sha256="0" * 64))


def test_the_record_carries_v213s_time_and_the_cost_model_charges_it_by_the_runtimes_te():
    arch = dataclasses.replace(_arch(), name="tiny-router-dtype")
    kernels_gpu = te_fused.te_attention_gpu(H100)
    fwd, bwd = membound_ms(2 * TE, kernels_gpu, "fused"), membound_ms(2 * TE, kernels_gpu, "fused")
    profile = _profile(arch)
    blocks = [layer for layer in profile.layers if layer.kind == "moe_block"]
    assert blocks and all(layer.te_time.fp32_scores_fwd_ms == pytest.approx(fwd, rel=1e-12) for layer in blocks)
    assert all(layer.te_time.fp32_scores_bwd_ms == pytest.approx(bwd, rel=1e-12) for layer in blocks)
    v29 = fusedkernels.fused_profile(profile, "transformer-engine")
    v213 = fusedkernels.fused_profile(profile, "transformer-engine", router_scores="fp32")
    for old, new in zip(v29.layers, v213.layers, strict=True):
        if old.kind != "moe_block":
            assert new == old
            continue
        assert new.fwd_ms - old.fwd_ms == pytest.approx(fwd, rel=1e-9)
        assert new.bwd_ms - old.bwd_ms == pytest.approx(bwd, rel=1e-9)
        assert new.recompute_ms - old.recompute_ms == pytest.approx(fwd, rel=1e-9)  # the full rerun runs the router
        rerun = {o.name: o.recompute_ms for o in old.recompute_options}
        for option in new.recompute_options:  # a rerun on TE's kernels that runs the router (not `attn`'s eager ones)
            parts = option.name.split(",")
            moved = fwd if option.name == OPTION_FULL or "mlp" in parts and "attn" not in parts else 0.0
            assert option.recompute_ms - rerun[option.name] == pytest.approx(moved, abs=1e-12)
    # through the runtime records: d98e8a64's TE (4329ff84, fp32) against the Bridge's v2.9 (the logits' dtype)
    times = {}
    for version in (runtime_megatron.BRIDGE_MCORE, None):
        setup = TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50],
                           precision="bf16-mixed", runtime="megatron", runtime_version=version)
        times[version] = [layer.fwd_ms for layer in float8_profile(profile, setup).layers if layer.kind == "moe_block"]
    assert [new - old for old, new in zip(times[runtime_megatron.BRIDGE_MCORE], times[None])] == pytest.approx(
        [fwd] * len(blocks), rel=1e-9)


def test_fp32_logits_kept_by_hand():
    """Megatron-core keeps the top-k's intermediate (T x E) in the logits' dtype under TE v2.9 and the permuted
    probabilities (S) as they come: fp32 logits keep 2 TE + 2 S more under the Bridge's record; under d98e8a64's
    (fp32 intermediates already) 2 S more."""
    bf16, fp32 = (_profile(dataclasses.replace(_arch(*extra), name=name))
                  for extra, name in (((), "tiny-bf16-router"), ((("--moe-router-dtype", ["fp32"]),), "tiny-fp32-router")))
    for record, more in ((runtime_megatron.megatron_bridge(), 2 * TE + 2 * S), (runtime_megatron.megatron(), 2 * S)):
        assert sum(te_moe_kept.mixtures(fp32, record)["mcore"]) - sum(te_moe_kept.mixtures(bf16, record)["mcore"]) \
            == more


def test_the_cli_scores_a_file_with_fp32_router(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                      + " --moe-router-dtype fp32 --moe-router-fusion --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    modelled = next(line for line in result.output.splitlines() if line.startswith("modelled ("))
    assert "--moe-router-dtype" in modelled and "Traceback" not in result.output


def test_search_compares_a_file_with_fp32_router_as_the_same_model(tmp_path):
    """`search --from-megatron` scores a file against the searched built-in: the router's dtype is how the job runs
    it, not the model (as its aux loss), so Mixtral's shipped script with --moe-router-dtype fp32 is still Mixtral,
    scored in the searched model's dtype and said."""
    from pathlib import Path

    from planner.commands.search_compare import from_framework_job

    shipped = Path(__file__).parents[1] / "configs" / "megatron-lm" / "mixtral_8x7b_distributed.sh"
    script = tmp_path / "mixtral.sh"
    script.write_text(shipped.read_text().replace("--moe-router-topk 2", "--moe-router-topk 2 --moe-router-dtype fp32"))
    job = megatron.read(script)
    assert job.arch.router_dtype_bytes == 4
    record = from_framework_job(job, arch=archs.arch("mixtral-8x7b"), gpu="h100", seq_len=4096)
    assert record.arch == "mixtral-8x7b" and "--moe-router-dtype fp32" in record.not_expressible
