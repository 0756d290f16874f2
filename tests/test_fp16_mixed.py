"""fp16 with a loss scaler as its own precision (planner/cost/runtime_fp16.py): each runtime's record says what
it holds under fp16 (Megatron-LM d98e8a64: fp16 gradient buffers, the step's fp32 copy held past it, the scaler's
pass and all-reduce), a runtime that trains no fp16 refuses it, the readers give it and the exports write it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from export_plans import write

from planner.cli import cli
from planner.cost import bridgeterms, dataparallel, runnable, runtimes
from planner.errors import UserError
from planner.models.configs import megatron, torchtitan
from planner.schema import TrainSetup

ROOT = Path(__file__).resolve().parents[1]
SHAPE = "--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 128"


def setup(precision: str, **fields) -> TrainSetup:
    base = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**50], runtime="megatron")
    return TrainSetup(**(base | fields), precision=precision)


# ---------------------------------------------------------------- bytes and time, by hand


@pytest.mark.parametrize("dp, zero, fp16_bytes, bf16_bytes", [
    # fp16 weight 2 + fp16 main_grad 2 + fp32 master 4 + m 4 + v 4; bf16's main_grad is fp32: 4
    (1, 0, 2 + 2 + 12, 2 + 4 + 12),
    # the distributed optimizer (ZeRO 1) shards the master and moments over DP 2, never the buffer
    (2, 1, 2 + 2 + 12 / 2, 2 + 4 + 12 / 2),
])
def test_megatron_fp16_holds_an_fp16_gradient_buffer_during_the_microbatches(dp, zero, fp16_bytes, bf16_bytes):
    assert dataparallel.bytes_per_param(setup("fp16-mixed", dp=dp, zero=zero)) == fp16_bytes
    assert dataparallel.bytes_per_param(setup("bf16-mixed", dp=dp, zero=zero)) == bf16_bytes


@pytest.mark.parametrize("dp, zero, copy", [(1, 0, 4 * 1000), (2, 1, 4 * 1000 / 2)])
def test_megatron_fp16_steps_an_fp32_copy_of_the_shards_gradients_and_keeps_it(dp, zero, copy):
    """main_param.grad = main_grad.float(): 4 B a parameter of the rank's shard, none under bf16 (the fp32 buffer
    is its own main grad); after the step a 1,000-parameter rank holds 2 B a parameter more than under bf16."""
    fp16, bf16 = setup("fp16-mixed", dp=dp, zero=zero), setup("bf16-mixed", dp=dp, zero=zero)
    assert bridgeterms.step_grad_copy_bytes(1000, fp16) == copy
    assert bridgeterms.step_grad_copy_bytes(1000, bf16) == 0
    after_fp16 = 1000 * dataparallel.bytes_per_param(fp16) + copy
    assert after_fp16 - 1000 * dataparallel.bytes_per_param(bf16) == 1000 * (copy / 1000 - 2)


def test_megatron_fp16_reads_the_scalers_pass_and_all_reduces_its_flag():
    bf16, fp16 = runtimes.of(setup("bf16-mixed").training), runtimes.of(setup("fp16-mixed").training)
    # the copy (2 read, 4 written) and the unscale with its found-inf check (4 read, 4 written) over the shard
    assert fp16.step_shard_bytes - bf16.step_shard_bytes == (2 + 4) + (4 + 4)
    # the DDP's norm check (read) and zeroing (write) of the whole gradient buffer at its fp16 bytes
    assert (bf16.step_whole_bytes, fp16.step_whole_bytes) == (4 + 4, 2 + 2)
    assert [what for what, *_ in fp16.step_collectives if what not in {w for w, *_ in bf16.step_collectives}] == [
        "loss scaler's found-inf"]


def test_deepspeed_without_zero_refuses_fp16_its_fp16_optimizer_not_read():
    refused = runtimes.refused_settings(setup("fp16-mixed", runtime="deepspeed").training)
    assert refused == []  # the setting alone; the stage is the data-parallel check's
    sentence = runnable.data_parallel_refused("deepspeed", None, precision="fp16-mixed", zero=0, dp=8,
                                              shard_group=None, stages=1)
    assert "FP16_Optimizer" in sentence and "--zero 1" in sentence


def test_deepspeed_zero_holds_fp16_as_bf16():
    """DeepSpeed's ZeRO makes every buffer in the parameters' dtype and checks overflow under both."""
    for zero in (1, 3):
        fp16 = setup("fp16-mixed", runtime="deepspeed", dp=8, zero=zero)
        assert dataparallel.bytes_per_param(fp16) == dataparallel.bytes_per_param(
            setup("bf16-mixed", runtime="deepspeed", dp=8, zero=zero))
        assert runtimes.refused_settings(fp16.training) == []


@pytest.mark.parametrize("runtime, version, named", [
    ("ckplan", None, "no gradient scaler"), ("torchtitan", None, "mixed_precision_param"),
    ("colossalai", None, "was not read"), ("deepspeed", "56c52238", "BF16_Optimizer")])
def test_a_runtime_that_trains_no_fp16_refuses_it_saying_why(runtime, version, named):
    refused = runtimes.refused_settings(setup("fp16-mixed", runtime=runtime, runtime_version=version).training)
    assert len(refused) == 1 and f"--runtime {runtime}" in refused[0] and named in refused[0]


# ---------------------------------------------------------------- the command, the readers, the exports


def test_evaluate_refuses_fp16_under_torchtitan_in_one_sentence(tmp_path):
    profile, _, _ = write(tmp_path, [4, 3, 3], set())
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(tmp_path / "llm.json"), "--layers-per-stage",
                                      "4,3,3", "--ckpt-per-stage", "0,0,0", "--microbatches", "3", "--mem", "80GB",
                                      "--precision", "fp16-mixed",
                                      "--runtime", "torchtitan"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "fp16-mixed" in result.output and "torchtitan" in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_megatron_reader_gives_fp16_mixed():
    job = megatron.read(ROOT / "configs/megatron-lm/gpt3_mcore_tp4_pp1_resume_torch_dist.yaml")  # G49's
    assert job.precision == "fp16-mixed"
    assert [s.status for s in job.settings if s.name == "--fp16"] == ["modelled"]


def test_megatron_reader_refuses_bf16_and_fp16_together(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(f"python pretrain_gpt.py --num-layers 2 {SHAPE} --micro-batch-size 1 --global-batch-size 8 "
                    "--bf16 --fp16\n")
    with pytest.raises(UserError, match="--bf16 and --fp16 are both given"):
        megatron.read(path)


def test_torchtitan_reader_refuses_float16(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "debugmodel"\n[training]\nmixed_precision_param = "float16"\n')
    with pytest.raises(UserError, match="takes bfloat16 or float32"):
        torchtitan.read(path)


def test_exports_write_fp16_and_megatron_reads_it_back(tmp_path):
    _, _, plan_path = write(tmp_path, [4, 3, 3], set(), runtime="megatron", precision="fp16-mixed")
    runner = CliRunner()
    out = tmp_path / "args.sh"
    result = runner.invoke(cli, ["export", str(plan_path), "--to", "megatron", "--out", str(out)])
    assert result.exit_code == 0, result.output
    words = shlex.split(out.read_text(), comments=True)
    args = words[words.index("CKPLAN_MEGATRON_ARGS=(") + 1:words.index(")")]
    assert "--fp16" in args and "--bf16" not in args
    # read back as a launch script, with the shape the synthetic profile does not record
    script = tmp_path / "run.sh"
    script.write_text(f"python pretrain_gpt.py {SHAPE} {shlex.join(args)}\n")
    assert megatron.read(script).precision == "fp16-mixed"
    ds = tmp_path / "ds.py"
    # at ZeRO 0 DeepSpeed's fp16 runs FP16_Optimizer, which the record did not read: refused
    result = runner.invoke(cli, ["export", str(plan_path), "--to", "deepspeed", "--out", str(ds)])
    assert result.exit_code != 0 and "FP16_Optimizer" in result.output and "Traceback" not in result.output
    zero1 = tmp_path / "zero1"
    zero1.mkdir()
    _, _, zero1_plan = write(zero1, [4, 3, 3], set(), runtime="deepspeed", precision="fp16-mixed", dp=2, zero=1)
    result = runner.invoke(cli, ["export", str(zero1_plan), "--to", "deepspeed", "--out", str(ds)])
    assert result.exit_code == 0, result.output
    assert '"fp16": {"enabled": True}' in ds.read_text() and '"bf16"' not in ds.read_text()
    result = runner.invoke(cli, ["export", str(plan_path), "--to", "torchtitan", "--out", str(tmp_path / "t.toml")])
    assert result.exit_code != 0 and "fp16-mixed" in result.output and "Traceback" not in result.output
