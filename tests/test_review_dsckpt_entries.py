"""DeepSpeed's activation-checkpointing settings (checkpoint_in_cpu and its kin) are TrainSetup's own check
(planner/schema/setup.py deepspeed_checkpointing_refused): only DeepSpeed's runtime runs them, so every entry
that makes a setup refuses them under another runtime in the same sentence: the CLI's flag, the API's
TrainSetup (and its model_copy), and the config reader, which carries them into the setup it builds."""

from __future__ import annotations

import json

import pytest
from fixtures.cli import run, run_ok
from pydantic import ValidationError

from planner import io
from planner.models.synthetic import uniform_blocks
from planner.schema import TrainSetup

SENTENCE = ("--checkpoint-in-cpu is DeepSpeed's activation-checkpointing setting, and the plan is scored for "
            "{}'s runtime; drop it or give --runtime deepspeed")


def test_the_cli_flag_under_another_runtime_is_refused_in_the_setups_sentence(tmp_path):
    path = tmp_path / "p.json"
    io.save_profile(uniform_blocks(2), path)
    for command in ("solve", "evaluate"):
        args = [command, "--profile", path, "--stages", "1", "--mem", "80GB", "--dp", "2", "--runtime", "torchtitan",
                "--checkpoint-in-cpu"]
        if command == "evaluate":
            args = [arg for arg in args if arg not in ("--stages", "1")] + ["--layers-per-stage", "4",
                                                                          "--ckpt-per-stage", "4"]
        result = run(*args)
        assert result.exit_code != 0, command
        assert result.output.strip() == f"Error: {SENTENCE.format('torchtitan')}", command


def test_the_api_refuses_it_on_construction_and_on_a_copy_to_another_runtime():
    fields = dict(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[1 << 30], dp=8, zero=3)
    with pytest.raises(ValidationError, match="--checkpoint-in-cpu is DeepSpeed's") as raised:
        TrainSetup(**fields, runtime="megatron", checkpoint_in_cpu=True)
    assert str(raised.value.errors()[0]["ctx"]["error"]) == SENTENCE.format("megatron")
    with pytest.raises(ValidationError, match="--partition-activations is DeepSpeed's"):
        TrainSetup(**fields, partition_activations=True)  # the default runtime, ckplan's
    deepspeed = TrainSetup(**fields, runtime="deepspeed", checkpoint_in_cpu=True)
    assert deepspeed.data_parallel.checkpoint_in_cpu
    with pytest.raises(ValidationError, match="scored for torchtitan's runtime"):
        deepspeed.model_copy(update={"runtime": "torchtitan"})


def _megatron_deepspeed(folder, flags: str):
    """A Megatron-DeepSpeed script on one GPU (train_batch_size = the micro-batch: one data-parallel rank)."""
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "fp16": {"enabled": True}, "zero_optimization": {"stage": 1}}
    path = folder / "run.sh"
    path.write_text(f"cat <<EOT > ds.json\n{json.dumps(config)}\nEOT\n"
                    "deepspeed pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
                    "--seq-length 128 --max-position-embeddings 128 --vocab-size 1024 --micro-batch-size 2 "
                    "--global-batch-size 2 --fp16 --checkpoint-activations --deepspeed --deepspeed_config ds.json "
                    f"--deepspeed-activation-checkpointing {flags}\n")
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpu", "a100-80g", "--json").stdout)


def test_the_config_reader_carries_it_into_the_setup_on_one_rank_too(tmp_path):
    # the reader sets --runtime deepspeed wherever it reads the flag (--deepspeed): the setup's check passes, and the
    # setting reaches the cost model; on one data-parallel rank it was said "modelled" and dropped before
    host = _megatron_deepspeed(tmp_path, "--checkpoint-in-cpu")
    kept = _megatron_deepspeed(tmp_path, "")
    assert host["runtime"] == "deepspeed" and host["gpus"] == 1
    assert {s["name"]: s["status"] for s in host["settings"]}["--checkpoint-in-cpu"] == "modelled"
    # the two blocks' inputs (seq 128 x micro-batch 2 x hidden 256 x 2 B = 131,072 B each) on the host, one back on
    # the GPU for its own backward: one input fewer at the peak
    assert kept["ranks"][0]["peak_bytes"] - host["ranks"][0]["peak_bytes"] == 128 * 2 * 256 * 2
