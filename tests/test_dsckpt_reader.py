"""Megatron-DeepSpeed's checkpointing flags read for DeepSpeed (planner/models/configs/megatron_deepspeed.py
_checkpointing; framework-facts §133): modelled under --deepspeed-activation-checkpointing, no effect without it
(Megatron's own checkpoint runs), the ds_config's activation_checkpointing block said to have no effect (Megatron-
DeepSpeed's configure passes no deepspeed_config)."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.cli import run_ok

MODEL = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--vocab-size 1024 --micro-batch-size 2 --global-batch-size 16 --fp16 --checkpoint-activations")
Z3 = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "fp16": {"enabled": True},
      "zero_optimization": {"stage": 3}, "activation_checkpointing": {"cpu_checkpointing": True}}


def _evaluate(folder: Path, flags: str) -> dict:
    path = folder / "run.sh"
    path.write_text(f"cat <<EOT > ds.json\n{json.dumps(Z3)}\nEOT\n"
                    f"deepspeed pretrain_gpt.py {MODEL} --deepspeed --deepspeed_config ds.json {flags}\n")
    return json.loads(run_ok("evaluate", "--from-megatron", path, "--gpu", "a100-80g", "--json").stdout)


def test_the_flags_are_modelled_under_deepspeeds_checkpointing_and_the_block_has_no_effect(tmp_path):
    found = _evaluate(tmp_path, "--deepspeed-activation-checkpointing --checkpoint-in-cpu --partition-activations "
                                "--contigious-checkpointing --synchronize-each-layer --profile-backward")
    said = {s["name"]: s["status"] for s in found["settings"]}
    assert all(said[flag] == "modelled" for flag in ("--checkpoint-in-cpu", "--partition-activations",
                                                     "--contigious-checkpointing", "--synchronize-each-layer"))
    assert said["--profile-backward"] == "no effect"
    assert said["ds_config activation_checkpointing"] == "no effect"
    plain = _evaluate(tmp_path, "--deepspeed-activation-checkpointing")
    # the two blocks' inputs (128 x 2 x 256 x 2 B) off the GPU, one back for its own backward
    assert plain["ranks"][0]["peak_bytes"] > found["ranks"][0]["peak_bytes"]


def test_without_deepspeeds_checkpointing_the_flags_do_nothing(tmp_path):
    found = _evaluate(tmp_path, "--checkpoint-in-cpu")
    said = {s["name"]: s["status"] for s in found["settings"]}
    assert said["--checkpoint-in-cpu"] == "no effect"
    assert found["ranks"][0]["peak_bytes"] == _evaluate(tmp_path, "")["ranks"][0]["peak_bytes"]
