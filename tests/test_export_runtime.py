"""An export is scored as the framework it writes for runs the plan: a plan solved for torchtitan's
runtime and exported to Megatron-LM is charged Transformer Engine's fused kernels and fused SwiGLU
(planner/emit/rounding.py evaluate), so the figures the export's header predicts are the ones
`evaluate --from-megatron` gives for the file it wrote."""

from __future__ import annotations

import json
import re

from fixtures.cli import run_ok

from planner.units import format_ms

# a LLaMA-style config (model_type llama), small enough to profile in a second
LLAMA = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 4,
         "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 4096, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu"}


def test_a_torchtitan_plan_exported_to_megatron_predicts_what_its_file_reads_back_as(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    run_ok("profile", "--arch-config", config, "--seq-len", "2048", "--micro-batch-size", "2", "--gpu", "h100",
           "--out", tmp_path / "p.json")
    run_ok("solve", "--profile", tmp_path / "p.json", "--stages", "2", "--microbatches", "4", "--mem", "80GB",
           "--precision", "bf16-mixed", "--runtime", "torchtitan", "--out", tmp_path / "plan.yaml")
    run_ok("export", tmp_path / "plan.yaml", "--to", "megatron")
    text = (tmp_path / "plan.megatron.sh").read_text()
    plan_said, predicted = re.search(r"plan (\S+ m?s), this export (\S+ m?s)", text).groups()
    script = tmp_path / "train.sh"
    script.write_text(text + 'torchrun --nproc_per_node 2 pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}" '
                      "--vocab-size 4096\n")
    read_back = json.loads(run_ok("evaluate", "--from-megatron", script, "--gpus", "2", "--gpu", "h100",
                                  "--json").stdout)
    assert format_ms(read_back["iteration_ms"]) == predicted
    # and the blocks were timed on Transformer Engine's kernels: not the plan's torchtitan figure
    assert predicted != plan_said
