"""A Megatron-core router's auxiliary load-balancing loss (megatron-core 92c8482e router.py 270-296, 526-538; TE v2.9
csrc/extensions/router.cpp 93-190): the flags read into Arch.router_aux_loss, its bytes by hand on a tiny block, and
E2's FP8 block moved by exactly them at their rates (planner/profiler/te_moe.py, te_moe_eager.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.errors import UserError
from planner.models import archs
from planner.models.configs import megatron
from planner.profiler import analytic_time, te_fused, te_moe, te_moe_eager
from planner.profiler.formulas import Shape
from planner.profiler.membound import membound_ms

ROWS = Path(__file__).resolve().parent.parent / "configs" / "megatron-bridge"
TINY = [("--num-layers", ["2"]), ("--hidden-size", ["64"]), ("--num-attention-heads", ["4"]),
        ("--seq-length", ["512"]), ("--vocab-size", ["256"]), ("--swiglu", []), ("--num-experts", ["8"]),
        ("--moe-router-topk", ["2"]), ("--moe-ffn-hidden-size", ["32"]), ("--disable-bias-linear", [])]


def _said(job, flag: str) -> tuple:
    setting = next(s for s in job.settings if s.name == flag)
    return setting.name, setting.value, setting.status


def test_the_flags_say_whether_the_aux_loss_runs():
    assert not megatron.from_pairs(TINY, "t.sh").arch.router_aux_loss  # Megatron-LM's coefficient default is 0
    coeff = [("--moe-aux-loss-coeff", ["0.001"])]
    assert megatron.from_pairs(TINY + coeff, "t.sh").arch.router_aux_loss  # aux_loss is the default type
    for kind, runs in (("aux_loss", True), ("seq_aux_loss", False), ("none", False)):  # sinkhorn refuses one: below
        job = megatron.from_pairs(TINY + coeff + [("--moe-router-load-balancing-type", [kind])], "t.sh")
        assert job.arch.router_aux_loss is runs
    seq = megatron.from_pairs(TINY + coeff + [("--moe-router-load-balancing-type", ["seq_aux_loss"])], "t.sh")
    assert _said(seq, "--moe-router-load-balancing-type")[2] == "not modelled"
    z = megatron.from_pairs(TINY + [("--moe-z-loss-coeff", ["0.001"])], "t.sh")
    assert _said(z, "--moe-z-loss-coeff")[2] == "not modelled"
    dense = [pair for pair in TINY if pair[0] not in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size")]
    assert _said(megatron.from_pairs(dense + coeff, "t.sh"), "--moe-aux-loss-coeff")[2] == "no effect"
    assert megatron.read(ROWS / "h100_qwen3_30b_fp8cs.yaml").arch.router_aux_loss  # aux_loss, 0.001
    assert _said(megatron.read(ROWS / "h100_qwen3_30b_fp8cs.yaml"), "--moe-aux-loss-coeff")[2] == "modelled"


def test_an_unknown_loss_type_is_refused_in_one_sentence(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                      + " --moe-router-load-balancing-type balanced --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code != 0 and "'balanced' is not one of Megatron-LM's" in result.output
    assert "Traceback" not in result.output


def test_the_aux_loss_bytes_by_hand_on_a_tiny_block():
    """T = 512 tokens, E = 8 experts: TE's kernels 9 B forward (logits 2 read; scores 2, map 1, intermediate 2
    written; scores 2 read) and 8 backward (scores' gradient 2 written; intermediate 2, that gradient 2 read, logits'
    gradient 2 written) per (token, expert); eager the map's sum (1 B, 8 experts' int64 counts) and the logits' two
    gradients' add (6 B)."""
    arch = megatron.from_pairs(TINY, "t.sh").arch
    shape = Shape(seq_len=512, micro_batch_size=1)
    on = dataclasses.replace(arch, router_aux_loss=True)
    TE = 512 * 8
    plain, aux = te_moe.routed_bytes(arch, shape), te_moe.routed_bytes(on, shape)
    assert (aux[0] - plain[0], aux[1] - plain[1]) == (9 * TE, 8 * TE) == (36864, 32768)
    assert te_moe_eager.aux_loss_bytes(arch, shape) == (0, 0)
    assert te_moe_eager.aux_loss_bytes(on, shape) == (TE + 8 * 8, 6 * TE) == (4160, 24576)
    assert te_moe_eager.eager_classes(on, shape)[1]["elementwise"] == 6 * TE


def test_e2s_fp8_block_moves_by_the_aux_loss_at_its_rates():
    job = megatron.read(ROWS / "h100_qwen3_30b_fp8cs.yaml")
    shape = Shape(seq_len=job.seq_len, micro_batch_size=job.micro_batch_size, tp=job.tp, sp=job.sp, cp=job.cp,
                  ep=job.ep)
    gpu = archs.gpu("h100")
    kernels_gpu = te_fused.te_attention_gpu(gpu)

    def record(arch):
        return te_fused.te_time(arch, shape, gpu, analytic_time.block_work(arch, shape, moe=True), moe=True).float8

    TE = 4096 * 128  # MBS 1 x 4,096 tokens, 128 experts
    with_aux, without = record(job.arch), record(dataclasses.replace(job.arch, router_aux_loss=False))
    fwd = membound_ms(9 * TE, kernels_gpu, "fused") + membound_ms(TE + 8 * 128, kernels_gpu, "eager", "elementwise")
    bwd = membound_ms(8 * TE, kernels_gpu, "fused") + membound_ms(6 * TE, kernels_gpu, "eager", "elementwise")
    assert with_aux.fwd_ms - without.fwd_ms == pytest.approx(fwd, rel=1e-9)
    assert with_aux.bwd_ms - without.bwd_ms == pytest.approx(bwd, rel=1e-9)


def test_the_cli_lists_the_z_loss_as_not_modelled(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                      + " --moe-z-loss-coeff 0.001 --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    assert "--moe-z-loss-coeff" in result.output.split("not modelled", 1)[1]
    assert "Traceback" not in result.output


def test_the_router_dtype_is_said_and_fp64_beside_the_fusion_refused(tmp_path):
    # unset: the input's dtype (nothing said); fp32: its tensors over tokens x experts charged at 4 B
    # (tests/test_moe_router_dtype.py); on a dense model no router runs
    assert all(s.name != "--moe-router-dtype" for s in megatron.from_pairs(TINY, "t.sh").settings)
    fp32 = megatron.from_pairs(TINY + [("--moe-router-dtype", ["fp32"])], "t.sh")
    assert _said(fp32, "--moe-router-dtype") == ("--moe-router-dtype", "fp32", "modelled")
    dense = [pair for pair in TINY if pair[0] not in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size")]
    assert _said(megatron.from_pairs(dense + [("--moe-router-dtype", ["fp32"])], "t.sh"),
                 "--moe-router-dtype")[2] == "no effect"
    # fp64 without the fusion runs Megatron's eager top-k: not modelled; beside it TE's fused top-k raises
    fp64 = megatron.from_pairs(TINY + [("--moe-router-dtype", ["fp64"])], "t.sh")
    assert _said(fp64, "--moe-router-dtype")[2] == "not modelled"
    for extra, said in (("--moe-router-dtype fp64 --moe-router-fusion", "raises on float64 logits"),
                        ("--moe-router-dtype bf16", "'bf16' is not one of Megatron-LM's (fp32, fp64)")):
        script = tmp_path / "train.sh"
        script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY)
                          + f" {extra} --micro-batch-size 1 --global-batch-size 8\n")
        result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
        assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("pairs, said", [
    ([("--moe-aux-loss-coeff", ["1e-2x"])], "--moe-aux-loss-coeff '1e-2x' is not a number"),  # argparse's type=float
    ([("--moe-aux-loss-coeff", ["0.01", "0.02"])], "1 load-balancing type(s)"),
    ([("--moe-router-load-balancing-type", ["aux_loss", "seq_aux_loss"]), ("--moe-aux-loss-coeff", ["0.01"])],
     "2 load-balancing type(s) (--moe-router-load-balancing-type, aux_loss if not given) and 1"),
    ([("--moe-router-load-balancing-type", ["aux_loss", "seq_aux_loss"])], "and 1 --moe-aux-loss-coeff value(s)"),
    ([("--moe-router-load-balancing-type", ["sinkhorn"]), ("--moe-aux-loss-coeff", ["0.01"])],
     "Sinkhorn routing asserts the coefficient is 0"),
])
def test_a_coefficient_megatron_refuses_is_refused_in_one_sentence(pairs, said, tmp_path):
    """A coefficient not a float (arguments.py 3292 at 92c8482e), a count other than one a type (transformer_config.py
    1013-1019) or Sinkhorn beside a coefficient (router.py 233) was read as no aux loss, or its first values zipped."""
    with pytest.raises(UserError, match=re.escape(said)):
        megatron.from_pairs(TINY + pairs, "t.sh")
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py " + " ".join(f"{flag} {' '.join(values)}" for flag, values in TINY + pairs)
                      + " --micro-batch-size 1 --global-batch-size 8\n")
    result = CliRunner().invoke(cli, ["evaluate", "--from-megatron", str(script), "--gpus", "8", "--gpu", "h100"])
    assert result.exit_code != 0 and said in result.output and "Traceback" not in result.output


def test_sinkhorn_routing_is_said_not_modelled():
    job = megatron.from_pairs(TINY + [("--moe-router-load-balancing-type", ["sinkhorn"])], "t.sh")
    assert not job.arch.router_aux_loss and _said(job, "--moe-router-load-balancing-type")[2] == "not modelled"
    two = megatron.from_pairs(TINY + [("--moe-router-load-balancing-type", ["aux_loss", "seq_aux_loss"]),
                                      ("--moe-aux-loss-coeff", ["0.01", "0"])], "t.sh")
    assert two.arch.router_aux_loss and _said(two, "--moe-router-load-balancing-type")[2] == "modelled"
