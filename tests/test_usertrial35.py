"""Defects a user trial found on models and configs no other test used (docs/published-runs.md §35.usertrial):
each a CliRunner run of what a user types, with the figure or sentence it must give."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from fixtures.cli import run, run_ok

TITAN_QWEN3 = Path(__file__).parent / "fixtures" / "configs" / "torchtitan_qwen3_32b.toml"

# Mistral-NeMo's shape at toy widths: head_dim (64) x heads (8) is not hidden_size (512)
NEMO = {"model_type": "mistral", "hidden_size": 512, "intermediate_size": 1792, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}


def _nemo_profile(tmp_path):
    config = tmp_path / "nemo.json"
    config.write_text(json.dumps(NEMO))
    profile = tmp_path / "p.json"
    run_ok("profile", "--arch-config", config, "--seq-len", "1024", "--gpu", "h100", "--out", profile)
    return profile


def _smallest_cap_mib(output: str) -> float:
    found = re.search(r"the smallest cap that works with \d+ stages is ([0-9.]+) (MiB|GiB)", " ".join(output.split()))
    assert found, output
    return float(found.group(1)) * (1024 if found.group(2) == "GiB" else 1)


def test_the_smallest_cap_solve_names_is_one_solve_plans_under(tmp_path):
    """Mistral-NeMo-12B at 4 stages under --mem 80GB: "stage 1 needs 74.5 GiB ... against its cap of 74.5 GiB, -0%
    over; the smallest cap that works with 4 stages is 74.5 GiB", and 81GB still had no plan (82GB had). The
    least-memory plan's stage was sized by its replayed reserve, while the solvers hold its allocated peak within
    the cap less the buffers and the divisor's reserve; and of stages that all needed more than a tiny cap
    admits, the first was named, not the one needing most. At toy widths on 4 stages under 100 MiB it named stage
    0's 488 MiB, where stage 1 needs more than its 768 MiB of NCCL buffers alone. The cap named now plans, and
    one 2 MiB segment less does not."""
    profile = _nemo_profile(tmp_path)
    plan = tmp_path / "plan.yaml"
    refused = run("solve", "--profile", profile, "--stages", "4", "--mem", "100MiB", "--out", plan)
    assert refused.exit_code != 0
    smallest = _smallest_cap_mib(refused.output)
    assert smallest > 768, refused.output
    run_ok("solve", "--profile", profile, "--stages", "4", "--mem", f"{smallest}MiB", "--out", plan)


def test_a_stage_the_replay_judges_needs_its_replayed_reserve_and_one_the_divisor_judges_the_row():
    """Where the allocator replay judges a stage, the cap it needs is its replayed reserve with the buffers and the
    margin, 73 GiB + 768 MiB + 4 KiB, though the divisor's row would ask more: solve searches under rows that admit
    every plan the replay admits (planner/solve/replayfit.py, §37.solvefit), so that cap plans. Where the divisor
    judges it, by hand: an allocated peak of 63 GiB with the 4 KiB fit margin, at the divisor's 15%, reserves
    ceil((63 GiB + 4 KiB) / 0.85 / 2 MiB) = 37,949 segments of 2 MiB; with 768 MiB of NCCL buffers the cap must
    hold 37,949 x 2 MiB + 768 MiB."""
    from planner.cost.assembly import StageCost
    from planner.solve.search import cap_needed_bytes

    gib, mib = 2**30, 2**20
    stage = StageCost(static_bytes=0, kept_bytes=0, in_flight=1, activation_bytes=0, buffer_bytes=0,
                      transient_bytes=0, peak_bytes=63 * gib, time_ms=1.0, cap_bytes=80 * gib,
                      reserved_bytes=73 * gib, reserved_by="replay", workspace_bytes=768 * mib)
    assert cap_needed_bytes(stage, 0.15) == 73 * gib + 768 * mib + 4096
    roomy = dataclasses.replace(stage, reserved_bytes=78 * gib)  # a replay reserving more than the divisor
    assert cap_needed_bytes(roomy, 0.15) == 78 * gib + 768 * mib + 4096
    assert -(-(63 * gib + 4096) * 100 // 85 // (2 * mib)) == 37_949
    divisor = dataclasses.replace(stage, reserved_bytes=37_949 * 2 * mib, reserved_by="divisor")
    assert cap_needed_bytes(divisor, 0.15) == 37_949 * 2 * mib + 768 * mib + 4096
    cpu = dataclasses.replace(stage, reserved_bytes=None, reserved_by=None, workspace_bytes=0)
    assert cap_needed_bytes(cpu, 0.15) == 63 * gib + 4096


QWEN_SCRIPT = """#!/bin/bash
# a user's launch: the tokenizer from the Hub, so no --vocab-size
TP=${TP:-4}
MODEL_ARGS=(
    --num-layers 2 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 4
    --group-query-attention --num-query-groups 2 --seq-length 512 --max-position-embeddings 512
    --swiglu --add-qkv-bias --disable-bias-linear --untie-embeddings-and-output-weights
)
torchrun --nproc_per_node 8 pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    --tensor-model-parallel-size $TP --micro-batch-size 1 --global-batch-size 16 --bf16 \\
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model Qwen/Qwen2.5-14B
"""


def test_a_megatron_script_without_its_vocabulary_is_told_where_the_flag_goes(tmp_path):
    """A Qwen2.5 launch taking its tokenizer from the Hub was refused with "add --vocab-size N"; a user who added
    it to ckplan's command line got "No such option '--vocab-size'". The sentence says it goes in the script's
    arguments, and there it is read (151,665 padded to 152,064 at TP 4, as Megatron-LM pads)."""
    script = tmp_path / "train_qwen.sh"
    script.write_text(QWEN_SCRIPT)
    refused = run("evaluate", "--from-megatron", script, "--gpu", "h100")
    said = " ".join(refused.output.split())
    assert refused.exit_code != 0 and "add --vocab-size N to its arguments (ckplan itself takes no --vocab-size)" in said
    script.write_text(QWEN_SCRIPT.replace("--seq-length 512", "--seq-length 512 --vocab-size 151665"))
    scored = run_ok("evaluate", "--from-megatron", script, "--gpu", "h100")
    assert "vocabulary 151665 padded to 152064" in " ".join(scored.output.split())


def test_a_script_running_another_trainer_is_told_which_line_runs_what(tmp_path):
    """Megatron-LM d98e8a64's examples/multimodal/pretrain_mistral_clip.sh runs `torchrun --nproc_per_node 8
    examples/multimodal/train.py ${OPTIONS}` (a LLaVA trainer): ckplan said only that no line runs a trainer,
    though one does. It now names the line and the file it runs; a file that runs none keeps the sentence."""
    path = tmp_path / "pretrain_mistral_clip.sh"
    path.write_text('OPTIONS=" \\\n    --num-layers 32 \\\n    --hidden-size 4096"\n\n'
                    "torchrun --nproc_per_node 8 examples/multimodal/train.py ${OPTIONS}\n")
    said = " ".join(run("evaluate", "--from-megatron", path, "--gpu", "h100").output.split())
    assert ("no line runs a Megatron-LM trainer (pretrain_gpt.py or another pretrain_*.py): line 5 runs "
            "examples/multimodal/train.py, which ckplan does not read; give the script") in said, said
    path.write_text("MLM_MODEL_CFG=(\n    --num-layers 28\n)\n")
    said = " ".join(run("evaluate", "--from-megatron", path, "--gpu", "h100").output.split())
    assert "pretrain_*.py); give the script that launches training" in said, said


def test_a_scripts_environment_defaults_are_said_not_taken_silently(tmp_path):
    """A user's launch reads `TP=${TP:-4}` and runs as `TP=2 bash train.sh`: ckplan scored TP 4 and said nothing of
    reading the default (the environment is never read). The variables read at their defaults are now named with
    the values taken, positional parameters too; one the file sets is not."""
    script = tmp_path / "train_qwen.sh"
    script.write_text(QWEN_SCRIPT.replace("--seq-length 512", "--seq-length 512 --vocab-size 151665")
                      .replace("--bf16", "--bf16 --save ${1:-ckpt} --lr ${LR:-1e-4}"))
    said = " ".join(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100").output.split())
    assert ("read at the script's defaults, its environment and arguments unknown to ckplan: TP=4, $1=ckpt, LR=1e-4; "
            "set them in the file to score other values") in said, said
    script.write_text(script.read_text().replace("TP=${TP:-4}", "TP=4\nTP=${TP:-2}").replace("${1:-ckpt}", "ckpt")
                      .replace("${LR:-1e-4}", "1e-4"))
    assert "read at the script's defaults" not in run_ok("evaluate", "--from-megatron", script, "--gpu", "h100").output


def test_a_gpu_named_as_sold_is_pointed_to_ckplans_name():
    """The torchtitan qwen3_32b.toml says "a preset for 8 H100 GPUs (with 96GiB memory)"; `--gpu h100-96gb` (and
    a100-80gb) got the list of every name, where ckplan's are h100-96g and a100-80g. The nearest name is offered;
    a GPU ckplan does not know at all still gets the list alone."""
    said = " ".join(run("evaluate", "--from-torchtitan", TITAN_QWEN3, "--gpus", "8", "--gpu", "h100-96gb").output.split())
    assert "unknown --gpu 'h100-96gb'; did you mean h100-96g? choose one of h100-sxm," in said, said
    said = " ".join(run("profile", "--arch", "llama3-8b", "--seq-len", "8", "--gpu", "A100-80GB").output.split())
    assert "unknown --gpu 'A100-80GB'; did you mean a100-80g?" in said, said
    said = " ".join(run("profile", "--arch", "llama3-8b", "--seq-len", "8", "--gpu", "rtx4090").output.split())
    assert "unknown --gpu 'rtx4090'; choose one of" in said, said


def test_a_torchtitan_base_of_another_model_is_refused_for_every_flavor_ckplan_reads(tmp_path):
    """Qwen2.5-14B's plan exported with `--torchtitan-base ...qwen3.config_registry:qwen3_14b` was written, not
    refused: the check knew six of torchtitan's config functions, not qwen3_14b (nor 0_6b, 1_7b, 32b, gpt_oss_20b,
    120b), whose flavors evaluate --from-torchtitan reads as ckplan's built-ins. A plan of qwen3_14b's depth (40)
    and other widths is now refused, naming what differs."""
    config = tmp_path / "qwen2.json"
    config.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 40, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 1024, "tie_word_embeddings": False}))
    profile, plan = tmp_path / "p.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch-config", config, "--seq-len", "64", "--gpu", "h100", "--out", profile)
    run_ok("solve", "--profile", profile, "--stages", "1", "--mem", "80GB", "--runtime", "torchtitan", "--out", plan)
    base = "torchtitan.models.qwen3.config_registry:qwen3_14b"
    refused = run("export", plan, "--to", "torchtitan", "--torchtitan-base", base, "--out", tmp_path / "t.py")
    said = " ".join(refused.output.split())
    assert refused.exit_code != 0 and f"--torchtitan-base {base} builds qwen3-14b, not this plan's model:" in said, said
    assert "hidden_size 64 (the base: 5120)" in said and "qkv_bias True (the base: False)" in said, said


def test_a_torchtitan_base_ckplan_does_not_know_is_said_unchecked(tmp_path):
    """`--torchtitan-base ...llama3.config_registry:llama3_8bb` (a typo) was written without a word, its model
    unchecked (the file checks the depth when it runs, and fails to import first). It is still written, as any
    config function a user has may be, with a warning that its model is not checked; a known one has none."""
    profile, plan = tmp_path / "p.json", tmp_path / "plan.yaml"
    run_ok("profile", "--arch", "qwen3-0.6b", "--seq-len", "64", "--gpu", "h100", "--out", profile)
    run_ok("solve", "--profile", profile, "--stages", "1", "--mem", "80GB", "--runtime", "torchtitan", "--out", plan)
    module = "torchtitan.models.qwen3.config_registry"
    said = " ".join(run_ok("export", plan, "--to", "torchtitan", "--torchtitan-base", f"{module}:qwen3_0_6bb",
                           "--out", tmp_path / "a.py").output.split())
    assert (f"--torchtitan-base {module}:qwen3_0_6bb is not a torchtitan config function ckplan knows (it knows "
            "llama3_8b,") in said and "the model it builds is not checked against the plan's" in said, said
    said = run_ok("export", plan, "--to", "torchtitan", "--torchtitan-base", f"{module}:qwen3_0_6b",
                  "--out", tmp_path / "b.py").output
    assert "not a torchtitan config function ckplan knows" not in said


def test_a_deepspeed_config_given_as_a_megatron_script_is_named_for_what_it_is(tmp_path):
    """A user's ds_config.json (train_batch_size, zero_optimization: stage 3, ...) given to --from-megatron was read
    as a bash script: "no line runs a Megatron-LM trainer". It is DeepSpeed's engine config, with no model: the
    sentence says so and names the script that passes it; the script beside it, passing it, is read with it."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1,
                                  "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}}))
    said = " ".join(run("evaluate", "--from-megatron", config, "--gpu", "h100").output.split())
    assert (f"{config} is a DeepSpeed config (train_batch_size, train_micro_batch_size_per_gpu, zero_optimization), "
            "which holds no model; give the Megatron-DeepSpeed launch script that passes it as --deepspeed_config") in said
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 "
                      "--num-attention-heads 4 --seq-length 512 --max-position-embeddings 512 --vocab-size 1024 "
                      "--micro-batch-size 1 --global-batch-size 16 --bf16 --deepspeed --deepspeed_config ds_config.json "
                      "--zero-stage 1\n")
    scored = " ".join(run_ok("evaluate", "--from-megatron", script, "--gpu", "h100").output.split())
    assert "DeepSpeed's engine (--deepspeed)" in scored, scored
