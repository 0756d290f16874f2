"""Defects found trying ckplan as a user on models and configs no test used (§44.usertrial7): each one's
command before and after, on a tiny case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.cli import run, run_ok

FIXTURES = Path(__file__).parent / "fixtures"

# a Megatron-LM job as a user writes it (YAML mapping of flags), small enough to score in seconds: GQA 4
# heads over 2 groups of head dim 64, SwiGLU, untied, a 1,024-token vocabulary (a multiple of 128: no padding)
_TINY_GQA = """MODEL_ARGS:
  --num-layers: 2
  --hidden-size: 256
  --num-attention-heads: 4
  --group-query-attention: true
  --num-query-groups: 2
  --ffn-hidden-size: 512
  --swiglu: true
  --normalization: RMSNorm
  --disable-bias-linear: true
  --untie-embeddings-and-output-weights: true
  --position-embedding-type: rope
  --seq-length: 512
  --max-position-embeddings: 512
  --vocab-size: 1024
  --make-vocab-size-divisible-by: 128
  --micro-batch-size: 1
  --global-batch-size: 8
  --bf16: true
"""

# Megatron-LM d98e8a64 megatron/training/training.py num_floating_point_operations (§650), by hand for
# _TINY_GQA, per token: 3 (fwd, wgrad, dgrad) x 2 (FMA) x [2 layers x (h (q + k + v) + q s / 2 x 2 + q h)
# + the MLP's h x 3 x ffn + the logits' h x V]
_MEGATRON_FLOPS_PER_TOKEN = 6 * (2 * (256 * (256 + 128 + 128) + 256 * 512 + 256 * 256 + 256 * 3 * 512) + 256 * 1024)


def test_evaluate_from_megatron_prints_the_throughput_megatron_logs(tmp_path):
    """`evaluate --from-megatron` printed only torchtitan's MFU (non-causal attention, no logits' embedding
    term), which a Megatron-LM user cannot hold against the "throughput per GPU (TFLOP/s/GPU)" of their log
    (Qwen3-32B's exported plan: "MFU 26.4%" where search's own table said Megatron-LM's 0.248); now it
    prints Megatron-LM's figure (the MFU line's own for a Megatron-LM job, review62), and --json carries it."""
    path = tmp_path / "tiny_gqa.yaml"
    path.write_text(_TINY_GQA)
    assert _MEGATRON_FLOPS_PER_TOKEN == 10_223_616
    summary = json.loads(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100", "--json").stdout)
    tflops = _MEGATRON_FLOPS_PER_TOKEN * summary["tokens_per_s_per_gpu"] / 1e12
    assert summary["tflops_per_gpu_megatron"] == pytest.approx(tflops, rel=1e-12)
    assert summary["mfu_megatron"] == pytest.approx(tflops / 989.4, rel=1e-12)  # H100 SXM's dense BF16 peak
    assert summary["mfu_of"] == "Megatron-LM" and summary["mfu"] == pytest.approx(summary["mfu_megatron"], rel=1e-12)
    said = " ".join(run_ok("evaluate", "--from-megatron", path, "--gpus", "8", "--gpu", "h100").output.split())
    assert f"MFU {tflops / 989.4:.1%} of the dense BF16 peak ({tflops:,.1f} TFLOP/s/GPU as" in said


def _megatron_step(iteration: int, ms: float, tflops: float) -> str:
    """One training_log line as Megatron-LM d98e8a64 prints it (training.py 3567-3578, --log-throughput)."""
    return (f" [2026-12-01 10:00:0{iteration}.000000] iteration {iteration:8d}/     100 | consumed samples: "
            f"{8 * iteration:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): "
            f"{tflops:.1f} | learning rate: 1.000000E-05 | global batch size:     8 | lm loss: 6.9E+00 |\n")


def test_calibrate_from_a_megatron_log_sets_its_throughput_against_megatrons_count(tmp_path):
    """A Megatron-LM log's `throughput per GPU (TFLOP/s/GPU)` was read and dropped ("not compared: each counts
    its own"), while the MFU row's "logged" value was torchtitan's count applied to the logged step; now the
    log's figure is a residual beside Megatron-LM's count of the predicted step."""
    config = tmp_path / "tiny_gqa.yaml"
    config.write_text(_TINY_GQA)
    log = tmp_path / "train.log"
    log.write_text(_megatron_step(1, 900.0, 0.3) + _megatron_step(2, 4.0, 1.3) + _megatron_step(3, 4.0, 1.3))
    summary = json.loads(run_ok("evaluate", "--from-megatron", config, "--gpus", "8", "--gpu", "h100", "--json").stdout)
    report = json.loads(run_ok("calibrate", "--from-log", log, "--from-megatron", config, "--gpus", "8", "--gpu",
                               "h100", "--json").stdout)
    row = next(r for r in report["residuals"] if r["term"] == "TFLOP/s/GPU")
    assert row["rank"] is None and row["logged"] == 1.3  # the median after the first step
    assert row["predicted"] == pytest.approx(_MEGATRON_FLOPS_PER_TOKEN * summary["tokens_per_s_per_gpu"] / 1e12,
                                             rel=1e-12)
    said = run_ok("calibrate", "--from-log", log, "--from-megatron", config, "--gpus", "8", "--gpu", "h100").output
    assert "TFLOP/s/GPU" in said and " 1.3 " in said


# the head of what `ckplan export --to torchtitan` writes for 0.3.0 (planner/emit/torchtitan.py): the base config
# imported under another name from torchtitan's registry, refined by a function of the file
_EXPORTED = """from torchtitan.models.qwen3.config_registry import qwen3_32b as base_config


def ckplan_config():
    config = base_config()
    config.parallelism.data_parallel_shard_degree = 32
    return config
"""


def test_a_base_config_imported_under_another_name_is_named_as_torchtitan_defines_it(tmp_path):
    """Reading back ckplan's own torchtitan export was refused with "give the file and function base_config is
    defined in": no file defines base_config (the export's alias of qwen3_32b); now the refusal names the
    function and the file that define it."""
    path = tmp_path / "ckplan_plan.py"
    path.write_text(_EXPORTED)
    result = run("evaluate", "--from-torchtitan", f"{path}:ckplan_config", "--gpus", "32")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and said.count("Error:") == 1
    assert "give the file and function base_config is defined in" not in said
    assert ("it refines qwen3_32b() from torchtitan.models.qwen3.config_registry (imported as base_config); give "
            "that one, --from-torchtitan torchtitan/models/qwen3/config_registry.py:qwen3_32b") in said


def test_a_block_shared_whole_is_named_once_where_torchtitan_refuses_its_ties():
    """A ViT whose block b is applied again as b_again ties each of the block's 12 tensors (one tied set each,
    the same two layers): `export --to torchtitan` said "(b and b_again, b and b_again share a parameter)"."""
    from types import SimpleNamespace

    from planner.cost.runnable import tied_refused

    tied = [SimpleNamespace(layers=["b", "b_again"]) for _ in range(12)] + [SimpleNamespace(layers=["embed", "head"])]
    said = tied_refused("torchtitan", None, stages=2, tied=tied)
    assert said.startswith("the model ties weights (b and b_again, embed and head share a parameter) and --runtime "
                           "torchtitan ")


def test_an_entry_with_a_shell_expansion_is_refused_not_written_as_text(tmp_path):
    """`export --to slurm --entry 'pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}"'` (the line the Megatron-LM export
    ends with) wrote `srun torchrun ... pretrain_gpt.py '${CKPLAN_MEGATRON_ARGS[@]}'`: one argument, that text, no
    array expanded. Now refused in one sentence naming the word; a plain entry is still written, quoted."""
    from export_plans import llm_profile, make_plan

    from planner import io

    profile = llm_profile()
    io.save_profile(profile, tmp_path / "llm.json")
    io.save_plan(make_plan(profile, tmp_path / "llm.json", [4, 3, 3], {"layers.2"}), tmp_path / "plan.yaml")
    for target in ("torchrun", "slurm", "kubernetes"):
        result = run("export", tmp_path / "plan.yaml", "--to", target, "--out", tmp_path / f"{target}.out", "--entry",
                     'pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}"')
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and said.count("Error:") == 1 and not (tmp_path / f"{target}.out").exists()
        assert "--entry: '${CKPLAN_MEGATRON_ARGS[@]}' would reach the program as that text" in said
    run_ok("export", tmp_path / "plan.yaml", "--to", "slurm", "--out", tmp_path / "ok.sh", "--entry",
           "pretrain_gpt.py --num-layers 10 --data-path 'a b'")
    assert "pretrain_gpt.py --num-layers 10 --data-path 'a b'" in (tmp_path / "ok.sh").read_text()


def test_search_refuses_an_entry_with_a_shell_expansion_before_searching(tmp_path):
    """`search --launch-files DIR --entry ...` read --entry with its own shlex split, so the launch files it writes
    would carry "${CKPLAN_MEGATRON_ARGS[@]}" as a literal argument, as export's did: one reading (launchers.entry_argv),
    refused before any configuration is searched and no file written."""
    result = run("search", "--arch", "llama3-8b", "--gpus", "8", "--global-batch", "8", "--seq-len", "1024",
                 "--launch-files", tmp_path / "launch", "--entry", 'pretrain_gpt.py "${CKPLAN_MEGATRON_ARGS[@]}"')
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and said.count("Error:") == 1 and not (tmp_path / "launch").exists()
    assert "--entry: '${CKPLAN_MEGATRON_ARGS[@]}' would reach the program as that text" in said


def test_search_on_a_cpu_profile_says_its_times_are_the_cpus_and_no_tokens(tmp_path):
    """`search --profile` of a model file's CPU profile titled "4 x h100-sxm, batch 32 x 0 tokens" and printed
    tok/s/GPU 0 on every row: the profile records no sequence length, and its times are the CPU's beside the named
    GPU's links and memory (§44.usertrial7, noticed). Now the title says so and tokens are "-" (JSON null), as the
    MFU column says not known."""
    made = FIXTURES / "chunked-milp-profile.json"
    result = run_ok("search", "--profile", made, "--gpus", "2", "--global-batch", "8", "--top", "2",
                    "--time-limit", "60", "--out", tmp_path / "best.yaml")
    said = " ".join(result.output.split())
    assert "(times as profiled on cpu), batch 8 samples," in said and "x 0 tokens" not in said
    found = json.loads(run_ok("search", "--profile", made, "--gpus", "2", "--global-batch", "8", "--top", "2",
                              "--time-limit", "60", "--json", "--out", tmp_path / "best2.yaml").stdout)
    assert found["ranked"] and all(row["tokens_per_s_per_gpu"] is None for row in found["ranked"])
